"""The Sudoku GRPO example run twice into one --output-dir, as a user does: the second run is
refused (its new ``final/`` would sit beside the first run's records), ``--overwrite-output-dir``
replaces the first run whole; and a reward part TRL logged as None prints as n/a, not +0.000."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, user_env

pytest.importorskip("trl")

SCRIPT = str(REPO / "examples" / "train_grpo_sudoku.py")
#: The smallest run of the example: one step of two episodes of at most two turns.
SMALL = ("--model", "./tiny", "--cpu", "--max-steps", "1", "--batch-size", "2", "--num-generations", "2",
         "--max-turns", "2", "--max-completion-length", "256", "--output-dir", "out")


def _python(*args: str, cwd: Path, timeout: float = 560) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(1200)
def test_a_second_run_into_one_output_dir_is_refused_or_replaces_the_first_whole(tmp_path: Path) -> None:
    built = _python("-m", "envsdk.tiny_model", "tiny", cwd=tmp_path, timeout=120)
    assert built.returncode == 0, built.stderr

    # environment_factory: the tiny model calls no tool, so no episode gives a part: TRL logs None.
    first = _python(SCRIPT, *SMALL, "--adapter", "environment_factory", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    step = next(line for line in first.stdout.splitlines() if line.startswith("step 1:"))
    assert "empty_cell=n/a valid_move=n/a repetition=n/a progress=n/a correct=n/a" in step, step
    model = tmp_path / "out" / "final" / "model.safetensors"
    trained_at = model.stat().st_mtime_ns

    started = time.monotonic()
    again = _python(SCRIPT, *SMALL, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip() == (
        "train_grpo_sudoku.py: error: --output-dir out holds an earlier run (final/): give another --output-dir, "
        "or --overwrite-output-dir to replace it"
    )
    assert time.monotonic() - started < 60  # refused before anything heavy is loaded
    assert model.stat().st_mtime_ns == trained_at and not (tmp_path / "out" / "completions.jsonl").exists()

    # An earlier run's records (several ranks of them) go with its model.
    (tmp_path / "out" / "completions.rank1.jsonl").write_text("{}\n", encoding="utf-8")
    replaced = _python(SCRIPT, *SMALL, "--overwrite-output-dir", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["completions.jsonl", "final"]
    assert model.stat().st_mtime_ns > trained_at
    records = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert records and {r["global_step"] for r in records} == {1}
