"""Trivial-environment benchmark: envsdk (default path and ``INLINE_SYNC``) vs OpenEnv vs a
bare websockets server.

Each server runs in its own process on 127.0.0.1 (see `bench.servers`). One load generator,
the same for all three, drives it: ``procs`` worker processes (asyncio + raw ``websockets``
client frames, no compression, no pings) share the N sessions; every session loops
``reset, step, step, step`` for a fixed time. Every request/reply pair counts as one step in
steps/s; latency is per request. Levels are interleaved server by server so that the
machine's noise hits all three alike.

Besides wall-clock steps/s (noisy on a shared machine) each row reports the server's CPU time
per step (user + system, from /proc), which depends far less on what else runs on the box, and
the server's CPU share (its CPU time over the wall time): a single-threaded server near 100 %
is saturated, so the load generator, not the server, was not the limit.

``--loops asyncio uvloop`` runs every server once per event loop (the bare server's included;
`bench.servers`), interleaved; ratios compare servers on the same loop. ``--client-loop`` picks
the load generator's.

    python -m bench trivial --levels 1 16 256 1024 4096 --duration 5 --out bench/RESULTS.md
    python -m bench trivial --levels 256 1024 --loops asyncio uvloop --rounds 2 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench.servers import LOOPS

RESET = json.dumps({"type": "reset", "data": {}})
STEP = json.dumps({"type": "step", "data": {"message": "hello"}})
CLOSE = json.dumps({"type": "close"})
STEPS_PER_RESET = 3
KINDS = ("envsdk", "envsdk-awaited", "envsdk-inline", "openenv", "bare")
DEFAULT_KINDS = ("envsdk", "envsdk-inline", "openenv", "bare")
REPO = Path(__file__).resolve().parent.parent

# Bounds of every wait in the harness, so that no run can hang.
CONNECT_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0
CONNECT_CONCURRENCY = 128


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit; return the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class LevelResult:
    """What one (server, sessions) run measured."""

    kind: str
    sessions: int
    loop: str = "asyncio"
    steps: int = 0
    errors: int = 0
    connected: int = 0
    completed_sessions: int = 0
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    rss_kib: int = 0
    server_cpu_s: float = 0.0
    loop_switches: tuple[int, int] = (0, 0)
    client_cpu_s: float = 0.0
    procs: int = 1
    round: int = 0
    first_error: str = ""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def cpu_us_per_step(self) -> float:
        return 1e6 * self.server_cpu_s / self.steps if self.steps else float("nan")

    @property
    def server_cpu_share(self) -> float:
        """The server process's CPU time over the wall time (1.0: one core busy all along)."""
        return self.server_cpu_s / self.elapsed_s if self.elapsed_s else float("nan")

    @property
    def client_cpu_share(self) -> float:
        """How busy the load generator was: its CPU time over its processes' wall time (1.0:
        every generator process used a whole core, so it, not the server, set the pace)."""
        return self.client_cpu_s / (self.elapsed_s * self.procs) if self.elapsed_s else float("nan")

    def loop_switches_per_step(self) -> str:
        """The loop thread's context switches per step: ``voluntary + involuntary`` (it blocked
        / it was preempted while runnable); 0 + 0 when the loop never had to give up its core."""
        if not self.steps:
            return "–"
        voluntary, involuntary = self.loop_switches
        return f"{voluntary / self.steps:.2f} + {involuntary / self.steps:.2f}"

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _status(path: str) -> dict[str, str]:
    """The ``name: value`` lines of a /proc status file (empty when it cannot be read)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}


def rss_kib(pid: int) -> int:
    """Resident set size of process `pid` in KiB (0 when unknown)."""
    return int(_status(f"/proc/{pid}/status").get("VmRSS", "0 kB").split()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def event_loop_of(pid: int) -> str:
    """``uvloop`` when process `pid` has uvloop's extension mapped (uvicorn and the bare server
    import it only to run on it), else ``asyncio``; with ``+httptools`` when httptools' parser is
    mapped too."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    return ("uvloop" if "/uvloop/" in maps else "asyncio") + ("+httptools" if "/httptools/" in maps else "")


