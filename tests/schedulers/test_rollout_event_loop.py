"""`run_batches` keeps its caller's event loop free while it sets a run up and tears it down.

What it does before the first episode and after the last one blocks: it asks the server what it
serves (``/schema``, then ``tools/list`` over ``/mcp``, each up to 10 s) and starts or stops an
embedded server (up to 20 s). A trainer that awaits `run_rollouts` on the loop that also runs
its generation server must not see that loop stall for the whole of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from envsdk.policies import RandomPolicy
from envsdk.rollout import Batch, make_requests, run_batches
from envsdk.testing import running_server

pytestmark = pytest.mark.timeout(90)

#: How long the slow server takes to answer each question about itself.
PROBE_DELAY_S = 2.0


@pytest.fixture
def slow_server() -> Iterator[str]:
    """A real server that takes `PROBE_DELAY_S` to answer ``/schema`` and ``/mcp`` (and serves
    no sessions: every episode ends at its first connection)."""
    app = FastAPI()

    @app.get("/schema")
    async def schema() -> dict[str, object]:
        await asyncio.sleep(PROBE_DELAY_S)
        return {"action": {"type": "object", "properties": {"message": {"type": "string"}}}}

    @app.post("/mcp")
    async def mcp() -> dict[str, object]:
        await asyncio.sleep(PROBE_DELAY_S)
        return {"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}

    with running_server(app) as url:
        yield url


async def _longest_stall(work: "asyncio.Future[object] | asyncio.Task[object]") -> float:
    """The longest time the loop did not run a 10 ms heartbeat while `work` ran."""
    longest = 0.0
    last = time.monotonic()
    while not work.done():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        longest = max(longest, now - last)
        last = now
    return longest


async def test_probing_a_slow_server_does_not_stall_the_loop(slow_server: str) -> None:
    batch = Batch("guess", make_requests("guess", 2, 0, slow_server), RandomPolicy("guess", seed=0), slow_server)
    work = asyncio.ensure_future(run_batches([batch], concurrency=2, progress=False))
    stall = await _longest_stall(work)
    report = await work
    # The probes did run (both took their delay), and the episodes ended as recorded errors.
    assert len(report.trajectories) == 2 and all(t.status == "error" for t in report.trajectories)
    assert stall < 1.0, f"the event loop stalled {stall:.2f} s while run_batches asked the server what it is"


async def test_starting_and_stopping_the_embedded_server_does_not_stall_the_loop() -> None:
    from envsdk.policies import SudokuOraclePolicy

    batch = Batch("sudoku", make_requests("sudoku", 2, 0), SudokuOraclePolicy())
    work = asyncio.ensure_future(run_batches([batch], concurrency=2, progress=False))
    stall = await _longest_stall(work)
    report = await work
    assert [t.status for t in report.trajectories] == ["done", "done"]
    assert stall < 1.0, f"the event loop stalled {stall:.2f} s while run_batches started or stopped its server"


def _uvicorn_threads() -> set[str]:
    import threading

    return {t.name for t in threading.enumerate() if t.name.startswith("uvicorn-") and t.is_alive()}


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.3, 1.5])
async def test_a_run_cancelled_at_any_moment_stops_the_server_it_started(after_s: float) -> None:
    """Cancelled while its server is still starting (in a worker thread) or while episodes run,
    `run_batches` stops that server and its board workers before it gives up."""
    import multiprocessing

    from envsdk.policies import SudokuOraclePolicy

    # Other tests in this process may keep servers and pools of their own: only this run's count.
    before = _uvicorn_threads()
    children = {p.pid for p in multiprocessing.active_children()}

    def new_children() -> list[int]:
        return [p.pid for p in multiprocessing.active_children() if p.pid not in children]

    # Far more episodes than can finish by the last moment tried (4 of them took under 1.5 s on
    # an idle machine, and the run then ended before it was cancelled): cancelled mid-run.
    batch = Batch("sudoku", make_requests("sudoku", 64, 0), SudokuOraclePolicy())
    work = asyncio.ensure_future(run_batches([batch], concurrency=2, progress=False))
    await asyncio.sleep(after_s)
    assert not work.done(), "the run ended before it was cancelled: it tests nothing"
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    deadline = time.monotonic() + 20
    while (_uvicorn_threads() - before or new_children()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _uvicorn_threads() - before == set(), "the run's server thread is still running"
    assert new_children() == [], "the run's board workers are still running"


async def test_a_manager_still_entering_when_cancelled_is_exited_once_it_has_entered() -> None:
    """The rule itself, without relying on a generator's finaliser (which would also stop the
    embedded server above, later): entered in a thread, cancelled mid-way, exited exactly once."""
    import contextlib
    import threading

    from envsdk.rollout import _enter_off_loop

    calls: list[str] = []
    entered = threading.Event()

    class SlowToStart:
        def __enter__(self) -> str:
            time.sleep(0.3)
            calls.append("enter")
            entered.set()
            return "started"

        def __exit__(self, *exc: object) -> None:
            calls.append("exit")

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await _enter_off_loop(stack, SlowToStart())
            await asyncio.sleep(10)

    work = asyncio.ensure_future(run())
    await asyncio.sleep(0.05)
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    assert calls == ["enter", "exit"]

    calls.clear()
    entered.clear()
    work = asyncio.ensure_future(run())
    await asyncio.to_thread(entered.wait, 5)
    await asyncio.sleep(0.05)
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    assert calls == ["enter", "exit"]


def test_a_stop_signalled_while_the_event_loop_starts_closes_the_run_unplayed() -> None:
    """A signal between the event loop's start and the run's first step: the run is not played,
    the stop says so (KeyboardInterrupt), and the run's coroutine is closed, not left for the
    collector to warn about ("coroutine ... was never awaited")."""
    from envsdk.rollout import _Stop

    played = []

    async def run() -> None:
        played.append(True)

    stop = _Stop()
    stop.signals = 1  # as the handler leaves it when the signal came before the loop ran
    main = run()
    with pytest.raises(KeyboardInterrupt):
        stop.run(main)
    assert played == [] and main.cr_frame is None  # closed
