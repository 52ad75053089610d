"""`bench.openenv_scaling`, OpenEnv's scaling harness reimplemented: a ``--quick`` run at tiny size
against both servers (on uvloop, OpenEnv with httptools as uvicorn[standard] has it) writes its
table, and its success counts come from real replies (a refused connection and an error frame are
failures, counted by type). No timing is asserted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import openenv_scaling
from bench.trivial import start_server, stop_server
from envsdk.testing import free_port


@pytest.mark.timeout(120)
def test_quick_run_writes_a_row_per_server_and_size_from_real_sessions(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Tail\n\nkeep\n")
    batches = openenv_scaling.run(
        openenv_scaling.resolve_args(
            ["--quick", "--levels", "3", "5", "--loop", "uvloop", "--cooldown", "0", "--out", str(results)]
        ),
        "python -m bench openenv-scaling --quick --levels 3 5 --loop uvloop",
    )
    assert sorted((b.server, b.sessions) for b in batches) == [("envsdk", 3), ("envsdk", 5), ("openenv", 3), ("openenv", 5)]
    for b in batches:
        assert len(b.successful) == b.sessions, b.failures
        # Every success reached its own env instance, which slept what the step asked.
        assert b.unique_sessions == b.sessions
        assert all(r.waited_s == pytest.approx(0.1) and r.step_s >= 0.1 for r in b.results)
        assert b.peak_rss_kib > 0
    text = results.read_text()
    assert "keep" in text and openenv_scaling.HEADING in text
    assert "memory map: envsdk uvloop, openenv uvloop+httptools." in text
    rows = [line for line in text.splitlines() if line.startswith(("| envsdk | ", "| openenv | "))]
    assert len(rows) == 4
    assert all(row.count("|") == 15 and "100.0 %" in row for row in rows)
    assert "| 5 | 100.0 % / " in text
    assert "Max batch (every repetition ≥ 95 % success): envsdk 5; openenv 5" in text


@pytest.mark.timeout(60)
def test_error_replies_and_refused_connections_count_as_failures() -> None:
    proc, url = start_server("envsdk-wait", 8)
    try:
        # A step the env refuses (a negative wait): every session gets an error frame.
        refused_step = asyncio.run(openenv_scaling.run_batch(url, 3, -1.0, 10.0, "envsdk"))
    finally:
        stop_server(proc)
    assert refused_step.successful == []
    assert refused_step.failures == {"RuntimeError": 3}
    assert all("VALIDATION_ERROR" in r.error for r in refused_step.results)
    nobody = asyncio.run(openenv_scaling.run_batch(f"ws://127.0.0.1:{free_port()}/ws", 2, 0.0, 5.0, "none"))
    assert nobody.successful == [] and sum(nobody.failures.values()) == 2
    assert nobody.success_pct == 0.0 and openenv_scaling.max_batch([nobody, refused_step]) == 0
