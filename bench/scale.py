"""Scale: N concurrent sessions on one server, opened by one client process.

Each server runs in its own process. ``envsdk`` is ``envsdk serve envsdk.testing:EchoEnvironment``
exactly as a user runs it (the default path: each session's sync calls on its lane), and
``envsdk-inline`` the same command serving the same env with ``INLINE_SYNC``
(`InlineEchoEnvironment`); the other kinds are `bench.servers`' (OpenEnv, bare websockets, the
default path without waited hand-offs). This one process opens N raw WebSocket sessions,
``--concurrency`` handshakes at a time (``--open-timeout`` each, websockets' default 10 s), and
each session sends a reset as soon as it is open. Once all are open and the server's lanes have
gone idle (``lane_threads`` 0 in /health, bounded), every session sends one step. Then the
server gets SIGTERM with every session still open, and the time to its exit is measured.

Reported per server: sessions open/asked, steps answered, the open time, the server's RSS
(before the first connection, peak while opening, once all are open and idle, after the steps),
its threads at those moments, the SIGTERM-to-exit time and exit status, the first error of each
phase, the server's first log lines that are not routine, and the load average before the run.
``per session`` = (RSS idle − RSS before) / sessions open; ``minus env`` subtracts the echo
environment's own footprint (N instances built and reset in this process, measured with
tracemalloc), leaving what the server spends per idle session.

    python -m bench scale --sessions 16384 --kinds envsdk envsdk-inline
    python -m bench scale --sessions 32768 --kinds envsdk-inline
    python -m bench scale --sessions 4096 --out bench/RESULTS.md

File descriptors: the server and this process each need one per session; both raise their soft
limit to the hard one, which caps what one client process can open.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.trivial import (
    KINDS,
    REPO,
    RESET,
    STEP,
    machine_line,
    raise_open_files_limit,
    rss_kib,
    start_server,
    versions,
    wait_listening,
    write_section,
)
from envsdk.testing import EchoEnvironment

#: Served by ``envsdk serve`` itself (the command a user runs), the others by `bench.servers`.
CLI_TARGETS = {"envsdk": "envsdk.testing:EchoEnvironment", "envsdk-inline": "bench.scale:InlineEchoEnvironment"}
DEFAULT_CONCURRENCY = 256
OPEN_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 60.0
IDLE_WAIT_S = 30.0
EXIT_WAIT_S = 60.0
SAMPLE_EVERY_S = 0.25
#: Log lines of a server that say nothing about the run.
_ROUTINE = ("Started server process", "Waiting for application", "Application startup", "Uvicorn running",
            "Shutting down", "Waiting for connections", "Waiting for background", "Application shutdown",
            "Finished server process")


class InlineEchoEnvironment(EchoEnvironment):
    """The echo env with ``INLINE_SYNC``: its calls run on the event loop, no lane thread."""

    INLINE_SYNC = True


@dataclass
class ScaleResult:
    kind: str
    sessions: int
    concurrency: int
    opened: int = 0
    stepped: int = 0
    open_s: float = 0.0
    step_s: float = 0.0
    rss_before_kib: int = 0
    rss_peak_kib: int = 0
    rss_idle_kib: int = 0
    rss_stepped_kib: int = 0
    threads_peak: int = 0
    threads_idle: int = 0
    threads_stepped: int = 0
    lanes_idle: int | None = None
    exit_s: float | None = None
    exit_status: int | None = None
    load: str = ""
    errors: dict[str, int] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @property
    def per_session_kib(self) -> float:
        return (self.rss_idle_kib - self.rss_before_kib) / max(self.opened, 1)

    def fail(self, phase: str, exc: BaseException | str) -> None:
        self.errors[phase] = self.errors.get(phase, 0) + 1
        self.first_errors.setdefault(phase, (exc if isinstance(exc, str) else repr(exc))[:300])


def env_footprint_kib(n: int = 1024) -> float:
    """Python heap held by one reset `EchoEnvironment`, averaged over `n` instances."""
    gc.collect()
    tracemalloc.start()
    envs = []
    for _ in range(n):
        env = EchoEnvironment()
        env.reset()
        envs.append(env)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del envs
    return current / n / 1024


def threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_cli_server(kind: str, max_sessions: int, log: Any) -> tuple[subprocess.Popen[bytes], str]:
    """``envsdk serve`` of the echo env (`CLI_TARGETS`) on a free loopback port, its log to `log`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "MAX_CONCURRENT_ENVS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "serve", CLI_TARGETS[kind], "--port", str(port),
         "--max-concurrent-envs", str(max_sessions), "--log-level", "warning", "--no-web"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
    wait_listening(proc, port, kind)
    return proc, f"ws://127.0.0.1:{port}/ws"


