"""The cost of handing one synchronous env call to another thread, in-process (no sockets): what
the default path pays per call on top of ``INLINE_SYNC``.

N sessions (coroutines on one event loop) each make calls of a trivial function in a loop,
yielding to the loop after each call, through one of:

* ``inline`` — the function runs on the loop (``INLINE_SYNC``);
* ``lane-waited`` — each session's own lane thread, the loop waiting for the call (the
  default for calls of a fast kind; see `envsdk.server.executors`);
* ``lane-awaited`` — each session's own lane, the loop serving others meanwhile (the default
  for slow kinds);
* ``shared-waited`` — ONE lane thread for all sessions, waited for: a hot thread, no affinity
  per session and no isolation from a hung call; the floor of any hand-off to another thread;
* ``pool`` — `concurrent.futures.ThreadPoolExecutor` + `loop.run_in_executor` (envsdk's first
  design, and what OpenEnv does per session).

Reports the process's CPU time per call (user + system, all threads) and wall time per call.
``--busy 1`` keeps another core busy meanwhile, as the load generator does in a server run.

    python -m bench handoff --sessions 256 --calls 40000      # about a minute
    python -m bench handoff --busy 1
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

MODES = ("inline", "lane-waited", "lane-awaited", "shared-waited", "pool")
WAIT_S = {"lane-waited": 0.001, "shared-waited": 0.001, "lane-awaited": 0.0}  # lane modes: lane_wait_s


def _work() -> int:
    return 1


async def _measure(mode: str, sessions: int, calls: int) -> tuple[float, float]:
    from envsdk.server.executors import Executors

    executors = Executors(max_abandoned_threads=4)
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8) if mode == "pool" else None
    shared = executors.lane() if mode == "shared-waited" else None
    each = max(1, calls // sessions)
    wait_s = WAIT_S.get(mode, 0.0)

    async def session() -> None:
        lane = shared or (executors.lane() if mode.startswith("lane") else None)
        for _ in range(each):
            if lane is not None:
                handed = lane.call(_work, (), {}, wait_s)
                if not handed.settled:
                    assert handed.future is not None
                    await handed.future
            elif mode == "inline":
                _work()
            else:
                await loop.run_in_executor(pool, _work)
            await asyncio.sleep(0)

    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(session() for _ in range(sessions)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        executors.shutdown()
        if pool is not None:
            pool.shutdown(wait=True)
    done = each * sessions
    return 1e6 * cpu / done, 1e6 * wall / done


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--calls", type=int, default=40_000, help="calls per mode, all sessions together")
    parser.add_argument("--rounds", type=int, default=3, help="modes interleaved, medians reported")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--busy", type=int, default=0, help="processes spinning on the CPU meanwhile (1 on 2 cores: as under a load generator)"
    )


@contextlib.contextmanager
def _busy(processes: int) -> Iterator[None]:
    """`processes` other processes spinning on the CPU meanwhile, as a load generator keeps a
    core busy during a server benchmark (a woken thread then tends to land on the loop's core)."""
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(processes):
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL))
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)


def run(args: argparse.Namespace, command: str) -> str:
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in args.modes}
    with _busy(args.busy):
        for _ in range(args.rounds):
            for mode in args.modes:
                results[mode].append(asyncio.run(asyncio.wait_for(_measure(mode, args.sessions, args.calls), 300)))
    lines = [
        (
            f"Command: `{command}`; {args.sessions} sessions, {args.calls:,} calls per hand-off, median of "
            f"{args.rounds} rounds (hand-offs interleaved); {args.busy} other process(es) spinning meanwhile."
        ),
        "",
        "| hand-off | CPU µs/call | wall µs/call |",
        "|---|---|---|",
    ]
    for mode, values in results.items():
        cpu = statistics.median_low(v[0] for v in values)
        wall = statistics.median_low(v[1] for v in values)
        lines.append(f"| {mode} | {cpu:.1f} | {wall:.1f} |")
    report = "\n".join(lines)
    print(report)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench.handoff " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
