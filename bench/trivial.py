"""Trivial-environment benchmark: envsdk vs OpenEnv vs a bare websockets server, one run.

Each server runs in its own process on 127.0.0.1; one load generator (this process, asyncio +
``websockets``) opens N sessions and has each loop ``reset, step, step, step`` for a fixed
time. Every request/reply pair counts as one step in steps/s; latency is per request.
The levels are interleaved server by server so that the machine's noise hits all three alike.

    python -m bench.trivial --levels 1 16 256 --duration 5 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import connect

from envsdk.testing import free_port

RESET = json.dumps({"type": "reset", "data": {}})
STEP = json.dumps({"type": "step", "data": {"message": "hello"}})
STEPS_PER_RESET = 3


@dataclass
class LevelResult:
    kind: str
    sessions: int
    steps: int = 0
    errors: int = 0
    completed_sessions: int = 0
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    rss_kib: int = 0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def run_level(kind: str, url: str, sessions: int, duration: float, pid: int) -> LevelResult:
    result = LevelResult(kind, sessions)
    gate = asyncio.Event()
    tasks = []
    # The stop time is set once every session is connected; sessions open in batches so that
    # the accept backlog is not what is measured.
    stop_holder = {"t": time.perf_counter() + 3600}
    for i in range(sessions):
        tasks.append(asyncio.create_task(one_session(url, stop_holder, result, gate)))
        if i % 64 == 63:
            await asyncio.sleep(0.05)
    await asyncio.sleep(min(5.0, 0.2 + sessions / 400))
    t0 = time.perf_counter()
    stop_holder["t"] = t0 + duration
    gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), duration + 120)
    result.elapsed_s = time.perf_counter() - t0
    result.rss_kib = rss_kib(pid)
    return result


async def one_session(url: str, stop_holder: dict[str, float], result: LevelResult, gate: asyncio.Event) -> None:
    try:
        async with connect(url, ping_interval=None, compression=None, max_size=2**24, open_timeout=60) as ws:
            await gate.wait()
            while time.perf_counter() < stop_holder["t"]:
                for frame in (RESET, *([STEP] * STEPS_PER_RESET)):
                    t0 = time.perf_counter()
                    await ws.send(frame)
                    reply = await asyncio.wait_for(ws.recv(), 30)
                    result.latencies_ms.append((time.perf_counter() - t0) * 1000)
                    if reply.startswith('{"type":"error"'):
                        result.errors += 1
                    else:
                        result.steps += 1
            await ws.send(json.dumps({"type": "close"}))
        result.completed_sessions += 1
    except Exception:
        result.errors += 1


def start_server(kind: str, max_sessions: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", kind, "--port", str(port), "--max-sessions", str(max_sessions)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise TimeoutError(f"{kind} server did not start")
    time.sleep(0.3)
    return proc, f"ws://127.0.0.1:{port}/ws"


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("envsdk", "openenv", "fastapi", "uvicorn", "websockets", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "?"
    return out


def render(results: list[LevelResult], levels: list[int], duration: float, command: str) -> str:
    by = {(r.kind, r.sessions): r for r in results}
    lines = [
        "## Trivial environment: envsdk vs OpenEnv vs bare websockets",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; client and servers share the cores.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "  ",
        f"Each session loops reset + {STEPS_PER_RESET} steps for {duration:g} s; every request counts as a step.",
        "",
        "| sessions | server | steps/s | p50 ms | p99 ms | errors | sessions done | server RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in levels:
        for kind in ("envsdk", "openenv", "bare"):
            r = by.get((kind, n))
            if r is None:
                continue
            lines.append(
                f"| {n} | {kind} | {r.steps_per_s:,.0f} | {r.pct(0.5):.2f} | {r.pct(0.99):.2f} | {r.errors} | "
                f"{r.completed_sessions}/{n} | {r.rss_kib / 1024:.0f} |"
            )
    lines += ["", "| sessions | envsdk / OpenEnv | envsdk / bare |", "|---|---|---|"]
    for n in levels:
        e, o, b = by.get(("envsdk", n)), by.get(("openenv", n)), by.get(("bare", n))
        if e and o and b:
            lines.append(
                f"| {n} | {e.steps_per_s / max(o.steps_per_s, 1e-9):.2f}× | {e.steps_per_s / max(b.steps_per_s, 1e-9):.2f}× |"
            )
    return "\n".join(lines) + "\n"


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) the section that starts with `heading` in RESULTS.md."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    start = text.find(heading)
    if start == -1:
        text = text.rstrip() + "\n\n" + body
    else:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + body + (text[nxt + 1 :] if nxt != -1 else "")
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--kinds", nargs="+", default=["envsdk", "openenv", "bare"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    max_sessions = max(args.levels) + 16
    servers = {kind: start_server(kind, max_sessions) for kind in args.kinds}
    results: list[LevelResult] = []
    try:
        for n in args.levels:
            for kind in args.kinds:
                proc, url = servers[kind]
                res = asyncio.run(run_level(kind, url, n, args.duration, proc.pid))
                print(
                    f"{kind:8s} n={n:5d} steps/s={res.steps_per_s:9.0f} p50={res.pct(0.5):7.2f}ms "
                    f"p99={res.pct(0.99):8.2f}ms errors={res.errors} done={res.completed_sessions}/{n}",
                    flush=True,
                )
                results.append(res)
                time.sleep(0.5)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    command = "python -m bench.trivial " + " ".join(sys.argv[1:])
    report = render(results, args.levels, args.duration, command)
    print(report)
    if args.out:
        write_section(args.out, "## Trivial environment", report)


if __name__ == "__main__":
    main()
