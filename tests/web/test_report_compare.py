"""``envsdk report A B``: several completions files side by side (the before/after plot)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envsdk.cli import main
from envsdk.policies import make_policy
from envsdk.report import ReportError, write_comparison
from envsdk.rollout import run_rollouts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rollouts(policy: str, out: Path) -> Path:
    """Real FrozenLake episodes (the local env) written as completions.jsonl under `out`."""
    path = out / "completions.jsonl"
    out.mkdir(parents=True)
    asyncio.run(
        run_rollouts("frozen_lake", make_policy(policy, "frozen_lake"), episodes=12, max_turns=8, out=path, progress=False)
    )
    return path


@pytest.mark.timeout(90)
def test_two_files_give_each_report_and_a_comparison_in_their_common_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _rollouts("random", tmp_path / "before")
    after = _rollouts("oracle", tmp_path / "after")
    assert main(["report", str(before), str(after)]) == 0
    printed = [Path(p) for p in capsys.readouterr().out.split()]
    compare = tmp_path / "comparison_report" / "compare.png"
    assert printed[-1] == compare
    assert compare.read_bytes().startswith(PNG_MAGIC) and compare.stat().st_size > 5_000
    # Each file still gets its own report beside it, as with one file.
    for source in (before, after):
        assert source.with_name("completions_report").joinpath("report.html") in printed


@pytest.mark.timeout(90)
def test_out_dir_holds_the_comparison_and_one_folder_per_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _rollouts("random", tmp_path / "before")
    after = _rollouts("oracle", tmp_path / "after")
    out = tmp_path / "rep"
    assert main(["report", str(before), str(after), "--out-dir", str(out)]) == 0
    assert (out / "compare.png").is_file()
    assert (out / "before" / "report.html").is_file() and (out / "after" / "report.html").is_file()
    assert not (tmp_path / "comparison_report").exists()


def test_an_unreadable_file_fails_the_comparison_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _rollouts("random", tmp_path / "before")
    bad = tmp_path / "after.jsonl"
    first_record = good.read_text(encoding="utf-8").splitlines()[0]
    bad.write_text(f"{first_record}\nnot json\n", encoding="utf-8")
    with pytest.raises(ReportError, match="after.jsonl:2"):
        write_comparison([good, bad], tmp_path / "c.png")
    assert main(["report", str(good), str(bad)]) == 2
    assert "after.jsonl:2" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()
