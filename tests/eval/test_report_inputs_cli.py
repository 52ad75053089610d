"""``envsdk report`` on what a user or an adversary may hand it: files larger than the memory
they should take, outliers, run files beside the records that are not what they should be."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ENVSDK, assert_one_line_error, envsdk, user_env
from tests.eval.conftest import grow_to_64_mb, peak_rss_kb

pytestmark = pytest.mark.timeout(240)


def _sudoku_records(folder: Path, name: str = "small.jsonl") -> Path:
    played = envsdk("rollout", "--env", "sudoku", "--policy", "random", "--episodes", "2", "--max-turns", "2",
                    "--no-progress", "--out", name, cwd=folder)
    assert played.returncode == 0, played.stderr
    return folder / name


def test_report_does_not_hold_every_record_of_a_large_file(tmp_path: Path) -> None:
    """The pass@k table was made from every record of the file parsed and held at once, with its
    line: a 327 MB file took 2.9 GB, where `rescore` of it takes 60 MB."""
    shutil.copy(_sudoku_records(tmp_path), tmp_path / "large.jsonl")
    grow_to_64_mb(tmp_path / "large.jsonl")
    large = peak_rss_kb([str(ENVSDK), "report", "large.jsonl"], tmp_path)
    assert (tmp_path / "large_report" / "report.html").is_file()
    small = peak_rss_kb([str(ENVSDK), "report", "small.jsonl"], tmp_path)
    assert large - small < 24_000, f"reporting on a 64 MB file took {(large - small) / 1000:.0f} MB more"


def test_a_run_file_nested_too_deep_beside_the_records_is_no_traceback(tmp_path: Path) -> None:
    """TOML arrays nested deeper than the parser goes, in the run file beside the records: report
    and resume ended in a RecursionError's traceback. The report reads the records without what
    the run planned; a resume, which needs the run file, is refused in one line."""
    records = _sudoku_records(tmp_path, "c.jsonl")
    (tmp_path / "c.run.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    report = envsdk("report", "c.jsonl", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "Traceback" not in report.stderr and "cut short" not in report.stderr
    before = records.read_bytes()
    resumed = envsdk("rollout", "--resume", "--out", "c.jsonl", cwd=tmp_path)
    assert resumed.returncode == 2
    assert_one_line_error(resumed, "c.run.toml", "nested too deep")
    assert records.read_bytes() == before


def test_one_record_of_very_many_turns_takes_no_more_memory(tmp_path: Path) -> None:
    """The turns plot had one bin per whole number of turns from the fewest to the most, listed
    before it chose: one record of 10⁸ turns took 4 GB and 16 s, 10¹⁰ more than the machine has;
    one of 1.7e308 turns, a traceback."""
    _sudoku_records(tmp_path)
    lines = (tmp_path / "small.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    outlier = json.loads(lines[0])
    outlier["turns"] = 10**7
    (tmp_path / "outlier.jsonl").write_text(json.dumps(outlier) + "\n" + "".join(lines[1:]), encoding="utf-8")
    large = peak_rss_kb([str(ENVSDK), "report", "outlier.jsonl"], tmp_path)
    assert (tmp_path / "outlier_report" / "episodes.png").is_file()
    small = peak_rss_kb([str(ENVSDK), "report", "small.jsonl"], tmp_path)
    assert large - small < 24_000, f"a record of 10^7 turns took {(large - small) / 1000:.0f} MB more"
    # A count past any integer numpy holds was a TypeError's traceback.
    outlier["turns"] = 1.7e308
    (tmp_path / "huge.jsonl").write_text(json.dumps(outlier) + "\n" + "".join(lines[1:]), encoding="utf-8")
    report = envsdk("report", "huge.jsonl", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "huge_report" / "episodes.png").is_file()


def test_records_of_thousands_of_reward_components_are_reported_in_bounded_time(tmp_path: Path) -> None:
    """One histogram per component, all in one figure: records of 2,000 components (a part per
    test case of a large test set) ran past two minutes and 2 GB without a report; 200 took 13 s."""
    _sudoku_records(tmp_path)
    lines = (tmp_path / "small.jsonl").read_text(encoding="utf-8").splitlines()
    with (tmp_path / "many.jsonl").open("w", encoding="utf-8") as handle:
        for line in lines:
            record = json.loads(line)
            record["reward_components"].update(
                {f"test_{i:04d}": {"value": float(i % 2), "steps": []} for i in range(2000)}
            )
            handle.write(json.dumps(record) + "\n")
    report = envsdk("report", "many.jsonl", cwd=tmp_path, timeout=60)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "many_report" / "report.html").read_text(encoding="utf-8")
    assert "<td>test_1999</td>" in page  # the table lists every component
    assert "of 2005 components" in page  # and the page says the plot shows fewer
    assert (tmp_path / "many_report" / "components.png").is_file()


@pytest.mark.parametrize("given", ["/", "."])
def test_a_folder_given_beside_records_to_compare_is_named_not_a_traceback(tmp_path: Path, given: str) -> None:
    """Files to compare were labelled before they were read: "/" (whose path from the files'
    common folder has no name) ended in pathlib's ValueError traceback."""
    _sudoku_records(tmp_path)
    result = envsdk("report", "small.jsonl", given, cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "not a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.eval.json", "small.jsonl", "small.run.toml"]


@pytest.mark.parametrize("stderr", ["2>/dev/full", "2>&-"])
def test_a_report_whose_stderr_cannot_be_written_still_lists_its_files(tmp_path: Path, stderr: str) -> None:
    """The pass@k table goes to stderr: one that could not take it (a full disk) raised out of
    the command after the report was written, which then exited 1 without listing its files on
    stdout; a closed one got the table on stdout, among the files a script reads there."""
    _sudoku_records(tmp_path)
    done = subprocess.run(["bash", "-c", f'exec "$@" {stderr}', "bash", str(ENVSDK), "report", "small.jsonl"],
                          cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0
    folder = Path("small_report")
    assert done.stdout.split() == [str(folder / name) for name in
                                   ("total_reward.png", "components.png", "episodes.png", "report.html")]
    assert (tmp_path / folder / "report.html").is_file()


@pytest.mark.parametrize("field", ["turns", "global_step", "component"])
def test_an_integer_no_float_holds_in_a_field_the_plots_read_is_no_traceback(tmp_path: Path, field: str) -> None:
    """A 401-digit integer where the report reads a number for its plots (turns, a training step,
    a component's value) raised OverflowError out of the command: a traceback. It is read as no
    number there, as a total reward of the same is refused as no number."""
    _sudoku_records(tmp_path)
    lines = (tmp_path / "small.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    record = json.loads(lines[0])
    huge = 10**400
    if field == "component":
        record["reward_components"]["correct"]["value"] = huge
    else:
        record[field] = huge
    (tmp_path / "huge.jsonl").write_text(json.dumps(record) + "\n" + "".join(lines[1:]), encoding="utf-8")
    report = envsdk("report", "huge.jsonl", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "huge_report" / "report.html").is_file()
