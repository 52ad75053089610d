"""Sudoku's hints are a switch (``--sudoku-hints``, a row's ``env_config["hints"]``): by default
the messages list only the moves the game rejected, never moves of the solution; ``all`` gives
ms-swift's hints (GUARANTEED MOVES, other candidates); ``none`` the board alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_error, envsdk

pytestmark = pytest.mark.timeout(240)

_MOVE = re.compile(r"\[\d+ \d+ \d+\]")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _users(record: dict) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "user"]


def _rejected_line(text: str) -> list[str]:
    found = re.search(r"^MOVES REJECTED \(do not repeat\): (.*)$", text, re.MULTILINE)
    return _MOVE.findall(found.group(1)) if found else []


def test_by_default_the_messages_list_the_rejected_moves_and_no_move_of_the_solution(tmp_path: Path) -> None:
    result = envsdk("rollout", "--env", "sudoku", "--policy", "random", "--episodes", "3", "--max-turns", "8",
                    "--record", "full", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rejected_seen = 0
    for record in _records(tmp_path / "completions.jsonl"):
        assert record["infos"]["hints"] == "rejected"
        users = _users(record)
        assert not any("GUARANTEED MOVES" in text or "Other options" in text for text in users)
        assert not any("MOVES ALREADY TRIED" in text for text in users)
        rejected: list[str] = []
        # The message after step k lists the moves rejected in steps 1..k, in order, each once.
        for step, text in zip(record["steps"], users[1:]):
            move = step["action"]["message"]
            if step["info"]["verdict"] in ("invalid", "bad_format") and move not in rejected:
                rejected.append(move)
            assert _rejected_line(text) == rejected, (text, rejected)
        rejected_seen += len(rejected)
        accepted = [s["action"]["message"] for s in record["steps"] if s["info"]["verdict"] == "valid"]
        assert not set(accepted) & set(_rejected_line(users[-1]))
    assert rejected_seen > 0  # random moves: most are rejected


def test_all_gives_ms_swifts_hints_and_none_the_board_alone(tmp_path: Path) -> None:
    played = envsdk("rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "1", "--max-turns", "2",
                    "--sudoku-hints", "all", "--out", "all.jsonl", "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    (record,) = _records(tmp_path / "all.jsonl")
    assert record["infos"]["hints"] == "all" and record["env_config"]["hints"] == "all"
    assert all("GUARANTEED MOVES (only one option): [" in text for text in _users(record))

    played = envsdk("rollout", "--env", "sudoku", "--policy", "random", "--episodes", "2", "--max-turns", "4",
                    "--sudoku-hints", "none", "--out", "none.jsonl", "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    for record in _records(tmp_path / "none.jsonl"):
        assert record["infos"]["hints"] == "none"
        for text in _users(record):
            assert "MOVES" not in text and "Other options" not in text
            assert text.rstrip().endswith(tuple("123456789.")), text  # the board's last row ends it


def test_a_dataset_row_chooses_its_own_hints(tmp_path: Path) -> None:
    rows = [{"env_config": {"name": "sudoku", "seed": 1, "hints": "all"}}, {"env_config": {"name": "sudoku", "seed": 2}}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    played = envsdk("rollout", "--dataset", "rows.jsonl", "--policy", "oracle", "--max-turns", "1",
                    "--sudoku-hints", "none", "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    hints = {r["seed"]: r["infos"]["hints"] for r in _records(tmp_path / "completions.jsonl")}
    assert hints == {1: "all", 2: "none"}


def test_a_hint_level_that_does_not_exist_or_a_run_without_sudoku_is_refused(tmp_path: Path, folder: Path) -> None:
    bad = envsdk("rollout", "--env", "sudoku", "--env-config", '{"hints": "some"}', "--no-progress", cwd=tmp_path)
    assert_one_line_error(bad, "hints 'some'", "'none', 'rejected', 'all'")
    assert bad.returncode == 2 and not (tmp_path / "completions.jsonl").exists()
    other = envsdk("rollout", "--env", "frozen_lake", "--sudoku-hints", "all", "--no-progress", cwd=tmp_path)
    assert_one_line_error(other, "--sudoku-hints all", "plays no Sudoku")
    assert other.returncode == 2
