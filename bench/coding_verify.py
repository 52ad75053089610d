"""Coding env before vs after the verifier moved out of the sandbox: one run, both checkouts.

    .venv/bin/python -m bench.coding_verify --before /tmp/before [--after DIR] [--out bench/RESULTS.md]
    .venv/bin/python -m bench.coding_verify --before /tmp/before --quick     # under a minute

`--before` and `--after` (default: this checkout) are checkouts of two commits (``git worktree
add DIR <commit>``); each serves ``python -m servers.coding`` from its own tree (``PYTHONPATH``
set to it), both with the same options: bubblewrap sandboxes, ``--max-concurrent-envs 64`` and
``--warm`` sandboxes (default 64), on 127.0.0.1, each in its own process, both alive all run.

* ``profile`` (first, no server up): in each tree's own interpreter, one episode at a time in
  process (`CodingEnvironment` on a pool with no warm sandboxes): the step's wall time and its
  parts (``metadata.tests.seconds``: the verification; the rest of ``time_s``: the code's run),
  and the floors those parts stand on: a Python start-up on the host (``-I -S``, as the
  verifier starts) and in a sandbox (``-I -S`` as the new candidate process starts, ``-I`` as
  the old test process did). Where the tree has ``envsdk.verify``: a verification whose tests
  make no call (its fixed cost: two start-ups and the hand-shake) and one making
  `RELAY_CALLS` calls (the cost of one relayed call), and the calls a HumanEval problem makes.
* ``steps``: at each number of concurrent sessions (default 1, 16, 64) every session plays
  episodes back to back (connect, reset to a HumanEval problem, one step with the canonical
  solution, which defines the entry point so the tests run, close frame): a warm-up of at
  least `--warmup` seconds and until every session ended an episode (not counted), then
  `--window` seconds: episodes/s counts the episodes that ended in the window, and their
  reset, step and verification (``metadata.tests.seconds``) times make the p50/p99.
  Meanwhile the CPU of the load generator (this process), of the server process (its own
  threads only: the sandboxes and verifiers it starts show in the machine's share) and of
  the whole machine is read from /proc.
* ``resets``: 64 (`--burst`) sessions connected, then all reset at once twice: with the pool
  full (every reset takes a warm sandbox), and again at once right after, when the pool is
  drained (each reset closes its sandbox and takes another, mostly started cold, while the pool
  refills in the background); the server's ``/health`` counts warm and cold takes.

Runs alternate between the trees (the order flips every round) and every run starts with both
pools full and refilled, so neither server's background sandbox starts land in the other's
measurement. `--quick` shrinks every size (explicit flags still win).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envsdk.testing import free_port, stop_process, wait_healthy

REPO = Path(__file__).resolve().parent.parent
MAX_CONCURRENT_ENVS = 64
#: Calls made by the profile's relay test: enough that one call's cost stands above the noise.
RELAY_CALLS = 200
#: Longest wait for one reply; far beyond any step here, so only a stuck server trips it.
REPLY_TIMEOUT_S = 120.0
#: Longest wait for both pools to be full again before a run.
REFILL_TIMEOUT_S = 180.0
#: What `--quick` changes (each still overridden by its flag).
QUICK = {"levels": [1, 4], "warmup": 1.0, "window": 3.0, "rounds": 1, "burst": 8, "warm": 8, "samples": 4}
#: What the profile's child runs: the tree first on its path, then this file by path, its
#: answer as JSON on stdout. Not ``-m bench.coding_verify`` (the tree's own ``bench`` package,
#: without this module, would come first) nor this file as a script (its folder would come
#: first, and ``bench/servers.py`` would shadow the ``servers`` package).
_PROFILE_BOOT = (
    "import json, runpy, sys; sys.path[0] = sys.argv[1]; "
    "print(json.dumps(runpy.run_path(sys.argv[2])['profile'](int(sys.argv[3]), int(sys.argv[4]))))"
)


# ---------------------------------------------------------------- measures


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (NaN when empty): with under 100 values, p99 is the maximum."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ms(values: list[float]) -> str:
    """``p50 / p99`` in milliseconds."""
    return f"{quantile(values, 0.5) * 1000:.0f} / {quantile(values, 0.99) * 1000:.0f}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`'s own threads (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot (idle and iowait are not busy)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuWindow:
    """CPU used between `start` and `stop`: of this process (the load generator), of the
    server process and of the machine."""

    server_pid: int
    wall_s: float = 0.0
    client_s: float = 0.0
    server_s: float = 0.0
    busy_share: float = 0.0
    _marks: tuple[float, float, float, int, int] = (0.0, 0.0, 0.0, 0, 0)

    def start(self) -> None:
        self._marks = (time.perf_counter(), own_cpu_seconds(), cpu_seconds(self.server_pid), *machine_jiffies())

    def stop(self) -> None:
        wall, client, server, busy, total = self._marks
        now_busy, now_total = machine_jiffies()
        self.wall_s = time.perf_counter() - wall
        self.client_s = own_cpu_seconds() - client
        self.server_s = cpu_seconds(self.server_pid) - server
        self.busy_share = (now_busy - busy) / max(now_total - total, 1)


# ---------------------------------------------------------------- servers


@dataclass(frozen=True)
class Server:
    """A coding server started from checkout `tree`, labelled `label`."""

    label: str
    tree: Path
    url: str
    pid: int
    warm: int

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"

    def pool(self) -> dict[str, Any]:
        """The sandbox pool as ``/health`` reports it (``ready``, ``taken_warm``, ``taken_cold``)."""
        with urllib.request.urlopen(self.url + "/health", timeout=10) as reply:
            sandbox: dict[str, Any] = json.loads(reply.read())["sandbox"]
        return sandbox


@contextmanager
def coding_server(label: str, tree: Path, warm: int, log: Path) -> Iterator[Server]:
    """``python -m servers.coding`` from `tree` on a free port; stopped (SIGTERM, then
    SIGKILL) when the block exits, whatever happens in it."""
    port = free_port()
    # Flags set every option; the variables that would add to them (a token) are dropped.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVSDK_", "SANDBOX_", "MAX_CONCURRENT"))}
    env.update(PYTHONPATH=str(tree), ENVSDK_WEB="0")
    command = [
        sys.executable, "-m", "servers.coding", "--port", str(port), "--sandbox", "bubblewrap",
        "--warm", str(warm), "--max-concurrent-envs", str(MAX_CONCURRENT_ENVS), "--log-level", "warning",
    ]
    with open(log, "ab") as err:
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, 90, f"the coding server of {tree} (log: {log})")
        yield Server(label, tree, url, proc.pid, warm)
    finally:
        stop_process(proc, 30)


def wait_full(servers: list[Server]) -> None:
    """Wait until every server's pool holds its `warm` sandboxes (no sandbox starting in the
    background any more). Raises TimeoutError after `REFILL_TIMEOUT_S`."""
    started = time.monotonic()
    while any(s.pool()["ready"] < s.warm for s in servers):
        if time.monotonic() - started > REFILL_TIMEOUT_S:
            raise TimeoutError(f"the sandbox pools did not refill within {REFILL_TIMEOUT_S:g} s")
        time.sleep(0.2)


# ---------------------------------------------------------------- load


async def _connect(ws_url: str) -> Any:
    from websockets.asyncio.client import connect

    return await connect(ws_url, ping_interval=None, compression=None, max_size=None, open_timeout=60)


async def _call(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    """Send `frame`, return the reply's ``data``; raises RuntimeError on an error reply."""
    await ws.send(json.dumps(frame))
    reply: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S))
    if reply.get("type") != "observation":
        raise RuntimeError(json.dumps(reply)[:300])
    data: dict[str, Any] = reply["data"]
    return data


