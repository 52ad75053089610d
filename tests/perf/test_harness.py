"""The benchmark harness itself: its load generator, server launcher and RESULTS.md writer
work end to end on tiny loads (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.sync.client import connect

from bench.trivial import (
    cpu_seconds,
    run_level,
    start_server,
    stop_server,
    write_section,
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["envsdk", "bare"])
def test_load_generator_completes_every_session_without_errors(kind: str) -> None:
    proc, url = start_server(kind, 16)
    try:
        before = cpu_seconds(proc.pid)
        result = run_level(kind, url, 3, 0.5, proc.pid, procs=2)
        spent = cpu_seconds(proc.pid) - before
    finally:
        stop_server(proc)
    assert result.errors == 0, result.first_error
    assert result.completed_sessions == 3 and result.connected == 3
    assert result.steps > 0 and len(result.latencies_ms) == result.steps
    # The server's CPU over the load alone, its start-up left out: hundreds of steps take clock ticks.
    assert 0 < result.server_cpu_s <= spent + 1e-9, (result.server_cpu_s, spent)
    assert result.rss_kib > 0


@pytest.mark.timeout(60)
def test_envsdk_server_declines_permessage_deflate_by_default() -> None:
    proc, url = start_server("envsdk", 4)
    try:
        with connect(url, compression="deflate") as ws:
            assert ws.response is not None
            assert "Sec-WebSocket-Extensions" not in ws.response.headers
    finally:
        stop_server(proc)


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Sudoku server\n\nkeep me\n\n## Scale\n\nold\n\n## Tail\n\nkeep too\n")
    write_section(results, "## Scale", "## Scale: memory\n\nnew\n")
    write_section(results, "## Client scale", "## Client scale\n\nadded\n")
    text = results.read_text()
    assert "keep me" in text and "keep too" in text and "new" in text and "added" in text
    assert "old" not in text
    assert text.index("## Sudoku server") < text.index("## Scale") < text.index("## Tail") < text.index("## Client scale")