async def _health(http_url: str) -> dict[str, Any] | None:
    """/health over a plain socket (one HTTP/1.0 request), None when it does not answer."""
    host, _, rest = http_url.removeprefix("http://").partition(":")
    port = int(rest.split("/")[0])
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        writer.write(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return json.loads(raw.split(b"\r\n\r\n", 1)[1])  # type: ignore[no-any-return]
    except (OSError, asyncio.TimeoutError, ValueError, IndexError):
        return None


async def run_sessions(
    url: str, proc: subprocess.Popen[bytes], result: ScaleResult, open_timeout_s: float
) -> None:
    """Open, reset, idle, step, then SIGTERM the server with every session open (see the module
    docstring); every wait bounded."""
    from websockets.asyncio.client import connect

    pid = proc.pid
    http_url = url.replace("ws://", "http://").removesuffix("/ws")
    result.rss_before_kib = rss_kib(pid)
    sockets: list[Any] = []
    slots = asyncio.Semaphore(result.concurrency)
    sampling = True

    async def sample() -> None:
        while sampling:
            result.rss_peak_kib = max(result.rss_peak_kib, rss_kib(pid))
            result.threads_peak = max(result.threads_peak, threads_of(pid))
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def open_one() -> None:
        async with slots:
            try:
                ws = await connect(url, ping_interval=None, compression=None, open_timeout=open_timeout_s,
                                   close_timeout=5)
            except Exception as exc:  # counted and reported
                result.fail("open", exc)
                return
            try:
                await ws.send(RESET)
                reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            except Exception as exc:  # counted and reported
                result.fail("reset", exc)
                await ws.close()
                return
            if not isinstance(reply, str) or not reply.startswith('{"type":"observation"'):
                result.fail("reset", str(reply)[:300])
                await ws.close()
                return
            sockets.append(ws)

    async def step_one(ws: Any) -> bool:
        async with slots:
            try:
                await ws.send(STEP)
                reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            except Exception as exc:  # counted and reported
                result.fail("step", exc)
                return False
            if not isinstance(reply, str) or not reply.startswith('{"type":"observation"'):
                result.fail("step", str(reply)[:300])
                return False
            return True

    sampler = asyncio.ensure_future(sample())
    try:
        started = time.perf_counter()
        await asyncio.gather(*(open_one() for _ in range(result.sessions)))
        result.open_s = time.perf_counter() - started
        result.opened = len(sockets)
        # Idle: wait (bounded) until the server's lanes have parked, then read its memory.
        give_up = time.monotonic() + IDLE_WAIT_S
        await asyncio.sleep(2.0)
        while time.monotonic() < give_up:
            health = await _health(http_url)
            result.lanes_idle = None if health is None else health.get("lane_threads")
            if not result.lanes_idle:
                break
            await asyncio.sleep(0.5)
        result.rss_idle_kib, result.threads_idle = rss_kib(pid), threads_of(pid)
        started = time.perf_counter()
        answered = await asyncio.gather(*(step_one(ws) for ws in sockets))
        result.step_s = time.perf_counter() - started
        result.stepped = sum(answered)
        await asyncio.sleep(1.0)
        result.rss_stepped_kib, result.threads_stepped = rss_kib(pid), threads_of(pid)
    finally:
        sampling = False
        await sampler
        # SIGTERM with every session open: how long until the server is gone.
        started = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.perf_counter() - started < EXIT_WAIT_S:
            await asyncio.sleep(0.05)
        if proc.poll() is not None:
            result.exit_s, result.exit_status = time.perf_counter() - started, proc.returncode
        await asyncio.wait_for(asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True), 60)


def _server_log(path: Path) -> list[str]:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    unusual = [line for line in lines if not any(routine in line for routine in _ROUTINE)]
    return unusual[:5] + ([f"... {len(unusual) - 5} more lines"] if len(unusual) > 5 else [])