@dataclass
class Episode:
    ended: float
    reset_s: float
    step_s: float
    episode_s: float
    tests_s: float
    passed: bool
    #: How the tests ended: the tree's ``tests.verdict`` (before it had none: "passed", "timed
    #: out" or "failed" from its flags).
    verdict: str


async def play_episode(ws_url: str, seed: int, solution: str) -> Episode:
    """Connect, reset to problem `seed`, step the canonical `solution`, send close. A
    CAPACITY_REACHED answer (the previous episode's session not yet gone) is retried."""
    started = time.perf_counter()
    while True:
        ws = await _connect(ws_url)
        try:
            try:
                reset = time.perf_counter()
                await _call(ws, {"type": "reset", "data": {"seed": seed}})
            except RuntimeError as exc:
                if "CAPACITY_REACHED" not in str(exc):
                    raise
                await asyncio.sleep(0.05)
                continue
            step = time.perf_counter()
            data = await _call(ws, {"type": "step", "data": {"code": solution}})
            stepped = time.perf_counter()
            await ws.send(json.dumps({"type": "close"}))
        finally:
            await ws.close()
        ended = time.perf_counter()
        tests = data["observation"]["metadata"].get("tests") or {}
        verdict = tests.get("verdict") or ("passed" if tests.get("passed") else "timed out" if tests.get("timed_out") else "failed")
        return Episode(ended, step - reset, stepped - step, ended - started, float(tests.get("seconds", math.nan)),
                       data.get("reward") == 1.0, str(verdict))