def thread_switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of process `pid`'s main thread, where each
    server measured here runs its event loop ((0, 0) when unknown)."""
    status = _status(f"/proc/{pid}/task/{pid}/status")
    return int(status.get("voluntary_ctxt_switches", 0)), int(status.get("nonvoluntary_ctxt_switches", 0))


# ---------------------------------------------------------------- load generator (one process)


class _Shared:
    """Counters of one worker process's sessions (single-threaded asyncio: no locks)."""

    def __init__(self) -> None:
        self.steps = 0
        self.errors = 0
        self.connected = 0
        self.completed = 0
        self.latencies = array("d")
        self.first_error = ""
        self.stop_at = float("inf")

    def fail(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = repr(exc)[:300]


async def _session(url: str, shared: _Shared, gate: asyncio.Event, slots: asyncio.Semaphore, step: str) -> None:
    from websockets.asyncio.client import connect

    try:
        async with slots:
            ws = await connect(url, ping_interval=None, compression=None, max_size=2**24, open_timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # counted; the level reports connect failures as errors
        shared.fail(exc)
        return
    shared.connected += 1
    try:
        await gate.wait()
        perf = time.perf_counter
        latencies = shared.latencies
        frames = (RESET, *([step] * STEPS_PER_RESET))
        while perf() < shared.stop_at:
            for frame in frames:
                t0 = perf()
                await ws.send(frame)
                reply = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
                latencies.append((perf() - t0) * 1000)
                if isinstance(reply, str) and reply.startswith('{"type":"error"'):
                    shared.fail(RuntimeError(reply[:200]))
                else:
                    shared.steps += 1
        await ws.send(CLOSE)
        shared.completed += 1
    except Exception as exc:
        shared.fail(exc)
    finally:
        await ws.close()


async def _drive(url: str, sessions: int, duration: float, pipe: Connection, step: str) -> None:
    shared = _Shared()
    gate = asyncio.Event()
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    tasks = [asyncio.ensure_future(_session(url, shared, gate, slots, step)) for _ in range(sessions)]
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while shared.connected + shared.errors < sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    pipe.send(("connected", shared.connected, shared.errors))
    loop = asyncio.get_running_loop()
    go = await loop.run_in_executor(None, pipe.poll, CONNECT_TIMEOUT_S)
    if go:
        pipe.recv()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    shared.stop_at = t0 + (duration if go else 0.0)
    gate.set()
    _, pending = await asyncio.wait(tasks, timeout=duration + REPLY_TIMEOUT_S + 30)
    for task in pending:
        task.cancel()
    elapsed = time.perf_counter() - t0
    pipe.send(
        (
            "result",
            {
                "steps": shared.steps,
                "errors": shared.errors + len(pending),
                "connected": shared.connected,
                "completed": shared.completed,
                "elapsed_s": elapsed,
                "latencies": shared.latencies.tobytes(),
                "client_cpu_s": time.process_time() - cpu0,
                "first_error": shared.first_error,
            },
        )
    )


def _worker(url: str, sessions: int, duration: float, pipe: Connection, step: str, loop: str) -> None:
    raise_open_files_limit()
    if loop == "uvloop":
        import uvloop

        uvloop.run(_drive(url, sessions, duration, pipe, step))
    else:
        asyncio.run(_drive(url, sessions, duration, pipe, step))


def run_level(
    kind: str, url: str, sessions: int, duration: float, pid: int, procs: int, step: str = STEP,
    client_loop: str = "asyncio",
) -> LevelResult:
    """Drive `sessions` sessions of the server at `url` (process `pid`) for `duration` s, from
    `procs` load-generator processes running `client_loop`; every wait is bounded. `step` is the
    frame each session sends three times after each reset."""
    procs = max(1, min(procs, sessions))
    ctx = mp.get_context("spawn")
    workers = []
    for i in range(procs):
        share = sessions // procs + (1 if i < sessions % procs else 0)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(url, share, duration, child, step, client_loop), daemon=True)
        proc.start()
        workers.append((proc, parent))
    result = LevelResult(kind, sessions, procs=procs)
    try:
        for _, pipe in workers:
            if pipe.poll(CONNECT_TIMEOUT_S + 30):
                _, connected, _ = pipe.recv()
                result.connected += connected
        time.sleep(0.2)  # let the server settle after the connection burst
        cpu0, switches0 = cpu_seconds(pid), thread_switches(pid)
        for _, pipe in workers:
            pipe.send("go")
        for _, pipe in workers:
            if not pipe.poll(duration + REPLY_TIMEOUT_S + 90):
                result.errors += 1
                result.first_error = result.first_error or "a load-generator process did not report"
                continue
            _, data = pipe.recv()
            result.steps += data["steps"]
            result.errors += data["errors"]
            result.completed_sessions += data["completed"]
            result.client_cpu_s += data["client_cpu_s"]
            result.elapsed_s = max(result.elapsed_s, data["elapsed_s"])
            lat = array("d")
            lat.frombytes(data["latencies"])
            result.latencies_ms.extend(lat)
            result.first_error = result.first_error or data["first_error"]
        result.server_cpu_s = cpu_seconds(pid) - cpu0
        switches = thread_switches(pid)
        result.loop_switches = (switches[0] - switches0[0], switches[1] - switches0[1])
        result.rss_kib = rss_kib(pid)
    finally:
        for proc, _ in workers:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    return result


# ---------------------------------------------------------------- servers


def start_server(kind: str, max_sessions: int, extra_args: list[str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m bench.servers KIND`` on a free loopback port; return it and its /ws URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", kind, "--port", str(port), "--max-sessions", str(max_sessions), *(extra_args or [])],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_listening(proc, port, kind, lambda: proc.stderr.read().decode() if proc.stderr else "")
    time.sleep(0.3)
    return proc, f"ws://127.0.0.1:{port}/ws"


def wait_listening(proc: subprocess.Popen[bytes], port: int, kind: str, said: Callable[[], str] = str) -> None:
    """Wait until server `proc` (`kind`) accepts connections on `port` of 127.0.0.1, for up to
    60 s: `RuntimeError` (with what `said` returns) if it exits first, `TimeoutError` (and it is
    killed) if it never does."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode} at start: {said()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError(f"{kind} server did not start within 60 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    from envsdk.testing import stop_process

    stop_process(proc, 10)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("envsdk", "openenv", "fastapi", "uvicorn", "websockets", "pydantic", "uvloop", "httptools"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "not installed"
    return out


def machine_line() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, load average "
        f"{load:.1f} at the end of the run; load generator and servers share the cores."
    )


def _median(results: list[LevelResult]) -> LevelResult:
    """The run with the median steps/s of several rounds of one (server, loop, sessions) level."""
    median = statistics.median_low(r.steps_per_s for r in results)
    return next(r for r in results if r.steps_per_s == median)


def _ratio(values: list[float]) -> str:
    median = statistics.median_low(values)
    if len(values) == 1:
        return f"{median:.2f}×"
    return f"{median:.2f}× ({min(values):.2f}–{max(values):.2f})"


def _ratios(mine: list[LevelResult], others: list[LevelResult], measure: str) -> str:
    """Median (min–max) over the rounds of mine / other's steps/s (`measure` "steps"), p50 or
    p99 latency ("p50", "p99": other's over mine, so that above 1 is better for mine too) or CPU
    per step ("cpu"), each round against the same round's other server."""
    by_round = {r.round: r for r in others}
    values: list[float] = []
    for e in mine:
        o = by_round.get(e.round)
        if o is None or not o.steps or not e.steps:
            continue
        if measure == "steps":
            values.append(e.steps_per_s / max(o.steps_per_s, 1e-9))
        elif measure == "cpu":
            values.append(e.cpu_us_per_step / o.cpu_us_per_step)
        else:
            q = 0.5 if measure == "p50" else 0.99
            values.append(o.pct(q) / max(e.pct(q), 1e-9))
    return _ratio(values) if values else "–"


Key = tuple[str, str, int]
"""(server kind, event loop, sessions)."""


def render(
    results: list[LevelResult], levels: list[int], duration: float, command: str, procs: int, client_loop: str = "asyncio"
) -> str:
    runs: dict[Key, list[LevelResult]] = {}
    for r in results:
        runs.setdefault((r.kind, r.loop, r.sessions), []).append(r)
    loops = [loop for loop in LOOPS if any(r.loop == loop for r in results)]
    rounds = max((len(v) for v in runs.values()), default=1)
    by = {key: _median(value) for key, value in runs.items()}
    lines = [
        "## Trivial environment: envsdk vs OpenEnv vs bare websockets",
        "",
        (
            "`envsdk` is the default path (a plain sync env: each session's calls on its lane thread); "
            "`envsdk-awaited` the same with `lane_wait_s=0` (the loop never waits for a lane's call); "
            "`envsdk-inline` the same env with `INLINE_SYNC` (calls on the event loop)."
        ),
        "",
        f"Command: `{command}`  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "  ",
        f"Each session loops reset + {STEPS_PER_RESET} steps for {duration:g} s from {procs} load-generator "
        "process(es) (raw `websockets` client, no compression); every request counts as a step. "
        "`server CPU µs/step` is the server process's user+system time divided by the steps; "
        "`server CPU` is that time over the wall time (100 %: one core busy throughout; the bare server "
        "and the loop of the others are one thread, so near 100 % means the server, not the load "
        "generator, set the pace); "
        "`load-gen CPU` is the generator's CPU time over its wall time per process; `loop switches/step` "
        "counts the context switches of the server's event-loop thread per step, voluntary + involuntary "
        "(it blocked, or it was preempted while runnable: each is a trip through the kernel that a loop "
        "with work never needs). "
        f"Event loop of every server, bare included: {' and '.join(loops)}; of the load generator: {client_loop}."
        + (
            f" {rounds} rounds, servers interleaved within each round; each row is the round with the "
            "median steps/s, the ratios are medians of the per-round ratios (min–max)."
            if rounds > 1
            else ""
        ),
        "",
        "| sessions | server | loop | steps/s | p50 ms | p99 ms | errors | sessions done | server CPU µs/step "
        "| server CPU | load-gen CPU | loop switches/step | server RSS MiB |"
        + (" steps/s per round |" if rounds > 1 else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if rounds > 1 else ""),
    ]
    for n in levels:
        for loop in loops:
            for kind in KINDS:
                if (kind, loop, n) not in by:
                    continue
                r = by[(kind, loop, n)]
                row = (
                    f"| {n} | {kind} | {loop} | {r.steps_per_s:,.0f} | {r.pct(0.5):.2f} | {r.pct(0.99):.2f} | {r.errors} | "
                    f"{r.completed_sessions}/{n} | {r.cpu_us_per_step:.0f} | {100 * r.server_cpu_share:.0f} % | "
                    f"{100 * r.client_cpu_share:.0f} % | {r.loop_switches_per_step()} | {r.rss_kib / 1024:.0f} |"
                )
                if rounds > 1:
                    per_round = sorted(runs[(kind, loop, n)], key=lambda x: x.round)
                    row += " " + " / ".join(f"{x.steps_per_s:,.0f}" for x in per_round) + " |"
                lines.append(row)
    lines += [
        "",
        (
            "Ratios on the same event loop (steps/s: mine / other's; p50 and p99: other's / mine, so above 1 "
            "is better for envsdk in every column; CPU per step: mine / other's):"
        ),
        "",
        (
            "| sessions | envsdk server | loop | / OpenEnv steps/s | / OpenEnv p50 | / OpenEnv p99 | / bare steps/s "
            "| / bare p50 | / bare p99 | / bare CPU per step |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in levels:
        for loop in loops:
            for kind in ("envsdk", "envsdk-awaited", "envsdk-inline"):
                if (kind, loop, n) not in runs:
                    continue
                mine = runs[(kind, loop, n)]
                oe, bare = runs.get(("openenv", loop, n), []), runs.get(("bare", loop, n), [])
                lines.append(
                    f"| {n} | {kind} | {loop} | {_ratios(mine, oe, 'steps')} | {_ratios(mine, oe, 'p50')} | "
                    f"{_ratios(mine, oe, 'p99')} | {_ratios(mine, bare, 'steps')} | {_ratios(mine, bare, 'p50')} | "
                    f"{_ratios(mine, bare, 'p99')} | {_ratios(mine, bare, 'cpu')} |"
                )
    if len(loops) > 1:
        lines += [
            "",
            "uvloop over asyncio, per server (steps/s, median of the per-round ratios):",
            "",
            "| sessions | server | uvloop / asyncio steps/s |",
            "|---|---|---|",
        ]
        for n in levels:
            for kind in KINDS:
                if (kind, "uvloop", n) in runs and (kind, "asyncio", n) in runs:
                    ratio = _ratios(runs[(kind, "uvloop", n)], runs[(kind, "asyncio", n)], "steps")
                    lines.append(f"| {n} | {kind} | {ratio} |")
    errors = [f"{r.kind}/{r.loop}@{r.sessions}: {r.first_error}" for r in results if r.first_error]
    if errors:
        lines += ["", "First error per failing run: " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) the section of RESULTS.md whose heading starts with `heading`."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    start = text.find(heading)
    if start == -1:
        text = text.rstrip() + "\n\n" + body
    else:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + body + ("\n" + text[nxt + 1 :] if nxt != -1 else "")
    path.write_text(text)


def default_procs() -> int:
    """Load-generator processes: one core is left to the server."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 256, 1024, 4096])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per level")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(DEFAULT_KINDS))
    parser.add_argument("--procs", type=int, default=default_procs(), help="load-generator processes")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every level this often (servers interleaved)")
    parser.add_argument(
        "--loops", nargs="+", choices=LOOPS, default=["asyncio"],
        help="event loop(s) of every server, bare included; each server runs once per loop",
    )
    parser.add_argument("--client-loop", choices=LOOPS, default="asyncio", help="the load generator's event loop")
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for bench.servers (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="RESULTS.md to update")


def run(args: argparse.Namespace, command: str) -> list[LevelResult]:
    raise_open_files_limit()
    max_sessions = max(args.levels) + 16
    results: list[LevelResult] = []
    servers: dict[tuple[str, str], tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for loop in args.loops:
            for kind in args.kinds:
                extra = ["--loop", loop, *(args.server_arg if kind.startswith("envsdk") else [])]
                servers[(kind, loop)] = proc, url = start_server(kind, max_sessions, extra)
                if event_loop_of(proc.pid).split("+")[0] != loop:
                    stop_server(proc)
                    raise RuntimeError(f"the {kind} server did not start on {loop}: {event_loop_of(proc.pid)}")
        for rnd in range(max(1, args.rounds)):
            for n in args.levels:
                for loop in args.loops:
                    for kind in args.kinds:
                        proc, url = servers[(kind, loop)]
                        res = run_level(kind, url, n, args.duration, proc.pid, args.procs, client_loop=args.client_loop)
                        res.round, res.loop = rnd, loop
                        print(
                            f"{kind:14s} {loop:7s} n={n:5d} steps/s={res.steps_per_s:9.0f} p50={res.pct(0.5):7.2f}ms "
                            f"p99={res.pct(0.99):8.2f}ms cpu/step={res.cpu_us_per_step:6.0f}us "
                            f"server cpu={100 * res.server_cpu_share:3.0f}% load-gen cpu={100 * res.client_cpu_share:3.0f}% "
                            f"loop switches/step={res.loop_switches_per_step()} errors={res.errors} "
                            f"done={res.completed_sessions}/{n} {res.first_error[:120]}",
                            flush=True,
                        )
                        results.append(res)
                        time.sleep(0.5)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    report = render(results, args.levels, args.duration, command, args.procs, args.client_loop)
    print(report)
    if args.out:
        write_section(args.out, "## Trivial environment", report)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench trivial " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
