"""``envsdk report`` on real completions files (rollouts of the real Sudoku server)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from envsdk.cli import main
from envsdk.policies import make_policy
from envsdk.report import ReportError, load_episodes, write_report
from envsdk.rollout import run_rollouts
from tests.web.conftest import report_refused

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
    """A PNG of a drawn figure: it decodes, and holds more than a blank canvas with axes (data in
    several colours covering a share of it), not merely some bytes."""
    assert path.is_file(), path
    assert path.read_bytes().startswith(PNG_MAGIC), path
    pixels = matplotlib.image.imread(path)[:, :, :3]
    height, width, _ = pixels.shape
    assert height >= 200 and width >= 300, (path, pixels.shape)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20, (path, len(colours))
    inked = (pixels < 0.9).any(axis=2).mean()  # not white
    assert inked > 0.02, (path, inked)


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
    assert f"success rate <b>{successes / len(records):.1%} ({successes}/{len(records)})</b>" in page
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


def _stated(index: int, success: bool | None) -> dict[str, object]:
    """A FrozenLake-shaped record whose success is `success` (None: nobody stated it)."""
    return {
        "schema": "envsdk.completions/1", "uuid": f"u{index}", "env": "frozen_lake", "seed": index,
        "env_config": {}, "status": "done", "reason": None, "error_kind": None, "success": success, "turns": 2,
        "total_reward": 1.0, "step_rewards": [0.0, 1.0], "reward_components": {}, "infos": {}, "messages": [],
        "timings": {},
    }


def _write(path: Path, successes: list[bool | None]) -> Path:
    path.write_text("".join(json.dumps(_stated(i, s)) + "\n" for i, s in enumerate(successes)), encoding="utf-8")
    return path


@pytest.mark.timeout(90)
def test_records_that_do_not_state_success_are_not_reported_as_failures(tmp_path: Path) -> None:
    unstated = _write(tmp_path / "unstated.jsonl", [None, None, None])
    assert [e.success for e in load_episodes(unstated)] == [None, None, None]
    page = write_report(unstated).html.read_text(encoding="utf-8")
    assert "success rate <b>n/a (neither the env nor the scheduler states success)</b>" in page
    assert "success rate <b>0.0%" not in page
    mixed = _write(tmp_path / "mixed.jsonl", [True, False, None, True])
    page = write_report(mixed).html.read_text(encoding="utf-8")
    assert "success rate <b>66.7% (2/3; 1 not stated)</b>" in page


@pytest.mark.timeout(90)
def test_plots_give_the_success_rate_over_the_episodes_that_state_it(tmp_path: Path) -> None:
    from envsdk.report import comparison_figure, episodes_figure

    unstated = load_episodes(_write(tmp_path / "unstated.jsonl", [None, None]))
    mixed = load_episodes(_write(tmp_path / "mixed.jsonl", [True, None, False, None]))
    assert "success rate n/a" in episodes_figure(unstated).axes[0].get_title()
    assert "success rate 50.0% (1/2; 2 not stated)" in episodes_figure(mixed).axes[0].get_title()
    rate_ax = comparison_figure([("unstated", unstated), ("mixed", mixed)]).axes[0]
    labels = [t.get_text() for t in rate_ax.texts]
    assert labels == ["n/a", "0.50"]
    # The bar of a file that states nothing is not drawn as a 0% bar.
    assert [bar.get_height() for bar in rate_ax.patches] == [0.0, 0.5]
    # How many episodes state success, under each file's own bar.
    assert [t.get_text().split("\n")[1] for t in rate_ax.get_xticklabels()] == ["0/2 stated", "2/4 stated"]


def _rewarded(path: Path, rewards: list[float], **extra: object) -> Path:
    """FrozenLake-shaped records with these total rewards (and `extra` fields on each)."""
    records = [{**_stated(i, None), "total_reward": r, **extra} for i, r in enumerate(rewards)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.timeout(90)
def test_rewards_near_the_largest_float_are_plotted_in_scaled_units(tmp_path: Path) -> None:
    """A reward range wider than any float (1.7e308 and -1.7e308) broke every plot (numpy found
    no finite bins, matplotlib's axis limits overflowed), and a mean of two such rewards
    overflowed: the page and each plot are drawn, in units of 1e308 where needed."""
    from envsdk.report import comparison_figure

    huge = [1.7e308, -1.7e308, 1.7e308, 1.7e308]
    rewards = _rewarded(tmp_path / "huge.jsonl", huge)
    report = write_report(rewards)
    for name in ("total_reward", "episodes"):
        _check_png(report.plots[name])
    page = report.html.read_text(encoding="utf-8")
    # The mean is finite (8.5e307), not inf or an OverflowError.
    assert "<td>total_reward</td><td>8.5e+307</td>" in page
    steps = [_rewarded(tmp_path / f"t{s}.jsonl", huge, global_step=s) for s in range(2)]
    training = tmp_path / "training.jsonl"
    training.write_text("".join(p.read_text(encoding="utf-8") for p in steps), encoding="utf-8")
    _check_png(write_report(training).plots["training"])
    small = load_episodes(_rewarded(tmp_path / "small.jsonl", [0.0, 1.0]))
    reward_ax = comparison_figure([("huge", load_episodes(rewards)), ("small", small)]).axes[1]
    assert "(× 1e307)" in reward_ax.get_title()
    assert [t.get_text() for t in reward_ax.texts] == ["8.5e+307", "0.50"]


@pytest.mark.timeout(90)
def test_an_out_dir_that_is_not_a_folder_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file where the report's folder must be made gave a FileExistsError or NotADirectoryError
    traceback: one line naming the folder (and the file in its way)."""
    records = _write(tmp_path / "x.jsonl", [True, False])
    afile = tmp_path / "afile"
    afile.write_text("mine\n", encoding="utf-8")
    assert f"{afile}: not a folder" in report_refused([str(records), "--out-dir", str(afile)], capsys)
    err = report_refused([str(records), "--out-dir", str(afile / "sub")], capsys)
    assert f"{afile / 'sub'}: cannot make the report folder: {afile} is not a folder" in err
    assert afile.read_text(encoding="utf-8") == "mine\n"
    # The default folder beside the file, taken by a file.
    blocked = tmp_path / "x_report"
    blocked.write_text("", encoding="utf-8")
    assert f"{blocked}: not a folder" in report_refused([str(records)], capsys)
    # A folder that exists, where a plot cannot be written: it names the folder and the file,
    # and the folder (not made by the report) is kept.
    out = tmp_path / "out"
    (out / "total_reward.png").mkdir(parents=True)
    err = report_refused([str(records), "--out-dir", str(out)], capsys)
    assert f"{out}: cannot write total_reward.png there" in err
    assert out.is_dir()


@pytest.mark.timeout(90)
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 folder; the test above refuses a folder blocked by a file")
def test_records_in_a_read_only_folder_are_refused_naming_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    records = _write(folder / "x.jsonl", [True])
    folder.chmod(0o555)
    try:
        err = report_refused([str(records)], capsys)
    finally:
        folder.chmod(0o755)
    assert f"{folder / 'x_report'}: cannot make the report folder" in err
    assert not (folder / "x_report").exists()


@pytest.mark.timeout(90)
def test_a_crash_takes_back_the_report_folder_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report that fails halfway leaves no ``<stem>_report/`` of it behind, but keeps a
    folder that was there before (and what was in it)."""
    import envsdk.report

    records = _write(tmp_path / "x.jsonl", [True, False])

    def crash(episodes: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(envsdk.report, "episodes_figure", crash)
    with pytest.raises(RuntimeError, match="boom"):
        main(["report", str(records)])
    assert not (tmp_path / "x_report").exists()
    with pytest.raises(RuntimeError, match="boom"):
        main(["report", str(records), "--out-dir", str(tmp_path / "new" / "deeper")])
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="boom"):
        main(["report", str(records), "--out-dir", str(kept)])
    assert (kept / "notes.txt").read_text(encoding="utf-8") == "mine\n"


@pytest.mark.timeout(90)
def test_deeply_nested_json_is_refused_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line of 100 000 nested lists gave a RecursionError traceback: the reader refuses the line."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    assert "deep.jsonl:1" in report_refused([str(deep)], capsys)
    assert not (tmp_path / "deep_report").exists()