@dataclass
class LoadRun:
    """One tree at one number of sessions: the episodes that ended in the window."""

    label: str
    sessions: int
    round: int
    window_s: float
    cpu: CpuWindow
    episodes: list[Episode] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return len(self.episodes) / self.window_s


async def drive(server: Server, sessions: int, warmup_s: float, window_s: float, round_: int) -> LoadRun:
    """`sessions` workers play episodes back to back (see the module docstring). The window
    opens after `warmup_s` and once every worker has ended its first episode (at 64 sessions
    the first wave of resets and steps lasts several seconds), so it sees the steady state."""
    from envsdk.games.humaneval import humaneval

    problems = humaneval()
    run = LoadRun(server.label, sessions, round_, window_s, CpuWindow(server.pid))
    seeds = iter(range(1 << 30))
    ended: list[Episode] = []
    window: list[float] = []  # [opens, closes] once the warm-up is over
    warmed = asyncio.Event()
    first_ended = 0

    async def worker() -> None:
        nonlocal first_ended
        first = True
        while not window or time.perf_counter() < window[1]:
            seed = next(seeds) % len(problems)
            try:
                episode = await play_episode(server.ws_url, seed, problems[seed].solution)
                ended.append(episode)
                if not episode.passed:
                    run.errors.append(f"HumanEval/{seed}: canonical solution not rewarded ({episode.verdict})")
            except Exception as exc:  # counted and shown: a run goes on past one bad episode
                run.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            if first:
                first, first_ended = False, first_ended + 1
                if first_ended == sessions:
                    warmed.set()

    async def meter() -> None:
        await asyncio.sleep(warmup_s)
        await warmed.wait()
        opens = time.perf_counter()
        window[:] = [opens, opens + window_s]
        run.cpu.start()
        await asyncio.sleep(window_s)
        run.cpu.stop()

    await asyncio.gather(meter(), *(worker() for _ in range(sessions)))
    run.episodes = [e for e in ended if window[0] <= e.ended <= window[1]]
    return run


@dataclass
class Burst:
    """`sessions` resets at once, twice: pool full, then pool drained."""

    label: str
    round: int
    full_s: list[float] = field(default_factory=list)
    drained_s: list[float] = field(default_factory=list)
    full_cold: int = 0
    drained_cold: int = 0
    errors: list[str] = field(default_factory=list)


async def reset_burst(server: Server, sessions: int, round_: int) -> Burst:
    """Connect `sessions` sockets, then reset them all at once twice (see the module docstring)."""
    burst = Burst(server.label, round_)
    sockets: list[Any] = []

    async def reset(ws: Any, seed: int, into: list[float]) -> None:
        started = time.perf_counter()
        try:
            await _call(ws, {"type": "reset", "data": {"seed": seed}})
        except Exception as exc:  # counted and shown
            burst.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        into.append(time.perf_counter() - started)

    try:
        for _ in range(sessions):
            sockets.append(await _connect(server.ws_url))
        for into in (burst.full_s, burst.drained_s):
            cold = (await asyncio.to_thread(server.pool))["taken_cold"]
            await asyncio.gather(*(reset(ws, i, into) for i, ws in enumerate(sockets)))
            taken_cold = (await asyncio.to_thread(server.pool))["taken_cold"] - cold
            if into is burst.full_s:
                burst.full_cold = taken_cold
            else:
                burst.drained_cold = taken_cold
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return burst


# ---------------------------------------------------------------- profile (runs in a tree's interpreter)


