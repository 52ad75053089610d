"""Execution core: the default path against OpenEnv and the bare server, hung calls, and memory
under big observations. Every server runs in its own process on 127.0.0.1; every wait is bounded.

* ``trivial`` — `bench.trivial` at 256 and 1,024 sessions, three interleaved rounds: envsdk's
  default path (a plain sync env, each session's calls on its lane thread), the same with
  ``lane_wait_s=0`` (no waited hand-offs), envsdk with ``INLINE_SYNC``, OpenEnv, bare; every
  server on each event loop of ``--loops`` (asyncio, uvloop), the load generator on
  ``--client-loop``.
* ``hung`` — 255 sessions step the echo env (default path, 1 s step deadline); their rate is
  measured alone, then while 32 other sessions' steps hang in env code (``time.sleep(3600)``)
  past their deadline; then a new client's connect + reset is timed.
* ``memory`` — 16 sessions (handshake, request ids: every reply recorded for replay) step an
  env whose observations are 8 MiB each; the server's RSS is sampled every 20 ms.

    python -m bench core --out bench/RESULTS.md        # about 8 minutes on 2 cores

The ``hung`` and ``memory`` parts run ``envsdk serve`` as a user does: uvicorn's ``auto`` loop,
which is uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import trivial
from bench.servers import LOOPS
from bench.trivial import (
    REPLY_TIMEOUT_S,
    cpu_seconds,
    machine_line,
    raise_open_files_limit,
    rss_kib,
    versions,
    write_section,
)

REPO = Path(__file__).resolve().parent.parent
PARTS = ("trivial", "hung", "memory")
STEP = json.dumps({"type": "step", "data": {"message": "hello"}})
RESET = json.dumps({"type": "reset", "data": {}})


def start_envsdk(target: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``envsdk serve bench.core_apps:<target>`` on a free port; its process and base URL."""
    from envsdk.testing import free_port

    port = free_port()
    env = {**os.environ, "ENVSDK_WEB": "0", "PYTHONPATH": str(REPO)}
    env.pop("MAX_CONCURRENT_ENVS", None)
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "envsdk.cli", "serve", f"bench.core_apps:{target}", "--port", str(port),
             "--log-level", "error"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: see {log}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("the server did not start within 60 s")


def stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM, bounded; the seconds it took to exit."""
    from envsdk.testing import stop_process

    started = time.monotonic()
    stop_process(proc, 30)
    return time.monotonic() - started


# ---------------------------------------------------------------- hung calls


@dataclass
class HungResult:
    others: int
    hung: int
    alone_steps_s: float = 0.0
    during_steps_s: float = 0.0
    alone_p99_ms: float = 0.0
    during_p99_ms: float = 0.0
    alone_cpu_us: float = 0.0
    during_cpu_us: float = 0.0
    timeouts: int = 0
    timeout_reply_s: float = 0.0
    abandoned_threads: int = -1
    newcomer_s: float = float("nan")
    exit_s: float = float("nan")
    errors: list[str] = field(default_factory=list)


async def _step_for(sockets: list[Any], seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def loop(ws: Any) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await ws.send(STEP)
            reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            if not str(reply).startswith('{"type":"observation"'):
                raise RuntimeError(str(reply)[:200])
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(loop(ws) for ws in sockets))
    return len(latencies), latencies


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else float("nan")


async def _hung(url: str, pid: int, others: int, hung: int, seconds: float) -> HungResult:
    from websockets.asyncio.client import connect

    result = HungResult(others, hung)
    ws_url = url.replace("http://", "ws://") + "/ws"
    options: dict[str, Any] = {"ping_interval": None, "compression": None, "open_timeout": 60}
    sockets = [await connect(ws_url, **options) for _ in range(others)]
    stuck = [await connect(ws_url, **options) for _ in range(hung)]
    try:
        for ws in sockets + stuck:
            await ws.send(RESET)
            await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
        cpu = cpu_seconds(pid)
        steps, latencies = await _step_for(sockets, seconds)
        result.alone_steps_s, result.alone_p99_ms = steps / seconds, _p99(latencies)
        result.alone_cpu_us = 1e6 * (cpu_seconds(pid) - cpu) / max(steps, 1)
        started = time.perf_counter()
        for ws in stuck:
            await ws.send(json.dumps({"type": "step", "data": {"message": "sleep:3600"}}))
        replies = [json.loads(await asyncio.wait_for(ws.recv(), 30)) for ws in stuck]
        result.timeout_reply_s = time.perf_counter() - started
        result.timeouts = sum(r.get("data", {}).get("code") == "TIMEOUT" for r in replies)
        cpu = cpu_seconds(pid)
        steps, latencies = await _step_for(sockets, seconds)
        result.during_steps_s, result.during_p99_ms = steps / seconds, _p99(latencies)
        result.during_cpu_us = 1e6 * (cpu_seconds(pid) - cpu) / max(steps, 1)
        async with httpx.AsyncClient() as http:
            result.abandoned_threads = (await http.get(url + "/health", timeout=10)).json().get("abandoned_threads", -1)
        started = time.perf_counter()
        async with connect(ws_url, **options) as newcomer:
            await newcomer.send(RESET)
            await asyncio.wait_for(newcomer.recv(), 30)
        result.newcomer_s = time.perf_counter() - started
    except Exception as exc:  # reported in the table
        result.errors.append(repr(exc)[:300])
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets + stuck), return_exceptions=True)
    return result


def run_hung(seconds: float, log: Path) -> HungResult:
    from bench.core_apps import HUNG_STEP_DEADLINE_S

    proc, url = start_envsdk("hung", log)
    try:
        result = asyncio.run(asyncio.wait_for(_hung(url, proc.pid, 255, 32, seconds), 4 * seconds + 240))
    finally:
        exit_s = stop(proc)
    result.exit_s = exit_s
    ratio = result.during_steps_s / max(result.alone_steps_s, 1e-9)
    print(
        f"hung: {result.others} sessions {result.alone_steps_s:.0f} steps/s alone (p99 {result.alone_p99_ms:.1f} ms), "
        f"{result.during_steps_s:.0f} with {result.timeouts}/{result.hung} steps hung past their {HUNG_STEP_DEADLINE_S:g} s "
        f"deadline (p99 {result.during_p99_ms:.1f} ms) = {ratio:.2f}; server CPU/step {result.alone_cpu_us:.0f} -> "
        f"{result.during_cpu_us:.0f} us; abandoned threads {result.abandoned_threads}; "
        f"new client's connect + reset {result.newcomer_s * 1000:.0f} ms; SIGTERM exit {exit_s:.1f} s {result.errors}",
        flush=True,
    )
    return result


# ---------------------------------------------------------------- memory


@dataclass
class MemoryResult:
    sessions: int
    steps_each: int
    rss_idle_kib: int = 0
    rss_peak_kib: int = 0
    rss_end_kib: int = 0
    steps_done: int = 0
    errors: list[str] = field(default_factory=list)


async def _memory(url: str, pid: int, sessions: int, steps_each: int) -> MemoryResult:
    from websockets.asyncio.client import connect

    result = MemoryResult(sessions, steps_each)
    ws_url = url.replace("http://", "ws://") + "/ws"
    sockets = [await connect(ws_url, ping_interval=None, compression=None, max_size=None) for _ in range(sessions)]
    sampling = True

    async def sample() -> None:
        while sampling:
            result.rss_peak_kib = max(result.rss_peak_kib, rss_kib(pid))
            await asyncio.sleep(0.02)

    async def play(i: int, ws: Any) -> None:
        for n in range(steps_each):
            await ws.send(json.dumps({"type": "step", "data": {"message": "m"}, "id": f"{i}-{n}"}))
            reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            if not str(reply[:30]).startswith('{"id"'):
                raise RuntimeError(str(reply)[:200])
            result.steps_done += 1

    try:
        for i, ws in enumerate(sockets):
            await ws.send(json.dumps({"type": "session", "id": f"{i}-h"}))
            await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            await ws.send(json.dumps({"type": "reset", "data": {}, "id": f"{i}-r"}))
            await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
        await asyncio.sleep(0.5)
        result.rss_idle_kib = rss_kib(pid)
        sampler = asyncio.ensure_future(sample())
        await asyncio.gather(*(play(i, ws) for i, ws in enumerate(sockets)))
        await asyncio.sleep(1.0)
        sampling = False
        await sampler
        result.rss_end_kib = rss_kib(pid)  # every session still open: its record still held
    except Exception as exc:  # reported in the table
        result.errors.append(repr(exc)[:300])
    finally:
        sampling = False
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return result


def run_memory(sessions: int, steps_each: int, log: Path) -> MemoryResult:
    proc, url = start_envsdk("big", log)
    try:
        result = asyncio.run(asyncio.wait_for(_memory(url, proc.pid, sessions, steps_each), 600))
    finally:
        stop(proc)
    print(
        f"memory: {sessions} sessions x {steps_each} steps of 8 MiB observations: RSS {result.rss_idle_kib / 1024:.0f} MiB "
        f"idle, peak {result.rss_peak_kib / 1024:.0f}, end {result.rss_end_kib / 1024:.0f} {result.errors}",
        flush=True,
    )
    return result


# ---------------------------------------------------------------- report


def render(hung: HungResult | None, memory: MemoryResult | None, command: str) -> str:
    from bench.core_apps import BIG_OBSERVATION_BYTES, HUNG_STEP_DEADLINE_S

    lines = [
        "## Execution core: hung calls, big observations, the default path",
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
    ]
    if hung is not None:
        lines += ["### 32 hung calls", ""]
        ratio = hung.during_steps_s / max(hung.alone_steps_s, 1e-9)
        lines += [
            (f"Hung calls: {hung.others} sessions of the echo env (default path, step deadline "
            f"{HUNG_STEP_DEADLINE_S:g} s) step from one client process; then {hung.hung} more sessions each send a "
            "step that sleeps an hour in env code. Each hung step was answered TIMEOUT "
            f"({hung.timeouts}/{hung.hung}, all within {hung.timeout_reply_s:.1f} s) and its thread written off."),
            "",
            "| phase | steps/s of the others | p99 ms | ratio | server CPU µs/step |",
            "|---|---|---|---|---|",
            f"| alone | {hung.alone_steps_s:,.0f} | {hung.alone_p99_ms:.1f} | 1.00 | {hung.alone_cpu_us:.0f} |",
            (f"| {hung.hung} calls hung past their deadline | {hung.during_steps_s:,.0f} | {hung.during_p99_ms:.1f} | "
            f"{ratio:.2f} | {hung.during_cpu_us:.0f} |"),
            "",
            (f"`/health` then reported `abandoned_threads: {hung.abandoned_threads}`; a new client's connect + reset "
            f"took {hung.newcomer_s * 1000:.0f} ms; SIGTERM, with the {hung.hung} threads still asleep, exited in "
            f"{hung.exit_s:.1f} s (drain 20 s default, unused: nothing was in flight; then up to the 5 s close deadline "
            "for the written-off threads to close their envs)."),
            "",
        ]
        if hung.errors:
            lines += ["Errors: " + "; ".join(hung.errors), ""]
    if memory is not None:
        lines += ["### RSS under 8 MiB observations", ""]
        mib = BIG_OBSERVATION_BYTES / 2**20
        grown = (memory.rss_end_kib - memory.rss_idle_kib) / 1024
        lines += [
            (f"Big observations: {memory.sessions} sessions (handshake, request ids, so every reply is recorded) each "
            f"step {memory.steps_each} times, concurrently; every observation is {mib:g} MiB. Replay record bound "
            "(default): 16 replies and 4 MiB per session, the latest reply always kept, so at most "
            f"{memory.sessions} × {mib:g} MiB = {memory.sessions * mib:g} MiB of records here."),
            "",
            "| server RSS | MiB |",
            "|---|---|",
            f"| sessions open, reset, idle | {memory.rss_idle_kib / 1024:.0f} |",
            f"| peak while stepping (sampled every 20 ms) | {memory.rss_peak_kib / 1024:.0f} |",
            f"| after {memory.steps_done} steps, every session still open | {memory.rss_end_kib / 1024:.0f} (+{grown:.0f}) |",
            "",
            ("Beyond the records, RSS holds the in-flight copies of a step (the observation, its JSON, "
            "the frame) that the allocator keeps for reuse in each thread's arena; it does not grow "
            "with the number of steps (`--steps 8` and `--steps 24` end within 30 MiB of each other). "
            f"A count-only record (16 replies) would hold {memory.sessions} × 16 × {mib:g} MiB = "
            f"{memory.sessions * 16 * mib:,.0f} MiB for the resume window."),
            "",
        ]
        if memory.errors:
            lines += ["Errors: " + "; ".join(memory.errors), ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per trivial level and hung phase")
    parser.add_argument("--levels", type=int, nargs="+", default=[256, 1024], help="trivial: sessions per level")
    parser.add_argument("--steps", type=int, default=24, help="memory: steps per session")
    parser.add_argument("--rounds", type=int, default=3, help="trivial: rounds per level (servers interleaved)")
    parser.add_argument("--procs", type=int, default=0, help="trivial: load-generator processes (0: one per core but one)")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=["asyncio"], help="trivial: every server's event loop(s)")
    parser.add_argument("--client-loop", choices=LOOPS, default="asyncio", help="trivial: the load generator's event loop")
    parser.add_argument("--out", type=Path, default=None, help="RESULTS.md to update")


def run(args: argparse.Namespace, command: str) -> None:
    raise_open_files_limit()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"envsdk-bench-core-{os.getpid()}.log"
    speed = ""
    if "trivial" in args.parts:
        sub = argparse.ArgumentParser()
        trivial.add_arguments(sub)
        trivial_args = sub.parse_args(
            ["--levels", *map(str, args.levels), "--duration", str(args.duration), "--rounds", str(args.rounds),
             "--kinds", "envsdk", "envsdk-awaited", "envsdk-inline", "openenv", "bare",
             "--loops", *args.loops, "--client-loop", args.client_loop]
            + (["--procs", str(args.procs)] if args.procs else [])
        )
        results = trivial.run(trivial_args, command)
        table = trivial.render(results, args.levels, args.duration, command, trivial_args.procs, args.client_loop)
        # The same table as `python -m bench trivial`, as a sub-section of this one.
        speed = "### Default path vs OpenEnv vs bare\n" + table.split("\n", 1)[1].split("Command:", 1)[0] + (
            "Each session" + table.split("Each session", 1)[1]
        )
    hung = run_hung(args.duration, log) if "hung" in args.parts else None
    memory = run_memory(16, args.steps, log) if "memory" in args.parts else None
    report = render(hung, memory, command) + ("\n" + speed if speed else "")
    print(report)
    if args.out:
        write_section(args.out, "## Execution core", report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench core " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
