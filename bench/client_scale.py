"""Client-side scale: one process, envsdk's `EnvClient`, thousands of sessions.

One envsdk echo server runs in its own process (`bench.servers`); this process opens N
`EnvClient` sessions (the real client: session handshake, request ids, resume on) and has each
loop ``reset, step, step, step`` for a fixed time. Reported per level: steps/s, p50/p99 per
request, errors, and the client's CPU time per step (this process: user + system), which shows
whether the client's cost per step grows with the number of sessions (it should not).

    python -m bench client --levels 256 2048 --duration 5 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.trivial import (
    CONNECT_TIMEOUT_S,
    REPLY_TIMEOUT_S,
    STEPS_PER_RESET,
    cpu_seconds,
    machine_line,
    raise_open_files_limit,
    start_server,
    stop_server,
    versions,
    write_section,
)
from envsdk.client import EnvClient
from envsdk.client.config import Keepalive, Timeouts
from envsdk.client.transports import WebSocketTransport

CONNECT_CONCURRENCY = 128


@dataclass
class ClientLevel:
    """What one level measured."""

    sessions: int
    compression: str | None
    steps: int = 0
    errors: int = 0
    connected: int = 0
    completed: int = 0
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    first_error: str = ""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s else 0.0

    def per_step_us(self, seconds: float) -> float:
        return 1e6 * seconds / self.steps if self.steps else float("nan")

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def fail(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = repr(exc)[:300]


async def run_level(url: str, sessions: int, duration: float, server_pid: int, compression: str | None) -> ClientLevel:
    """`sessions` EnvClients against `url` for `duration` s; every wait bounded."""
    result = ClientLevel(sessions, compression)
    transport = WebSocketTransport(compression=compression)
    timeouts = Timeouts(connect=CONNECT_TIMEOUT_S, request=REPLY_TIMEOUT_S)
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    gate = asyncio.Event()
    stop = {"at": float("inf")}

    async def one() -> None:
        client = EnvClient(url, transport=transport, timeouts=timeouts, keepalive=Keepalive())
        try:
            async with slots:
                await client.connect()
            result.connected += 1
            await gate.wait()
            perf = time.perf_counter
            latencies = result.latencies_ms
            while perf() < stop["at"]:
                t0 = perf()
                await client.reset()
                latencies.append((perf() - t0) * 1000)
                result.steps += 1
                for _ in range(STEPS_PER_RESET):
                    t0 = perf()
                    await client.step({"message": "hello"})
                    latencies.append((perf() - t0) * 1000)
                    result.steps += 1
            result.completed += 1
        except Exception as exc:  # counted and reported with the level
            result.fail(exc)
        finally:
            await client.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(sessions)]
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while result.connected + result.errors < sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    cpu0, server_cpu0 = time.process_time(), cpu_seconds(server_pid)
    t0 = time.perf_counter()
    stop["at"] = t0 + duration
    gate.set()
    _, pending = await asyncio.wait(tasks, timeout=duration + REPLY_TIMEOUT_S + 30)
    result.elapsed_s = time.perf_counter() - t0
    result.client_cpu_s = time.process_time() - cpu0
    result.server_cpu_s = cpu_seconds(server_pid) - server_cpu0
    for task in pending:
        task.cancel()
        result.fail(TimeoutError("a session did not finish in time"))
    if pending:
        await asyncio.wait(pending, timeout=10)
    return result


def render(results: list[ClientLevel], duration: float, command: str) -> str:
    lines = [
        "## Client scale: one process, envsdk EnvClient",
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "  ",
        f"One envsdk echo server (own process); this process runs N `EnvClient` sessions (handshake, "
        f"request ids, resume on), each looping reset + {STEPS_PER_RESET} steps for {duration:g} s. "
        "`client CPU µs/step`: this process's user+system time per step.",
        "",
        "| sessions | compression | steps/s | p50 ms | p99 ms | errors | sessions done | client CPU µs/step | server CPU µs/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.sessions} | {r.compression or 'off'} | {r.steps_per_s:,.0f} | {r.pct(0.5):.2f} | {r.pct(0.99):.2f} | "
            f"{r.errors} | {r.completed}/{r.sessions} | {r.per_step_us(r.client_cpu_s):.0f} | {r.per_step_us(r.server_cpu_s):.0f} |"
        )
    ratios = []
    for comp in dict.fromkeys(r.compression for r in results):
        level = [r for r in results if r.compression == comp]
        base = min(level, key=lambda r: r.sessions)
        for r in level:
            if r is not base and base.steps_per_s and base.steps:
                ratios.append(
                    f"{r.sessions} vs {base.sessions} sessions ({comp or 'no compression'}): steps/s ratio "
                    f"{r.steps_per_s / base.steps_per_s:.2f}, client CPU per step ratio "
                    f"{r.per_step_us(r.client_cpu_s) / base.per_step_us(base.client_cpu_s):.2f}"
                )
    if ratios:
        lines += [""] + [f"- {line}" for line in ratios]
    errors = [f"{r.sessions}: {r.first_error}" for r in results if r.first_error]
    if errors:
        lines += ["", "First error per failing level: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--levels", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument(
        "--compression", nargs="+", choices=["deflate", "off"], default=["off"],
        help="client compression setting(s) to measure (the server accepts deflate)",
    )
    parser.add_argument("--out", type=Path, default=None)


def run(args: argparse.Namespace, command: str) -> list[ClientLevel]:
    raise_open_files_limit()
    proc, url = start_server("envsdk", max(args.levels) + 16)
    results = []
    try:
        for comp in args.compression:
            for n in args.levels:
                compression = None if comp == "off" else comp
                res = asyncio.run(run_level(url.replace("/ws", ""), n, args.duration, proc.pid, compression))
                print(
                    f"client n={n:5d} compression={comp:7s} steps/s={res.steps_per_s:8.0f} p50={res.pct(0.5):7.2f}ms "
                    f"p99={res.pct(0.99):8.2f}ms client cpu/step={res.per_step_us(res.client_cpu_s):5.0f}us "
                    f"server cpu/step={res.per_step_us(res.server_cpu_s):5.0f}us errors={res.errors} "
                    f"done={res.completed}/{n} {res.first_error[:120]}",
                    flush=True,
                )
                results.append(res)
                time.sleep(0.5)
    finally:
        stop_server(proc)
    report = render(results, args.duration, command)
    print(report)
    if args.out:
        write_section(args.out, "## Client scale", report)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench client " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
