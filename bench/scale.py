"""Memory per idle session: N sessions held open, server RSS before and after.

Each server (own process, `bench.servers`) gets N raw WebSocket sessions from this process;
each session sends one ``reset`` (so its env exists and holds an episode) and then stays idle.
The server's RSS is read before the first connection and once all N are open and settled.
``per session`` = (after − before) / N; ``minus env`` subtracts the echo environment's own
footprint (N instances built and reset in this process, measured with tracemalloc), leaving
what the server itself spends per session: socket buffers, protocol objects, session record.

    python -m bench scale --sessions 4096 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from bench.trivial import (
    CONNECT_TIMEOUT_S,
    KINDS,
    REPLY_TIMEOUT_S,
    RESET,
    machine_line,
    raise_open_files_limit,
    rss_kib,
    start_server,
    stop_server,
    versions,
    write_section,
)

CONNECT_CONCURRENCY = 128
SETTLE_S = 2.0


@dataclass
class IdleResult:
    kind: str
    sessions: int
    opened: int
    rss_before_kib: int
    rss_after_kib: int
    errors: int
    first_error: str

    @property
    def per_session_kib(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / max(self.opened, 1)


def env_footprint_kib(n: int = 1024) -> float:
    """Python heap held by one reset `EchoEnvironment`, averaged over `n` instances."""
    from envsdk.testing import EchoEnvironment

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


async def hold_idle(url: str, sessions: int, pid: int) -> IdleResult:
    """Open `sessions` sessions, reset each once, measure the server's RSS, close them all."""
    from websockets.asyncio.client import connect

    before = rss_kib(pid)
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    sockets = []
    errors = 0
    first_error = ""

    async def open_one() -> None:
        nonlocal errors, first_error
        try:
            async with slots:
                ws = await connect(url, ping_interval=None, compression=None, open_timeout=CONNECT_TIMEOUT_S)
                sockets.append(ws)
                await ws.send(RESET)
                reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
                if isinstance(reply, str) and reply.startswith('{"type":"error"'):
                    raise RuntimeError(reply[:200])
        except Exception as exc:  # counted and reported
            errors += 1
            first_error = first_error or repr(exc)[:300]

    try:
        await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(sessions))), CONNECT_TIMEOUT_S * 2)
        await asyncio.sleep(SETTLE_S)
        after = rss_kib(pid)
    finally:
        await asyncio.wait_for(
            asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True), CONNECT_TIMEOUT_S
        )
    return IdleResult("", sessions, len(sockets) - errors, before, after, errors, first_error)


def render(results: list[IdleResult], env_kib: float, command: str) -> str:
    lines = [
        "## Scale: memory per idle session",
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "  ",
        "N raw WebSocket sessions, each reset once then idle; server RSS before the first "
        f"connection and {SETTLE_S:g} s after the last. The echo environment's own footprint, "
        f"measured with tracemalloc: {env_kib:.2f} KiB per reset instance.",
        "",
        "| server | sessions open | RSS before MiB | RSS after MiB | KiB per session | KiB per session minus env | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.kind} | {r.opened}/{r.sessions} | {r.rss_before_kib / 1024:.0f} | {r.rss_after_kib / 1024:.0f} | "
            f"{r.per_session_kib:.1f} | {r.per_session_kib - env_kib:.1f} | {r.errors} |"
        )
    errors = [f"{r.kind}: {r.first_error}" for r in results if r.first_error]
    if errors:
        lines += ["", "First error per failing run: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=4096)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--out", type=Path, default=None)


def run(args: argparse.Namespace, command: str) -> list[IdleResult]:
    raise_open_files_limit()
    env_kib = env_footprint_kib()
    results = []
    for kind in args.kinds:
        proc, url = start_server(kind, args.sessions + 16)
        try:
            time.sleep(0.5)
            res = asyncio.run(hold_idle(url, args.sessions, proc.pid))
        finally:
            stop_server(proc)
        res.kind = kind
        print(
            f"{kind:8s} idle sessions={res.opened}/{res.sessions} rss {res.rss_before_kib / 1024:.0f} -> "
            f"{res.rss_after_kib / 1024:.0f} MiB, {res.per_session_kib:.1f} KiB/session "
            f"({res.per_session_kib - env_kib:.1f} minus env) errors={res.errors} {res.first_error[:120]}",
            flush=True,
        )
        results.append(res)
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
