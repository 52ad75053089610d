"""``envsdk report A B``: several completions files side by side (the before/after plot)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from envsdk.cli import main
from envsdk.policies import make_policy
from envsdk.report import ReportError, comparison_figure, write_comparison
from envsdk.rollout import run_rollouts
from tests.web.conftest import report_refused

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


@pytest.mark.timeout(90)
def test_files_of_one_label_get_their_own_folder_and_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """a/x/completions.jsonl and b/x/completions.jsonl were both "x": the second report replaced
    the first in <out-dir>/x/ and their bars were drawn at one place. Colliding labels take the
    path from the files' common folder; a label that collides with none is kept."""
    import envsdk.report

    first = _rollouts("random", tmp_path / "a" / "x")
    second = _rollouts("oracle", tmp_path / "b" / "x")
    other = _rollouts("random", tmp_path / "c" / "y")
    figures: list[Any] = []

    def spy(labelled: Any) -> Any:
        figures.append(figure := comparison_figure(labelled))
        return figure

    monkeypatch.setattr(envsdk.report, "comparison_figure", spy)
    out = tmp_path / "rep"
    assert main(["report", str(first), str(second), str(other), "--out-dir", str(out)]) == 0
    for folder, source in (("a/x", first), ("b/x", second), ("y", other)):
        assert f"<code>{source}</code>" in (out / folder / "report.html").read_text(encoding="utf-8")
    assert not (out / "x").exists()
    (rate_ax, _) = figures[0].axes
    assert [t.get_text().split("\n")[0] for t in rate_ax.get_xticklabels()] == ["a/x", "b/x", "y"]
    assert len({bar.get_x() for bar in rate_ax.patches}) == 3
    # Beside the files (no --out-dir) the bars are told apart the same way.
    assert main(["report", str(first), str(second)]) == 0
    assert [t.get_text().split("\n")[0] for t in figures[1].axes[0].get_xticklabels()] == ["a/x", "b/x"]
    assert (tmp_path / "a" / "x" / "completions_report" / "report.html").is_file()


def test_labels_are_told_apart_by_as_much_path_as_they_need(tmp_path: Path) -> None:
    from envsdk.report import _labels

    same = [tmp_path / "x.jsonl", tmp_path / "x.txt", tmp_path / "d" / "x" / "completions.jsonl"]
    assert _labels(same) == ["x.jsonl", "x.txt", "d/x"]
    # The name of the comparison plot, which shares <out-dir> with the labelled folders.
    assert _labels([tmp_path / "compare.png.jsonl", tmp_path / "y.jsonl"]) == ["compare.png.jsonl", "y"]
    assert _labels([tmp_path / "p" / "before.jsonl", tmp_path / "q" / "after.jsonl"]) == ["before", "after"]


@pytest.mark.timeout(90)
def test_the_same_file_twice_isreport_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = _rollouts("random", tmp_path / "before")
    err = report_refused([str(records), str(tmp_path / "before" / ".." / "before" / "completions.jsonl")], capsys)
    assert f"{records}: given twice" in err
    assert not (tmp_path / "comparison_report").exists() and not (tmp_path / "before" / "completions_report").exists()


@pytest.mark.timeout(90)
def test_two_reports_for_one_folder_arereport_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """x.jsonl and x.txt beside each other both write x_report/ by default: refused, not one
    over the other; with --out-dir each has its own folder."""
    records = _rollouts("random", tmp_path / "run")
    first, second = tmp_path / "x.jsonl", tmp_path / "x.txt"
    for path in (first, second):
        path.write_bytes(records.read_bytes())
    err = report_refused([str(first), str(second)], capsys)
    assert f"{tmp_path / 'x_report'}: the report folder of both {first} and {second}" in err
    assert not (tmp_path / "x_report").exists() and not (tmp_path / "comparison_report").exists()
    out = tmp_path / "rep"
    assert main(["report", str(first), str(second), "--out-dir", str(out)]) == 0
    assert (out / "x.jsonl" / "report.html").is_file() and (out / "x.txt" / "report.html").is_file()


@pytest.mark.timeout(90)
def test_a_refused_report_takes_back_the_folders_it_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The second file's report folder is taken by a file: nothing is written, and neither the
    comparison folder nor the first file's report folder is left behind."""
    first = _rollouts("random", tmp_path / "a")
    second = _rollouts("oracle", tmp_path / "b")
    blocked = tmp_path / "b" / "completions_report"
    blocked.write_text("", encoding="utf-8")
    assert f"{blocked}: not a folder" in report_refused([str(first), str(second)], capsys)
    assert not (tmp_path / "comparison_report").exists()
    assert not (tmp_path / "a" / "completions_report").exists()
    # --out-dir that is a file, and one below a file.
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    assert f"{afile}: not a folder" in report_refused([str(first), str(second), "--out-dir", str(afile)], capsys)
    err = report_refused([str(first), str(second), "--out-dir", str(afile / "sub")], capsys)
    assert f"{afile / 'sub'}: cannot make the report folder: {afile} is not a folder" in err
    assert not (tmp_path / "a" / "completions_report").exists()


@pytest.mark.timeout(90)
def test_a_label_of_dots_writes_no_report_outside_the_out_dir(tmp_path: Path) -> None:
    """'...jsonl' has the stem '..': its report went to <out-dir>/.., over the user's own
    report.html there; '../completions.jsonl' took its label, '..', from the path as given."""
    records = _rollouts("random", tmp_path / "r.jsonl")
    folder = tmp_path / "P"
    (folder / "sub").mkdir(parents=True)
    dots = folder / "...jsonl"
    dots.write_bytes(records.read_bytes())
    (folder / "y.jsonl").write_bytes(records.read_bytes())
    (folder / "sub" / "completions.jsonl").write_bytes(records.read_bytes())
    (folder / "report.html").write_text("MY OWN PAGE", encoding="utf-8")
    before = sorted(p.name for p in folder.iterdir())
    out = folder / "R"
    assert main(["report", str(dots), str(folder / "y.jsonl"), "--out-dir", str(out)]) == 0
    assert (out / "...jsonl" / "report.html").is_file() and (out / "y" / "report.html").is_file()
    assert (folder / "report.html").read_text(encoding="utf-8") == "MY OWN PAGE"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*before, "R"])
    # The folder's name, not "..", labels a completions.jsonl given through "..".
    from envsdk.report import _labels

    inside = folder / "sub" / "inner"
    inside.mkdir()
    assert _labels([inside / ".." / "completions.jsonl", folder / "y.jsonl"]) == ["sub", "y"]
