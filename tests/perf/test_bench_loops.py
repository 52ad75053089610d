"""The event loop in `bench`: ``--loop`` reaches every server (the bare one included; OpenEnv's
in tests/perf/test_bench_openenv_scaling.py), the load generator runs on uvloop when asked, and
the trivial table compares servers on the same loop. No timing is asserted."""

from __future__ import annotations

import pytest

from bench.trivial import event_loop_of, render, run_level, start_server, stop_server


@pytest.mark.timeout(120)
def test_every_server_runs_the_loop_it_is_given_and_rows_pair_by_loop() -> None:
    results = []
    for loop in ("asyncio", "uvloop"):
        for kind in ("envsdk", "bare"):
            proc, url = start_server(kind, 8, ["--loop", loop])
            try:
                # envsdk keeps its own h11 protocol on either loop; the bare server has no uvicorn.
                assert event_loop_of(proc.pid) == loop, kind
                result = run_level(kind, url, 2, 0.3, proc.pid, procs=1, client_loop="uvloop")
            finally:
                stop_server(proc)
            assert result.errors == 0, result.first_error
            assert result.completed_sessions == 2 and result.steps > 0
            assert 0 < result.server_cpu_share < 4  # a process of a few threads, on its own clock
            result.loop = loop
            results.append(result)
    table = render(results, [2], 0.3, "python -m bench trivial --loops asyncio uvloop", 1, "uvloop")
    assert "| 2 | envsdk | asyncio | " in table and "| 2 | bare | uvloop | " in table
    # One ratio row per loop, each against the bare server on that loop; OpenEnv did not run.
    ratios, per_loop = table.split("Ratios on the same event loop", 1)[1].split("uvloop over asyncio", 1)
    ratio_rows = [line for line in ratios.splitlines() if line.startswith("| 2 | envsdk | ")]
    assert [row.split(" | ")[2] for row in ratio_rows] == ["asyncio", "uvloop"]
    assert all(row.count("×") == 4 and row.count(" – ") == 3 for row in ratio_rows)
    assert "| 2 | bare | " in per_loop and "| 2 | envsdk | " in per_loop
