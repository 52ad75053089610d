"""``envsdk report`` on real completions files (rollouts of the real Sudoku server)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from envsdk.cli import main
from envsdk.policies import make_policy
from envsdk.report import ReportError, load_episodes, write_report
from envsdk.rollout import run_rollouts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def completions(sudoku_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "completions.jsonl"
    rollouts = run_rollouts(
        "sudoku", make_policy("random", "sudoku"), episodes=6, max_turns=6, base_url=sudoku_url, out=out, progress=False
    )
    asyncio.run(rollouts)
    return out


def _check_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000, path


@pytest.mark.timeout(90)
def test_report_command_writes_pngs_and_an_html_page_that_embeds_them(
    completions: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert main(["report", str(completions), "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    names = {"total_reward.png", "components.png", "episodes.png"}
    assert {Path(p).name for p in printed} == names | {"report.html"}
    for name in names:
        _check_png(out / name)
    assert not (out / "training.png").exists()  # rollouts, not training: no curves
    page = (out / "report.html").read_text(encoding="utf-8")
    assert set(re.findall(r'<img src="([^"]+)"', page)) == names
    records = [json.loads(line) for line in completions.read_text(encoding="utf-8").splitlines()]
    successes = sum(r["success"] for r in records)
    assert f"success rate <b>{successes / len(records):.1%}</b> ({successes}/{len(records)})" in page
    for component in ("empty_cell", "valid_move", "repetition", "progress", "correct"):
        assert f"<td>{component}</td>" in page


@pytest.mark.timeout(90)
def test_training_records_get_reward_curves_over_steps(completions: Path, tmp_path: Path) -> None:
    records = [json.loads(line) for line in completions.read_text(encoding="utf-8").splitlines()]
    training = tmp_path / "train.jsonl"
    with training.open("w", encoding="utf-8") as f:
        for step in range(3):
            for record in records:
                f.write(json.dumps({**record, "global_step": step}) + "\n")
    episodes = load_episodes(training)
    assert {e.training_step for e in episodes} == {0.0, 1.0, 2.0}
    report = write_report(training)
    assert report.html == tmp_path / "train_report" / "report.html"
    _check_png(report.plots["training"])
    assert 'src="training.png"' in report.html.read_text(encoding="utf-8")


def test_episode_values_are_read_from_the_records(completions: Path) -> None:
    records = [json.loads(line) for line in completions.read_text(encoding="utf-8").splitlines()]
    episodes = load_episodes(completions)
    assert [e.total_reward for e in episodes] == [r["total_reward"] for r in records]
    assert [e.turns for e in episodes] == [r["turns"] for r in records]
    assert episodes[0].components["valid_move"] == records[0]["reward_components"]["valid_move"]["value"]
    assert "total_reward" not in episodes[0].components and "cells_filled" not in episodes[0].components


def test_unusable_input_is_refused_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    ok = '{"schema": "envsdk.completions/1", "total_reward": 1.0, "reward_components": {}}'
    bad.write_text(ok + '\n\n{"schema": "envsdk.completions/1", "status": "done"}\n', encoding="utf-8")
    with pytest.raises(ReportError, match=r"bad.jsonl:3: no numeric 'total_reward'"):
        load_episodes(bad)
    old = tmp_path / "old.jsonl"
    old.write_text('{"total_reward": 1.0}\n', encoding="utf-8")
    with pytest.raises(ReportError, match=r"old.jsonl:1: schema is null, this envsdk reads 'envsdk.completions/1'"):
        load_episodes(old)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert main(["report", str(empty)]) == 2
    assert "no records" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