def run_one(kind: str, sessions: int, concurrency: int, open_timeout_s: float) -> ScaleResult:
    result = ScaleResult(kind, sessions, concurrency, load=load_average())
    with tempfile.TemporaryDirectory() as folder:
        log_path = Path(folder) / "server.log"
        with open(log_path, "wb") as log:
            if kind in CLI_TARGETS:
                proc, url = start_cli_server(kind, sessions + 16, log)
            else:
                proc, url = start_server(kind, sessions + 16)
        try:
            time.sleep(0.5)
            asyncio.run(run_sessions(url, proc, result, open_timeout_s))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        result.log = _server_log(log_path) if kind in CLI_TARGETS else []
    return result


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def summary(r: ScaleResult, env_kib: float) -> str:
    exit_text = f"{r.exit_s:.1f} s (status {r.exit_status})" if r.exit_s is not None else f"not within {EXIT_WAIT_S:g} s"
    text = (
        f"{r.kind:14s} open {r.opened}/{r.sessions} in {r.open_s:.1f} s, stepped {r.stepped}/{r.opened} in "
        f"{r.step_s:.1f} s; RSS MiB before {_mib(r.rss_before_kib)}, peak {_mib(r.rss_peak_kib)}, idle "
        f"{_mib(r.rss_idle_kib)}, after steps {_mib(r.rss_stepped_kib)} ({r.per_session_kib:.1f} KiB/session, "
        f"{r.per_session_kib - env_kib:.1f} minus env); threads peak {r.threads_peak}, idle {r.threads_idle}, "
        f"after steps {r.threads_stepped}; SIGTERM -> exit {exit_text}; load before {r.load}"
    )
    for phase, count in r.errors.items():
        text += f"\n    {count} {phase} errors, first: {r.first_errors[phase]}"
    for line in r.log:
        text += f"\n    server log: {line[:200]}"
    return text


def render(results: list[ScaleResult], env_kib: float, command: str) -> str:
    lines = [
        "## Scale: sessions held by one server",
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "  ",
        (
            "One client process opens N raw WebSocket sessions "
            f"({results[0].concurrency if results else DEFAULT_CONCURRENCY} handshakes at a time), each "
            "resetting at once; once all are open and idle each sends one step; then the server gets "
            "SIGTERM with all of them open. `envsdk` is `envsdk serve` of the echo env (default path), "
            "`envsdk-inline` the same with `INLINE_SYNC`. RSS idle: all sessions open, lanes idle. The echo "
            f"environment's own footprint (tracemalloc): {env_kib:.2f} KiB per reset instance."
        ),
        "",
        (
            "| server | sessions open | steps answered | open s | RSS before / peak / idle / after steps MiB "
            "| KiB per idle session (minus env) | threads peak / idle | SIGTERM to exit s | load before | errors |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        errors = ", ".join(f"{count} {phase}" for phase, count in r.errors.items()) or "0"
        exit_text = f"{r.exit_s:.1f}" if r.exit_s is not None else f"> {EXIT_WAIT_S:g}"
        lines.append(
            f"| {r.kind} | {r.opened}/{r.sessions} | {r.stepped} | {r.open_s:.1f} | {_mib(r.rss_before_kib)} / "
            f"{_mib(r.rss_peak_kib)} / {_mib(r.rss_idle_kib)} / {_mib(r.rss_stepped_kib)} | "
            f"{r.per_session_kib:.1f} ({r.per_session_kib - env_kib:.1f}) | {r.threads_peak} / {r.threads_idle} | "
            f"{exit_text} | {r.load} | {errors} |"
        )
    firsts = [f"{r.kind} {phase}: {text}" for r in results for phase, text in r.first_errors.items()]
    if firsts:
        lines += ["", "First error per phase: " + "; ".join(firsts)]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=4096)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="handshakes in flight at once")
    parser.add_argument("--open-timeout", type=float, default=OPEN_TIMEOUT_S, help="seconds per handshake")
    parser.add_argument("--out", type=Path, default=None)


def run(args: argparse.Namespace, command: str) -> list[ScaleResult]:
    limit = raise_open_files_limit()
    if limit < args.sessions + 64:
        print(f"note: this process may open {limit} files, fewer than {args.sessions} sessions need", flush=True)
    env_kib = env_footprint_kib()
    results = []
    for kind in args.kinds:
        result = run_one(kind, args.sessions, args.concurrency, args.open_timeout)
        print(summary(result, env_kib), flush=True)
        results.append(result)
    report = render(results, env_kib, command)
    print(report)
    if args.out:
        write_section(args.out, "## Scale", report)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench scale " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
