"""OpenEnv's published scaling harness, run against envsdk and against OpenEnv here, in the same run.

Where it comes from: OpenEnv's tutorial on scaling (github.com/meta-pytorch/OpenEnv,
``tutorial/03-scaling.md``, "Experiments Results") publishes the study (local uvicorn, 8 workers
on 8 cores: 100 % of 512 sessions, 96.5 % of 2,048, 63.8 % of 4,096, 36.9 % of 8,192) and points
to its code, github.com/burtenshaw/openenv-scaling: the client is ``tests/test_scaling.py``, the
environment ``benchmark/server/benchmark_environment.py`` (here `bench.openenv_scaling_apps`).
This module is our own code doing what that client does in its WebSocket mode (``--mode ws``):

* A batch of N sessions starts at once: one task per session, all gathered, no ramp.
* Each session connects to ``/ws`` with the ``websockets`` client's defaults (permessage-deflate
  offered, keepalive pings every 20 s), within ``timeout``; sends a reset and waits at most
  ``timeout`` for its reply; sends one step ``{"wait_seconds": wait}`` (the env sleeps that long
  in env code) and waits at most ``timeout``; sends a close frame and closes.
* A session succeeds when it connected and both replies came, neither an error frame. Anything
  else fails it (connection refused or reset, handshake or reply timeout, error frame), counted by
  its exception's type.
* Per batch: successes, connect / reset / step / total latency p50 and p99 over the successful
  sessions (percentiles interpolated linearly, as the harness does), the batch's wall time,
  successful sessions per second, and the effective concurrency (N × wait / wall time: how many
  of the sleeps overlapped).
* Every batch size runs ``reps`` times; the **max batch** is the largest N whose every repetition
  reached 95 % success (the study's definition).

The harness's own defaults are a 120 s timeout and one repetition; the study ran 3 repetitions,
wait 1 s for its latency table and 10 s for its summary, batches 32 … 16,384. Added here, beyond
the harness: the distinct session hashes among the successes (each session reached its own env
instance, so a success is a real one), and the server's peak RSS during the batch.

What differs from the study: each server is one uvicorn process (one worker), and the client runs
on the same cores; envsdk runs as ``envsdk.server.serve`` runs it, OpenEnv as ``uvicorn.run(app)``
runs it (the study's ``uv run server``); both with their own defaults but the event loop, which
``--loop`` sets for both (left out: uvicorn's ``auto``, uvloop when installed).

    python -m bench openenv-scaling --out bench/RESULTS.md          # 32 … 2,048, wait 1 s: ~2 min
    python -m bench openenv-scaling --levels 32 128 512 2048 4096 8192 --reps 3   # the study's grid
    python -m bench openenv-scaling --quick                          # 8 and 32 sessions, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.servers import LOOPS
from bench.trivial import (
    event_loop_of,
    machine_line,
    raise_open_files_limit,
    rss_kib,
    start_server,
    stop_server,
    versions,
    write_section,
)

SERVERS = {"envsdk": "envsdk-wait", "openenv": "openenv-wait"}
"""The two servers compared: label → `bench.servers` kind."""

SUCCESS_THRESHOLD = 0.95
"""A batch size holds when every repetition had at least this share of successes (the study's)."""

PUBLISHED = {32: (100.0, 1.05), 128: (100.0, 1.07), 512: (100.0, 1.33), 2048: (96.5, 1.97), 4096: (63.8, 3.20), 8192: (36.9, 5.75)}
"""OpenEnv's published local-uvicorn results (8 workers, 8 cores): batch → (success %, total p99 s)."""

HEADING = "## OpenEnv's scaling harness"


@dataclass
class SessionResult:
    """One session of a batch: its latencies (seconds) and what it saw."""

    success: bool = False
    connect_s: float = 0.0
    reset_s: float = 0.0
    step_s: float = 0.0
    total_s: float = 0.0
    session_hash: str = ""
    waited_s: float = 0.0
    error_type: str = ""
    error: str = ""


@dataclass
class BatchResult:
    """One (server, N, repetition) batch."""

    server: str
    sessions: int
    rep: int
    wait_s: float
    wall_s: float = 0.0
    peak_rss_kib: int = 0
    results: list[SessionResult] = field(default_factory=list)

    @property
    def successful(self) -> list[SessionResult]:
        return [r for r in self.results if r.success]

    @property
    def success_pct(self) -> float:
        return 100.0 * len(self.successful) / self.sessions if self.sessions else 0.0

    @property
    def unique_sessions(self) -> int:
        return len({r.session_hash for r in self.successful if r.session_hash})

    @property
    def failures(self) -> collections.Counter[str]:
        return collections.Counter(r.error_type for r in self.results if not r.success)

    def latency(self, phase: str, q: float) -> float:
        """Percentile `q` (0-100) of one phase's latency (``connect``, ``reset``, ``step``,
        ``total``) over the successful sessions; NaN when none succeeded."""
        values = [getattr(r, f"{phase}_s") for r in self.successful]
        return percentile(values, q) if values else float("nan")

    @property
    def sessions_per_s(self) -> float:
        return len(self.successful) / self.wall_s if self.wall_s else 0.0

    @property
    def effective_concurrency(self) -> float:
        return self.sessions * self.wait_s / self.wall_s if self.wall_s else 0.0


def percentile(values: list[float], q: float) -> float:
    """Percentile `q` (0-100) of `values`, interpolated linearly between the closest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (k - lo) * (ordered[hi] - ordered[lo])


# ---------------------------------------------------------------- the harness's client


async def run_session(ws_url: str, wait_s: float, timeout_s: float) -> SessionResult:
    """One session as the harness plays it: connect, reset, one step of `wait_s`, close."""
    from websockets.asyncio.client import connect

    result = SessionResult()
    started = time.perf_counter()
    try:
        t0 = time.perf_counter()
        ws = await asyncio.wait_for(connect(ws_url, open_timeout=timeout_s), timeout_s)
        result.connect_s = time.perf_counter() - t0
        async with ws:
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
            result.reset_s = time.perf_counter() - t0
            if reply.get("type") == "error":
                raise RuntimeError(f"reset error: {json.dumps(reply)[:200]}")
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "step", "data": {"wait_seconds": wait_s}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
            result.step_s = time.perf_counter() - t0
            if reply.get("type") == "error":
                raise RuntimeError(f"step error: {json.dumps(reply)[:200]}")
            await ws.send(json.dumps({"type": "close"}))
        observation = reply.get("data", {}).get("observation", {})
        result.session_hash = str(observation.get("session_hash", ""))
        result.waited_s = float(observation.get("waited_seconds", 0.0))
        result.success = True
    except Exception as exc:  # noqa: BLE001 (every failure is counted by type, as the harness does)
        result.error_type, result.error = type(exc).__name__, str(exc)[:300]
    result.total_s = time.perf_counter() - started
    return result


async def run_batch(
    ws_url: str, sessions: int, wait_s: float, timeout_s: float, server: str = "", rep: int = 1, pid: int = 0
) -> BatchResult:
    """Start `sessions` sessions at once against `ws_url` and gather them; with a server `pid`,
    its RSS is sampled every 100 ms for the batch's peak. Bounded: each session's three waits
    are, and the batch as a whole is cut at four timeouts (the rest count as failed)."""
    batch = BatchResult(server, sessions, rep, wait_s)
    sampling = True

    async def sample() -> None:
        while sampling and pid:
            batch.peak_rss_kib = max(batch.peak_rss_kib, rss_kib(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    started = time.perf_counter()
    tasks = [asyncio.ensure_future(run_session(ws_url, wait_s, timeout_s)) for _ in range(sessions)]
    done, pending = await asyncio.wait(tasks, timeout=4 * timeout_s + 30)
    batch.wall_s = time.perf_counter() - started
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=30)
    sampling = False
    await sampler
    batch.results = [t.result() for t in done]
    batch.results += [SessionResult(error_type="BatchTimeout", error="cut at the batch's bound") for _ in pending]
    return batch


# ---------------------------------------------------------------- report


def max_batch(batches: list[BatchResult]) -> int:
    """The largest batch size whose every repetition reached `SUCCESS_THRESHOLD` (0: none)."""
    by_size: dict[int, list[BatchResult]] = {}
    for b in batches:
        by_size.setdefault(b.sessions, []).append(b)
    held = [n for n, runs in by_size.items() if all(b.success_pct >= 100 * SUCCESS_THRESHOLD for b in runs)]
    return max(held, default=0)


def _seconds(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"  # NaN: no successes


def render(batches: list[BatchResult], args: argparse.Namespace, command: str, loops: dict[str, str]) -> str:
    """The section of RESULTS.md; `loops` says which event loop (and HTTP parser) each server ran."""
    servers = [s for s in SERVERS if any(b.server == s for b in batches)]
    levels = sorted({b.sessions for b in batches})
    loop = ", ".join(f"{s} {loops.get(s, 'unknown')}" for s in servers)
    lines = [
        f"{HEADING}: envsdk vs OpenEnv, same run",
        "",
        (
            "OpenEnv's scaling study (its tutorial `tutorial/03-scaling.md`; client `tests/test_scaling.py` of "
            "github.com/burtenshaw/openenv-scaling), its WebSocket client reimplemented in `bench/openenv_scaling.py`: "
            "N sessions start at once, each connects (websockets client defaults), resets, steps once (the env "
            f"sleeps {args.wait:g} s in env code), closes; a session succeeds when both replies came and neither was "
            f"an error, each wait bounded by {args.timeout:g} s. Both servers serve the study's environment as a plain "
            "sync env, one process each, as their users start them (envsdk: `serve`, the default path; OpenEnv: "
            f"`uvicorn.run(create_app(...))`); event loop, read from each server's memory map: {loop}."
        ),
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
        (
            "| server | sessions | rep | success | connect p50 / p99 s | reset p50 / p99 s | step p50 / p99 s "
            "| total p50 / p99 s | wall s | sessions/s | eff. concurrency | distinct sessions | peak RSS MiB | failures |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in levels:
        for server in servers:
            for b in sorted((b for b in batches if b.server == server and b.sessions == n), key=lambda b: b.rep):
                cells = [
                    f"{_seconds(b.latency(phase, 50))} / {_seconds(b.latency(phase, 99))}"
                    for phase in ("connect", "reset", "step", "total")
                ]
                failures = ", ".join(f"{kind} {count}" for kind, count in b.failures.most_common()) or "–"
                lines.append(
                    f"| {server} | {n:,} | {b.rep} | {len(b.successful):,}/{n:,} ({b.success_pct:.1f} %) | "
                    + " | ".join(cells)
                    + f" | {b.wall_s:.1f} | {b.sessions_per_s:,.0f} | {b.effective_concurrency:,.0f} | "
                    f"{b.unique_sessions:,} | {b.peak_rss_kib / 1024:.0f} | {failures} |"
                )
    lines += [
        "",
        (
            "Success by batch size (the worst repetition) beside OpenEnv's published local-uvicorn results "
            "(8 workers on 8 cores):"
        ),
        "",
        "| sessions | " + " | ".join(f"{s} success / total p99 s" for s in servers) + " | published (8 cores) |",
        "|---|" + "---|" * len(servers) + "---|",
    ]
    for n in levels:
        cells = []
        for server in servers:
            runs = [b for b in batches if b.server == server and b.sessions == n]
            worst = min(runs, key=lambda b: b.success_pct)
            cells.append(f"{worst.success_pct:.1f} % / {_seconds(max(b.latency('total', 99) for b in runs))}")
        published = PUBLISHED.get(n)
        ref = f"{published[0]:g} % / {published[1]:.2f}" if published else "–"
        lines.append(f"| {n:,} | " + " | ".join(cells) + f" | {ref} |")
    lines += [
        "",
        "Max batch (every repetition ≥ 95 % success): "
        + "; ".join(f"{s} {max_batch([b for b in batches if b.server == s]):,}" for s in servers)
        + f" of the sizes run here; published: 2,048 on 8 cores ({2048 // 8} per core).",
    ]
    return "\n".join(lines) + "\n"


def summary_line(b: BatchResult) -> str:
    failures = dict(b.failures.most_common(3))
    return (
        f"{b.server:8s} n={b.sessions:6d} rep={b.rep} success={len(b.successful)}/{b.sessions} ({b.success_pct:5.1f}%) "
        f"connect p50={b.latency('connect', 50):.3f}s total p99={b.latency('total', 99):.3f}s wall={b.wall_s:.1f}s "
        f"distinct={b.unique_sessions} rss={b.peak_rss_kib / 1024:.0f}MiB failures={failures}"
    )


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--levels", type=int, nargs="+", default=None, help="batch sizes (default 32 128 512 2048)")
    parser.add_argument("--wait", type=float, default=None, help="seconds each step sleeps in env code (default 1)")
    parser.add_argument("--timeout", type=float, default=None, help="bound of each connect and reply (default 120)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each batch size")
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=list(SERVERS))
    parser.add_argument("--loop", choices=LOOPS, default=None, help="both servers' event loop (default: uvicorn's auto)")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra argument for envsdk's bench.servers process (repeatable)"
    )
    parser.add_argument("--cooldown", type=float, default=1.0, help="seconds between batches (the study's)")
    parser.add_argument("--quick", action="store_true", help="8 and 32 sessions, wait 0.1 s, timeout 30 s")
    parser.add_argument("--out", type=Path, default=None, help="RESULTS.md to update")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that `--quick` changes."""
    quick = {"levels": [8, 32], "wait": 0.1, "timeout": 30.0}
    full = {"levels": [32, 128, 512, 2048], "wait": 1.0, "timeout": 120.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.levels) < 1 or args.wait < 0 or args.timeout <= 0 or args.reps < 1:
        raise SystemExit("--levels must be ≥ 1, --wait ≥ 0, --timeout > 0, --reps ≥ 1")
    return args


def run(args: argparse.Namespace, command: str) -> list[BatchResult]:
    """Start the servers, run every batch (sizes in turn, servers interleaved), write the report."""
    args = resolve(args)
    raise_open_files_limit()
    max_sessions = max(args.levels) + 16
    extra = ["--loop", args.loop] if args.loop else []
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    loops: dict[str, str] = {}
    batches: list[BatchResult] = []
    try:
        for label in args.servers:
            own = args.server_arg if label == "envsdk" else []
            servers[label] = start_server(SERVERS[label], max_sessions, [*extra, *own])
            loops[label] = event_loop_of(servers[label][0].pid)
        for n in args.levels:
            for rep in range(1, args.reps + 1):
                for label in args.servers:
                    proc, url = servers[label]
                    batch = asyncio.run(run_batch(url, n, args.wait, args.timeout, label, rep, proc.pid))
                    print(summary_line(batch), flush=True)
                    batches.append(batch)
                    time.sleep(args.cooldown)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    report = render(batches, args, command, loops)
    print(report)
    if args.out:
        write_section(args.out, HEADING, report)
    return batches


def resolve_args(argv: list[str]) -> argparse.Namespace:
    """The arguments of ``python -m bench openenv-scaling ARGV``, defaults filled."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return resolve(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    run(resolve_args(argv), "python -m bench openenv-scaling " + " ".join(argv))


if __name__ == "__main__":
    main()