def profile(samples: int, offset: int) -> dict[str, float]:
    """One episode at a time, in process, with the envsdk and servers of the tree first on
    ``sys.path`` (see the module docstring): the median of each part, in seconds (counts for
    the calls), on `samples` HumanEval problems from the `offset`-th of a fixed spread."""
    from envsdk.games.humaneval import humaneval
    from envsdk.sandbox import SandboxPool, make_provider
    from servers.coding.environment import CodingEnvironment
    from servers.coding.models import CodeAction

    problems = humaneval()
    seeds = [((offset + i) * 37) % len(problems) for i in range(samples)]
    parts: dict[str, list[float]] = {}

    def timed(name: str, host_cpu: bool, call: Any, *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)`, its wall time added to `name` and, with `host_cpu`, the CPU
        time of the host processes it waited for (the verifier) to `name` + ", host CPU"."""
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        result = call(*args, **kwargs)
        parts.setdefault(name, []).append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = max(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 0.0)
        if host_cpu:
            parts.setdefault(f"{name}, host CPU", []).append(cpu)
        return result

    pool = SandboxPool(make_provider("bubblewrap"), warm=0)
    env = CodingEnvironment(pool)
    try:
        for seed in seeds:
            timed("cold sandbox start (reset)", False, env.reset, seed=seed)
            observation = timed("step", True, env.step, CodeAction(code=problems[seed].solution))
            if observation.reward != 1.0:
                raise RuntimeError(f"HumanEval/{seed}: the canonical solution was not rewarded")
            tests = observation.metadata["tests"]["seconds"]
            parts.setdefault("step: verification (tests.seconds)", []).append(tests)
            parts.setdefault("step: code run (time_s - tests.seconds)", []).append(
                observation.metadata["timings"]["time_s"] - tests
            )
    finally:
        env.close()
        pool.close()
    sandbox = make_provider("bubblewrap").start()
    try:
        for _ in range(samples):
            timed("host python -I -S start", True, subprocess.run, [sys.executable, "-I", "-S", "-c", "pass"], check=True)
            timed("sandbox python3 -I -S start", False, sandbox.run, ["python3", "-I", "-S", "-c", "pass"])
            timed("sandbox python3 -I start", False, sandbox.run, ["python3", "-I", "-c", "pass"])
        try:
            from envsdk.verify import FunctionTests, verify_function
        except ImportError:  # the tree before the verifier
            pass
        else:
            program = "def f(x):\n    return x\n"
            for count in (0, RELAY_CALLS):
                check = f"def check(candidate):\n    for i in range({count}):\n        assert candidate(i) == i\n"
                tests = FunctionTests(setup="", tests=check, entry_point="f")
                for _ in range(samples):
                    verdict = timed(f"verify_function, {count} calls", True, verify_function, sandbox, program, tests, timeout_s=30)
                    if not verdict.passed:
                        raise RuntimeError(f"the relay check did not pass: {verdict}")
            for seed in seeds:
                problem = problems[seed]
                verdict = timed("verify_function, HumanEval", True, verify_function, sandbox, problem.solution, problem.function_tests)
                parts.setdefault("calls per HumanEval verification", []).append(verdict.calls)
    finally:
        sandbox.close()
    medians = {name: statistics.median(values) for name, values in parts.items()}
    if "calls per HumanEval verification" in parts:
        medians["calls per HumanEval verification, max"] = max(parts["calls per HumanEval verification"])
    return medians


def run_profile(tree: Path, samples: int, offset: int, log: Path) -> dict[str, float]:
    """`profile` in a child interpreter with `tree` first on its path; bounded to 5 minutes."""
    with open(log, "ab") as err:
        done = subprocess.run(
            [sys.executable, "-c", _PROFILE_BOOT, str(tree), str(Path(__file__).resolve()), str(samples), str(offset)],
            cwd=tree, stdout=subprocess.PIPE, stderr=err, timeout=300, check=True,
        )
    parts: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return parts


# ---------------------------------------------------------------- the run


@dataclass
class Results:
    """Everything one run measured (written with `--json`)."""

    command: str
    trees: dict[str, str]
    settings: dict[str, Any]
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    loads: list[LoadRun] = field(default_factory=list)
    bursts: list[Burst] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The tables' numbers, as JSON (seconds)."""
        steps: list[dict[str, Any]] = []
        for label, sessions, runs in self._groups():
            episodes = [e for r in runs for e in r.episodes]
            cpu_wall = sum(r.cpu.wall_s for r in runs) or math.nan
            steps.append({
                "tree": label, "sessions": sessions, "episodes": len(episodes),
                "episodes_per_s": statistics.median(r.per_s for r in runs),
                "episodes_per_s_rounds": [round(r.per_s, 2) for r in runs],
                "errors": sum(len(r.errors) for r in runs), "first_errors": [x for r in runs for x in r.errors][:3],
                **{f"{name}_{q}": quantile([getattr(e, name) for e in episodes], p)
                   for name in ("step_s", "reset_s", "episode_s", "tests_s") for q, p in (("p50", 0.5), ("p99", 0.99))},
                "client_cpu_share": sum(r.cpu.client_s for r in runs) / cpu_wall,
                "server_cpu_share": sum(r.cpu.server_s for r in runs) / cpu_wall,
                "server_cpu_s_per_episode": sum(r.cpu.server_s for r in runs) / max(len(episodes), 1),
                "machine_busy_share": statistics.mean(r.cpu.busy_share for r in runs),
            })
        resets: list[dict[str, Any]] = []
        for label in self.trees:
            mine = [b for b in self.bursts if b.label == label]
            for pool in ("full", "drained"):
                values = [v for b in mine for v in getattr(b, f"{pool}_s")]
                resets.append({
                    "tree": label, "pool": pool, "resets": len(values),
                    "cold": sum(getattr(b, f"{pool}_cold") for b in mine),
                    "p50_s": quantile(values, 0.5), "p99_s": quantile(values, 0.99),
                    # Per burst: each round's 64 resets are one event; pooled rounds would add drift.
                    "p99_over_p50_rounds": [
                        quantile(getattr(b, f"{pool}_s"), 0.99) / quantile(getattr(b, f"{pool}_s"), 0.5)
                        for b in mine if getattr(b, f"{pool}_s")
                    ],
                    "errors": sum(len(b.errors) for b in mine),
                })
        return {"steps": steps, "resets": resets, "profiles": self.profiles}

    def _groups(self) -> list[tuple[str, int, list[LoadRun]]]:
        groups: dict[tuple[str, int], list[LoadRun]] = {}
        for run in self.loads:
            groups.setdefault((run.label, run.sessions), []).append(run)
        return [(label, sessions, runs) for (label, sessions), runs in groups.items()]


def describe_tree(tree: Path) -> str:
    """`tree` and its commit, and whether tracked files differ from it (what was measured)."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True, timeout=30, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "no git commit"
    changed = ", with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{tree} ({commit}{changed})"


def measure(args: argparse.Namespace, command: str) -> Results:
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    for tree in trees.values():
        if not (tree / "servers" / "coding" / "__main__.py").exists():
            raise SystemExit(f"{tree} is not a checkout with servers/coding")
    settings = {k: getattr(args, k) for k in ("levels", "warmup", "window", "rounds", "burst", "warm", "samples")}
    results = Results(command, {k: describe_tree(v) for k, v in trees.items()}, settings)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"envsdk-bench-coding-verify-{os.getpid()}.log"
    print(f"server and profile stderr: {log}", flush=True)
    # Two halves, before-after-after-before, each on its own problems; each part is the mean of
    # the halves' medians (the largest of the maxima).
    halves: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for half, labels in enumerate((list(trees), list(trees)[::-1])):
        for label in labels:
            halves[label].append(run_profile(trees[label], max(args.samples // 2, 1), half * args.samples, log))
    for label, parts in halves.items():
        results.profiles[label] = {
            name: (max if name.endswith(", max") else statistics.mean)(p[name] for p in parts if name in p)
            for name in parts[0]
        }
        mine = results.profiles[label]
        if f"verify_function, {RELAY_CALLS} calls" in mine:
            extra = mine[f"verify_function, {RELAY_CALLS} calls"] - mine["verify_function, 0 calls"]
            mine[f"one relayed call (from 0 vs {RELAY_CALLS} calls)"] = extra / RELAY_CALLS
        print(f"profile {label}: " + ", ".join(f"{k} {v:.4g}" for k, v in results.profiles[label].items()), flush=True)
    with ExitStack() as stack:
        servers = [stack.enter_context(coding_server(label, tree, args.warm, log)) for label, tree in trees.items()]
        for round_ in range(args.rounds):
            # Before, after, then after, before: a drift over the run weighs on both alike.
            order = servers if round_ % 2 == 0 else servers[::-1]
            for sessions in args.levels:
                for server in order:
                    wait_full(servers)
                    run = asyncio.run(drive(server, sessions, args.warmup, args.window, round_))
                    results.loads.append(run)
                    print(f"round {round_} {server.label:6s} {sessions:3d} sessions: {run.per_s:5.1f} episodes/s, "
                          f"step {ms([e.step_s for e in run.episodes])} ms, client CPU {run.cpu.client_s / run.cpu.wall_s:.0%}, "
                          f"server {run.cpu.server_s / run.cpu.wall_s:.0%}, machine {run.cpu.busy_share:.0%}, "
                          f"errors {len(run.errors)}", flush=True)
            for server in order:
                wait_full(servers)
                burst = asyncio.run(reset_burst(server, args.burst, round_))
                results.bursts.append(burst)
                print(f"round {round_} {server.label:6s} {args.burst} resets at once: pool full {ms(burst.full_s)} ms "
                      f"({burst.full_cold} cold), drained {ms(burst.drained_s)} ms ({burst.drained_cold} cold), "
                      f"errors {len(burst.errors)}", flush=True)
    return results


# ---------------------------------------------------------------- report


def _ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}×" if before > 0 else "–"


def render(results: Results) -> str:
    """The RESULTS.md section."""
    from bench.trivial import machine_line, versions

    summary = results.summary()
    by = {(row["tree"], row["sessions"]): row for row in summary["steps"]}
    settings = results.settings
    lines = [
        "## Coding env: the verifier out of the sandbox, before vs after (issue 47)",
        "",
        f"Command (from the repository root): `{results.command}`  ",
        f"Trees: before {results.trees['before']}, after {results.trees['after']}  ",
        machine_line() + "  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
        (f"Both servers: `python -m servers.coding --sandbox bubblewrap --warm {settings['warm']} "
        f"--max-concurrent-envs {MAX_CONCURRENT_ENVS}`, each from its tree, on 127.0.0.1. An episode: connect, "
        "reset to a HumanEval problem, one step with the canonical solution (the tests run), close. "
        f"{settings['rounds']} round(s), trees alternated (order flipped each round), both pools full "
        f"before every run; per run at least {settings['warmup']:g} s of warm-up (until every session ended an "
        f"episode) then {settings['window']:g} s counted. "
        "Latencies pool the rounds' episodes (nearest rank: p99 of under 100 is the maximum); episodes/s is "
        "the median over rounds. Verification = `metadata.tests.seconds` (before: the test process's run "
        "in the sandbox; after: `verify_function`, both processes and the relay). CPU: the share of one "
        "core used by the load generator and by the server process (its own threads, without sandboxes and "
        "verifiers), and of the whole machine; server CPU ms/episode is the server process's own CPU time "
        "in the window over the episodes that ended in it."),
        "",
        ("| sessions | tree | episodes/s | step p50 / p99 ms | verification p50 / p99 ms | reset p50 / p99 ms "
         "| episode p50 / p99 ms | episodes | errors | load-gen CPU | server CPU | server CPU ms/episode | machine busy |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sessions in settings["levels"]:
        for label in ("before", "after"):
            row = by.get((label, sessions))
            if row is None:
                continue
            lines.append(
                f"| {sessions} | {label} | {row['episodes_per_s']:.2f} | {row['step_s_p50'] * 1000:.0f} / "
                f"{row['step_s_p99'] * 1000:.0f} | {row['tests_s_p50'] * 1000:.0f} / {row['tests_s_p99'] * 1000:.0f} | "
                f"{row['reset_s_p50'] * 1000:.0f} / {row['reset_s_p99'] * 1000:.0f} | "
                f"{row['episode_s_p50'] * 1000:.0f} / {row['episode_s_p99'] * 1000:.0f} | {row['episodes']} | "
                f"{row['errors']} | {row['client_cpu_share']:.0%} | {row['server_cpu_share']:.0%} | "
                f"{row['server_cpu_s_per_episode'] * 1000:.0f} | {row['machine_busy_share']:.0%} |"
            )
    lines += [
        "",
        ("| sessions | step p50 after/before | step p99 after/before | episodes/s after/before "
         "| verification p50 after/before | target: step p50 ≤ 1.5× before |"),
        "|---|---|---|---|---|---|",
    ]
    for sessions in settings["levels"]:
        old, new = by.get(("before", sessions)), by.get(("after", sessions))
        if old is None or new is None:
            continue
        held = "holds" if new["step_s_p50"] <= 1.5 * old["step_s_p50"] else "**misses**"
        lines.append(
            f"| {sessions} | {_ratio(new['step_s_p50'], old['step_s_p50'])} | {_ratio(new['step_s_p99'], old['step_s_p99'])} "
            f"| {_ratio(new['episodes_per_s'], old['episodes_per_s'])} | {_ratio(new['tests_s_p50'], old['tests_s_p50'])} "
            f"| {held} |"
        )
    lines += [
        "",
        (f"Sandbox start at {settings['burst']} concurrent resets: {settings['burst']} sessions connected, then all "
        "reset at once with the pool full (warm takes), and at once again right after, the pool drained (each "
        "reset closes its sandbox and takes another: started cold unless the refilling pool had one ready); "
        "client-side reset latency; p50 and p99 pool the rounds, p99 / p50 is each round's own (one burst "
        "each). Target: p99 ≤ 2× p50 in every burst of starts (drained pool; a full pool's takes start nothing)."),
        "",
        "| tree | pool | resets | of them cold | p50 ms | p99 ms | p99 / p50 per round | target | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["resets"]:
        ratios = row["p99_over_p50_rounds"]
        held = sum(r <= 2 for r in ratios)
        verdict = "holds" if held == len(ratios) else f"**misses** ({len(ratios) - held} of {len(ratios)})"
        if row["pool"] == "full":
            verdict = "– (warm takes: no start)"
        lines.append(
            f"| {row['tree']} | {row['pool']} | {row['resets']} | {row['cold']} | {row['p50_s'] * 1000:.0f} | "
            f"{row['p99_s'] * 1000:.0f} | {' / '.join(f'{r:.2f}' for r in ratios)} | {verdict} | {row['errors']} |"
        )
    profiles: dict[str, dict[str, float]] = summary["profiles"]
    names = list(dict.fromkeys(name for parts in profiles.values() for name in parts))
    lines += [
        "",
        (f"Profile: one episode at a time in process, no server; two halves of {max(settings['samples'] // 2, 1)} "
        "problems each, run before-after-after-before, each part the mean of the halves' medians (ms). "
        "`host CPU`: the user + system time of the host processes the part waited for (the verifier)."),
        "",
        "| part | before | after |",
        "|---|---|---|",
    ]
    for name in names:
        cells = []
        for label in ("before", "after"):
            value = profiles.get(label, {}).get(name)
            if value is None:
                cells.append("–")
            elif name.startswith("calls"):  # a count, not seconds
                cells.append(f"{value:g}")
            else:
                cells.append(f"{value * 1000:.1f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", type=Path, required=True, help="checkout of the commit before (git worktree)")
    parser.add_argument("--after", type=Path, default=REPO, help="checkout of the commit after (default: this one)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64], help="concurrent sessions per run")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of each run not counted")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of each run counted")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree and level, trees alternated")
    parser.add_argument("--burst", type=int, default=64, help="resets at once (at most --max-concurrent-envs)")
    parser.add_argument("--warm", type=int, default=64, help="each server's --warm")
    parser.add_argument("--samples", type=int, default=16, help="profile: episodes and start-ups per part")
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute: " + json.dumps(QUICK))
    parser.add_argument("--out", type=Path, default=None, help="RESULTS.md to update")
    parser.add_argument("--json", type=Path, default=None, help="write every number measured here")


def main(argv: list[str] | None = None) -> Results:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.coding_verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    if "--quick" in argv:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if not 1 <= args.burst <= MAX_CONCURRENT_ENVS or max(args.levels) > MAX_CONCURRENT_ENVS:
        parser.error(f"--burst and --levels must be from 1 to {MAX_CONCURRENT_ENVS}")
    if not 0 <= args.warm <= MAX_CONCURRENT_ENVS:
        parser.error(f"--warm must be from 0 to {MAX_CONCURRENT_ENVS}")
    results = measure(args, "python -m bench.coding_verify " + " ".join(argv))
    report = render(results)
    print(report, flush=True)
    if args.json:
        summary = results.summary()
        summary["settings"], summary["trees"], summary["command"] = results.settings, results.trees, results.command
        summary["runs"] = [
            {"tree": r.label, "sessions": r.sessions, "round": r.round, "episodes_per_s": r.per_s,
             "cpu": {k: getattr(r.cpu, k) for k in ("wall_s", "client_s", "server_s", "busy_share")},
             "errors": r.errors} for r in results.loads
        ]
        args.json.write_text(json.dumps(summary, indent=1, default=str))
    if args.out:
        from bench.trivial import write_section

        write_section(args.out, "## Coding env: the verifier out of the sandbox", report)
    return results


if __name__ == "__main__":
    main()
