"""``envsdk report`` on what a user or an adversary may hand it: files larger than the memory
they should take, outliers, run files beside the records that are not what they should be."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.conftest import ENVSDK, envsdk
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
