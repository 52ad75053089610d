"""Reward parts as a summary shows them: each labelled with what its episode value is (summed
over the steps, their mean, the last step's, or per episode), so that a part summed over three
steps is not read beside a 0/1 reward as a score; and a latency is no reward part: the records
keep it with their timings, and ``rescore --weights`` refuses to weigh it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_error, envsdk

pytestmark = pytest.mark.timeout(300)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _component_rows(stdout: str) -> dict[str, str]:
    section = stdout.split("reward components", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+)\s+\S+\s+\S+\s+\S+\s+\d+  (.+)$", section, re.MULTILINE)}


def test_per_step_parts_are_labelled_summed_and_the_latency_is_a_timing(tmp_path: Path) -> None:
    played = envsdk("rollout", "--env", "coding", "--policy", "random", "--episodes", "3", "--max-turns", "3",
                    "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    rows = _component_rows(played.stdout)
    assert rows == {"compiles": "summed over 3 steps", "tests_passed": "summed over 3 steps"}, played.stdout
    for record in _records(tmp_path / "completions.jsonl"):
        assert set(record["reward_components"]) == {"compiles", "tests_passed"}
        assert record["timings"]["time_s"] > 0 and record["timings"]["total_s"] > 0

    refused = envsdk("rescore", "completions.jsonl", "--weights", "time_s=1,tests_passed=1", cwd=tmp_path)
    assert_one_line_error(refused, "--weights time_s", "timing", "compiles, tests_passed")
    assert not (tmp_path / "completions.rescored.jsonl").exists()


def test_sudokus_parts_say_which_are_means_over_the_steps(tmp_path: Path) -> None:
    played = envsdk("rollout", "--env", "sudoku", "--policy", "random", "--episodes", "4", "--max-turns", "3",
                    "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    rows = _component_rows(played.stdout)
    assert set(rows) == {"empty_cell", "valid_move", "repetition", "progress", "correct"}, played.stdout
    # Random moves are mostly rejected (-0.5 each): the value is the steps' mean, not their sum.
    assert re.fullmatch(r"mean over \d+(-\d+)? steps", rows["valid_move"]), rows
    reported = envsdk("report", "completions.jsonl", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    page = (tmp_path / "completions_report" / "report.html").read_text(encoding="utf-8")
    assert "<th>each episode's value</th>" in page
    assert re.search(r"<tr><td>valid_move</td>(<td>[^<]*</td>){6}<td>mean over \d+(-\d+)? steps</td></tr>", page)
