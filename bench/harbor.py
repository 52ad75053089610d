"""``python -m bench.harbor``: Harbor task containers (podman) beside bubblewrap sandboxes, one run.

    .venv/bin/python -m bench.harbor                        # the full run (several minutes on 2 cores)
    .venv/bin/python -m bench.harbor --quick                # under a minute: every row, small sizes
    .venv/bin/python -m bench.harbor --concurrency 1,16,64 --rounds 5 --calls 300 --json out.json

Two servers run on 127.0.0.1, each in its own process, both alive all run: the Harbor server
(``python -m servers.harbor --tasks DIR``, podman containers of the tasks' images, built or
found in the image cache before the run) and the coding server (``python -m servers.coding
--sandbox bubblewrap --warm 0``: no warm pool, so each of its resets starts a sandbox, as each
Harbor reset starts a container). Clients are envsdk's async `EnvClient` in this process.

* start: at each `--concurrency` level N, N sessions connect, then reset all at once (each
  reset starts a container, or a bubblewrap sandbox); a reset's latency is measured at the
  client. `--rounds` bursts a level, the two servers alternated (the order flips every round);
  between bursts every session is closed and the run waits until its container or sandbox is
  gone. p50 and p99 pool a level's rounds (nearest rank: under 100 values p99 is the maximum).
  The Harbor server spaces container creations (its provider's ``starts_per_s``, 8 by
  default): at 64 concurrent resets that spacing, not podman, sets most of the p99.
* tool round trip over the wire: one session, `--calls` calls back to back after a warm-up:
  the ``bash`` tool running ``true`` in a warm container (the step action, then MCP
  ``tools/call``) beside the coding server's step and ``run_python`` tool running ``pass``.
* no wire: the container provider's ``bash("true")`` (the shell kept running in the
  container), ``podman exec ID true`` (a process per call: the naive way, `--exec-calls`
  calls), and the bubblewrap provider's ``run(["true"])``, all in this process.
* verify: for each task of `--tasks` (or those named by `--verify-tasks`), one episode on the
  Harbor server: reset, the task's oracle (``solution/`` written and ``solve.sh`` run through
  the tools, as ``envsdk rollout --policy oracle`` does), then ``submit``, whose step runs
  the verifier. Reported: the verifier's own seconds (``metadata.timings.verifier_s``: the
  check of what the agent changed, which stops its processes, fresh ``/logs/verifier``, copy
  ``tests/`` in, ``test.sh``, read the reward), the submit step at the client, and the
  oracle's run. Every task must score 1.0.

The round trips and the verify episodes run first, the start bursts last (a burst of 64
leaves the machine busy for a while). Each table row says the 1-minute load average when its
measurement began; the load averages at the run's start and end head the table.

Nothing is written unless `--json` (the figures) or `--log` (the servers' stderr) is given. Every container the run starts is removed at
its end (the servers are stopped with SIGTERM; any container of theirs or of this process
still there is then removed and counted). Needs root, podman with the base images
(``bash scripts/setup_containers.sh``) and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.coding_verify import quantile
from envsdk import EnvClient
from envsdk.client.config import Timeouts
from envsdk.policies.harbor import HarborOraclePolicy
from envsdk.sandbox.bubblewrap import BubblewrapProvider
from envsdk.sandbox.container import (
    LABEL,
    OWNER_LABEL,
    ContainerEngine,
    ContainerProvider,
)
from envsdk.testing import free_port, stop_process, wait_healthy
from servers.coding.environment import MAX_STEPS_LIMIT as CODING_MAX_STEPS
from servers.harbor.environment import MAX_STEPS_LIMIT, HarborLimits
from servers.harbor.tasks import HarborTask, load_tasks

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "servers" / "harbor" / "tasks"
#: The task whose image the start and round-trip figures use (a Debian base, a small image).
TASK = "log-error-summary"
#: Host memory one open container costs at least (its ``podman exec -i`` client, about 33 MB,
#: plus conmon and the container's own shell), with room to spare: checked before a run.
HOST_MB_PER_CONTAINER = 64
#: Longest wait for one reply: far beyond any reset or step here, so only a stuck server trips it.
REPLY_TIMEOUT_S = 600.0
#: Longest wait for a burst's containers or sandboxes to be gone, and for a server to start
#: (the Harbor server builds any image not in the cache first).
SETTLE_TIMEOUT_S = 180.0
START_TIMEOUT_S = 900.0
#: Calls before each round-trip series, not counted.
WARMUP_CALLS = 20
#: Most tool calls of one episode each server allows (a reset option).
HARBOR_STEPS = MAX_STEPS_LIMIT
CODING_STEPS = CODING_MAX_STEPS
#: What `--quick` changes (each still overridden by its flag).
QUICK = {"concurrency": [1, 4], "rounds": 1, "calls": 30, "exec_calls": 3, "verify_tasks": [TASK]}


# ---------------------------------------------------------------- measures


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


@dataclass
class Figure:
    """One row's samples for each side (seconds); ``None`` where a side has no such figure."""

    what: str
    container: list[float] | None
    bubblewrap: list[float] | None
    errors: int = 0
    #: The machine's 1-minute load average when the figure's measurement began.
    load: float = 0.0

    def cells(self, unit: float) -> list[str]:
        out: list[str] = []
        for values in (self.container, self.bubblewrap):
            if values is None:
                out += ["–", "–"]
            else:
                out += [f"{quantile(values, 0.5) * unit:.2f}", f"{quantile(values, 0.99) * unit:.2f}"]
        return out

    def summary(self) -> dict[str, Any]:
        def side(values: list[float] | None) -> dict[str, Any] | None:
            if values is None:
                return None
            return {"n": len(values), "p50_s": quantile(values, 0.5), "p99_s": quantile(values, 0.99)}

        return {"what": self.what, "container": side(self.container), "bubblewrap": side(self.bubblewrap),
                "errors": self.errors, "load": self.load}


@dataclass
class TaskVerify:
    """One task's oracle episode: seconds of the oracle's run, the verifier (server side), the
    submit step (client side), and the reward."""

    task: str
    base: str
    oracle_s: float
    verifier_s: float
    submit_s: float
    reward: float


@dataclass
class Run:
    figures: list[Figure] = field(default_factory=list)
    verifies: list[list[TaskVerify]] = field(default_factory=list)
    left_behind: int = 0
    load_start: str = ""
    load_end: str = ""
    verify_load: float = 0.0
    mem_available_mb: int = 0


# ---------------------------------------------------------------- servers


@dataclass(frozen=True)
class Server:
    label: str
    url: str
    pid: int

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/health", timeout=30) as reply:
            found: dict[str, Any] = json.loads(reply.read())
        return found


@contextmanager
def server(label: str, command: list[str], log: Path) -> Iterator[Server]:
    """`command` (a ``python -m servers.X`` line; ``--port`` is added) on a free port, in its
    own process; stopped (SIGTERM, then SIGKILL) when the block exits, whatever happens in it."""
    port = free_port()
    # The flags set every option; a token in this environment would lock this run's clients out.
    env = {k: v for k, v in os.environ.items() if k not in ("ENVSDK_TOKEN", "MAX_CONCURRENT_ENVS")}
    env.update(PYTHONPATH=str(REPO), ENVSDK_WEB="0")
    with open(log, "ab") as err:
        proc = subprocess.Popen([*command, "--port", str(port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, START_TIMEOUT_S, f"{label} server (log: {log})")
        yield Server(label, url, proc.pid)
    finally:
        stop_process(proc, 60)


def owned_containers(engine: ContainerEngine, pids: set[int]) -> list[str]:
    """Ids of envsdk containers whose owner is one of `pids` (a server of this run, or this process)."""
    listed = engine.call(
        ["ps", "-a", "--filter", f"label={LABEL}=1", "--format", "{{.ID}} {{json .Labels}}"], timeout=60,
    )
    found = []
    for line in listed.stdout.decode().splitlines():
        container_id, _, raw = line.partition(" ")
        labels = json.loads(raw) if raw.strip() else {}
        owner = str(labels.get(OWNER_LABEL, "")) if isinstance(labels, dict) else ""
        if owner.split(":", 1)[0] in {str(pid) for pid in pids}:
            found.append(container_id)
    return found


def settle(target: Server, engine: ContainerEngine | None) -> None:
    """Wait until `target` has no session open and (with `engine`: the Harbor server) none of
    its containers is left, so the next burst starts on a quiet server."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while target.health().get("active_sessions", 0) or (engine is not None and owned_containers(engine, {target.pid})):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {target.label} server still had sessions or containers after {SETTLE_TIMEOUT_S:g} s")
        time.sleep(0.3)


# ---------------------------------------------------------------- the wire


def client(url: str) -> EnvClient:
    # No resend: a reset sent twice would start two containers and muddle the figure.
    return EnvClient(url, timeouts=Timeouts(connect=60.0, request=REPLY_TIMEOUT_S, close=30.0), resume=False)


async def burst(url: str, sessions: int, reset: dict[str, Any]) -> tuple[list[float], int]:
    """`sessions` clients connect, then reset at once; each reset's seconds, and the errors."""
    clients = [client(url) for _ in range(sessions)]
    try:
        await asyncio.gather(*(c.connect() for c in clients))

        async def timed(c: EnvClient) -> float:
            started = time.perf_counter()
            await c.reset(**reset)
            return time.perf_counter() - started

        results = await asyncio.gather(*(timed(c) for c in clients), return_exceptions=True)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    times = [r for r in results if isinstance(r, float)]
    for error in (r for r in results if isinstance(r, BaseException)):
        print(f"  reset error: {type(error).__name__}: {error}", file=sys.stderr)
    return times, len(results) - len(times)


async def round_trips(
    url: str, reset: dict[str, Any], calls: int, call: Callable[[EnvClient], Awaitable[None]], per_episode: int,
) -> list[float]:
    """One session: reset, `WARMUP_CALLS` calls, then `calls` timed ones; their seconds. A
    server whose episodes allow fewer calls is reset again (not timed) every `per_episode`
    calls, and two calls after each such reset are not timed either."""
    async with client(url) as env:
        await env.reset(**reset)
        for _ in range(min(WARMUP_CALLS, per_episode - 1)):
            await call(env)
        made = min(WARMUP_CALLS, per_episode - 1)
        times: list[float] = []
        while len(times) < calls:
            if made == per_episode:
                await env.reset(**reset)
                for _ in range(2):
                    await call(env)
                made = 2
            started = time.perf_counter()
            await call(env)
            times.append(time.perf_counter() - started)
            made += 1
    return times


async def bash_step(env: EnvClient) -> None:
    result = await env.step({"tool": "bash", "command": "true"})
    if result.observation["exit_code"] != 0 or result.done:
        raise RuntimeError(f"bash true answered {result.observation!r}")


async def bash_tool(env: EnvClient) -> None:
    # The MCP tool says so when a command printed nothing.
    if (text := await env.call_tool("bash", command="true")) not in ("", "[no output]"):
        raise RuntimeError(f"bash true answered {text!r}")


async def code_step(env: EnvClient) -> None:
    result = await env.step({"code": "pass"})
    if result.observation["exit_code"] != 0:
        raise RuntimeError(f"pass answered {result.observation!r}")


async def code_tool(env: EnvClient) -> None:
    await env.call_tool("run_python", code="pass")


async def oracle_episode(url: str, task: HarborTask, policy: HarborOraclePolicy, base: str) -> TaskVerify:
    """Reset to `task`, run its oracle's calls, submit; the seconds of each part."""
    async with client(url) as env:
        first = await env.reset(task=task.name)
        calls = policy.calls([{"role": "user", "content": first.observation["text"]}])
        *work, (last, _) = calls
        if last != "submit":
            raise RuntimeError(f"task {task.name}: the oracle's last call is {last!r}, not submit")
        started = time.perf_counter()
        for name, arguments in work:
            await env.step({"tool": name, **arguments})
        oracle_s = time.perf_counter() - started
        started = time.perf_counter()
        done = await env.step({"tool": "submit"})
        submit_s = time.perf_counter() - started
    if not done.done or done.reward is None:
        raise RuntimeError(f"task {task.name}: submit did not end the episode: {done.observation!r}")
    verifier_s = (done.observation["metadata"].get("timings") or {}).get("verifier_s")
    if verifier_s is None:
        raise RuntimeError(f"task {task.name}: the submit step's metadata has no timings.verifier_s")
    return TaskVerify(task.name, base, oracle_s, float(verifier_s), submit_s, float(done.reward))


# ---------------------------------------------------------------- no wire


def provider_round_trips(task: HarborTask, calls: int, exec_calls: int) -> tuple[list[float], list[float], list[float]]:
    """Container ``bash("true")`` and ``podman exec true`` (the task's image, its limits), and
    bubblewrap's ``run(["true"])``: seconds of each call, after a warm-up."""
    provider = ContainerProvider(ContainerEngine.detect("podman"))
    image = provider.build_image(task.environment_dir, name=task.name)  # the server built it: a lookup
    with provider.start(image, limits=HarborLimits().container_limits(task, provider.limits)) as box:
        kept = timed_calls(lambda: box.bash("true", timeout=30), calls)
        naive = timed_calls(lambda: box.engine.call(["exec", box.id, "true"], timeout=60), exec_calls, warmup=1)
    with BubblewrapProvider().start() as sandbox:
        bwrap = timed_calls(lambda: sandbox.run(["true"], timeout=30), calls)
    return kept, naive, bwrap


def timed_calls(call: Callable[[], Any], calls: int, warmup: int = WARMUP_CALLS) -> list[float]:
    for _ in range(warmup):
        call()
    times: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
        if getattr(result, "returncode", 0) != 0:
            raise RuntimeError(f"`true` answered {result!r}")
    return times


# ---------------------------------------------------------------- the run


def measure(args: argparse.Namespace, log: Path) -> Run:
    run = Run(load_start=load_average(), mem_available_mb=mem_available_mb())
    tasks = {t.name: t for t in load_tasks(args.tasks)}
    if args.task not in tasks:
        raise SystemExit(f"--task {args.task!r}: no such task in {args.tasks} ({', '.join(sorted(tasks))})")
    verify_names = args.verify_tasks or sorted(tasks)
    if unknown := [name for name in verify_names if name not in tasks]:
        raise SystemExit(f"--verify-tasks: no task {', '.join(unknown)} in {args.tasks}")
    top = max(args.concurrency)
    engine = ContainerEngine.detect("podman")
    python = [sys.executable, "-m"]
    with ExitStack() as stack:
        harbor = stack.enter_context(server("Harbor", [
            *python, "servers.harbor", "--tasks", str(args.tasks), "--engine", "podman",
            "--max-concurrent-envs", str(top), "--log-level", "warning",
        ], log))
        coding = stack.enter_context(server("coding", [
            *python, "servers.coding", "--sandbox", "bubblewrap", "--warm", "0",
            "--max-concurrent-envs", str(top), "--log-level", "warning",
        ], log))
        try:
            resets = {harbor.label: {"task": args.task}, coding.label: {"seed": 0}}
            engines = {harbor.label: engine, coding.label: None}
            servers = [harbor, coding]
            for target in servers:  # first starts (imports, caches) are not counted
                asyncio.run(burst(target.url, 1, resets[target.label]))
                settle(target, engines[target.label])
            # Quiet figures first: each start burst leaves the machine busy for a while after
            # (containers being removed), which would land in the round trips' tails.
            harbor_episode = {**resets[harbor.label], "max_steps": HARBOR_STEPS}
            coding_episode = {**resets[coding.label], "max_steps": CODING_STEPS}
            loaded = os.getloadavg()[0]
            later = [Figure(
                "tool round trip, step (wire, ms)",
                asyncio.run(round_trips(harbor.url, harbor_episode, args.calls, bash_step, HARBOR_STEPS)),
                asyncio.run(round_trips(coding.url, coding_episode, args.calls, code_step, CODING_STEPS)),
                load=loaded,
            )]
            later.append(Figure(
                "tool round trip, MCP tools/call (wire, ms)",
                asyncio.run(round_trips(harbor.url, harbor_episode, args.calls, bash_tool, HARBOR_STEPS)),
                asyncio.run(round_trips(coding.url, coding_episode, args.calls, code_tool, CODING_STEPS)),
                load=os.getloadavg()[0],
            ))
            settle(harbor, engine)
            loaded = os.getloadavg()[0]
            kept, naive, bwrap = provider_round_trips(tasks[args.task], args.calls, args.exec_calls)
            later.append(Figure("provider call, no wire (ms)", kept, bwrap, load=loaded))
            later.append(Figure("`podman exec ID true`, a process per call (ms)", naive, None, load=loaded))
            print(f"  round trips: done ({load_average()})", file=sys.stderr)
            policy = HarborOraclePolicy(tasks.values())
            run.verify_load = os.getloadavg()[0]
            for _ in range(args.verify_rounds):
                run.verifies.append([
                    asyncio.run(oracle_episode(harbor.url, tasks[name], policy, base_image(tasks[name])))
                    for name in verify_names
                ])
                settle(harbor, engine)
            print(f"  verify: done ({load_average()})", file=sys.stderr)
            for level in args.concurrency:
                times: dict[str, list[float]] = {s.label: [] for s in servers}
                errors, loaded = 0, os.getloadavg()[0]
                for number in range(args.rounds):
                    for target in servers if number % 2 == 0 else servers[::-1]:
                        got, failed = asyncio.run(burst(target.url, level, resets[target.label]))
                        times[target.label] += got
                        errors += failed
                        settle(target, engines[target.label])
                plural = "reset" if level == 1 else "resets"
                run.figures.append(Figure(f"start: {level} concurrent {plural} (wire, ms)",
                                          times[harbor.label], times[coding.label], errors, load=loaded))
                print(f"  start at {level}: done ({load_average()})", file=sys.stderr)
            run.figures += later
        finally:
            pids = {harbor.pid, os.getpid()}
            stack.close()  # both servers stopped: theirs closed their containers
            left = owned_containers(engine, pids)
            if left:
                engine.remove(left)
            run.left_behind = len(left)
    run.load_end = load_average()
    return run


def base_image(task: HarborTask) -> str:
    """The task's ``FROM`` image (its first)."""
    for line in (task.environment_dir / "Dockerfile").read_text().splitlines():
        if line.strip().upper().startswith("FROM "):
            return line.split()[1]
    return "?"


def report(run: Run, args: argparse.Namespace, command: str) -> str:
    """The run as Markdown tables (what is printed)."""
    lines = [
        (
            f"`{command}`; load average (1, 5, 15 min) at the start {run.load_start}, at the end {run.load_end}; "
            f"MemAvailable at the start {run.mem_available_mb} MiB; Harbor task `{args.task}`; "
            f"{args.rounds} round(s) a level, {args.calls} calls a round-trip series."
        ),
        "",
        "| what | container p50 | container p99 | bubblewrap p50 | bubblewrap p99 | errors | load at its start |",
        "|---|---|---|---|---|---|---|",
    ]
    for figure in run.figures:
        cells = " | ".join(figure.cells(1000.0))
        lines.append(f"| {figure.what} | {cells} | {figure.errors} | {figure.load:.2f} |")
    by_task: dict[str, list[TaskVerify]] = {}
    for round_ in run.verifies:
        for one in round_:
            by_task.setdefault(one.task, []).append(one)
    if by_task:
        verifier = [statistics.median(v.verifier_s for v in runs) for runs in by_task.values()]
        submit = [statistics.median(v.submit_s for v in runs) for runs in by_task.values()]
        lines += [
            "",
            (
                f"Verify, {len(by_task)} task(s), {len(run.verifies)} oracle episode(s) each: p50 over the tasks "
                f"{statistics.median(verifier):.2f} s (verifier) / {statistics.median(submit):.2f} s (submit step); "
                f"max {max(verifier):.2f} s / {max(submit):.2f} s (load at its start {run.verify_load:.2f})."
            ),
            "",
            "| task | base image | oracle run s | verifier s | submit step s | reward |",
            "|---|---|---|---|---|---|",
        ]
        for name, runs in by_task.items():
            lines.append(
                f"| {name} | {runs[0].base} | {statistics.median(v.oracle_s for v in runs):.2f} | "
                f"{statistics.median(v.verifier_s for v in runs):.2f} | {statistics.median(v.submit_s for v in runs):.2f} | "
                f"{min(v.reward for v in runs):g} |"
            )
    lines += ["", f"Containers left after the servers stopped (removed now): {run.left_behind}."]
    return "\n".join(lines)


def concurrency_list(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"each level must be a whole number of at least 1, got {text!r}")
    return levels


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> Run:
    parser = argparse.ArgumentParser(prog="python -m bench.harbor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=concurrency_list, default=None,
                        help="concurrent resets of each start burst, comma-separated (default 1,16,64)")
    parser.add_argument("--rounds", type=positive, default=None, help="bursts a level, each server (default 5)")
    parser.add_argument("--calls", type=positive, default=None, help="timed calls a round-trip series (default 300)")
    parser.add_argument("--exec-calls", type=positive, default=None, help="timed `podman exec` calls (default 20)")
    parser.add_argument("--tasks", type=Path, default=TASKS, help="the Harbor tasks folder served (default: the repository's)")
    parser.add_argument("--task", default=TASK, help=f"the task of the start and round-trip figures (default {TASK})")
    parser.add_argument("--verify-tasks", nargs="+", default=None, metavar="NAME",
                        help="tasks whose verification is timed (default: every task of --tasks)")
    parser.add_argument("--verify-rounds", type=positive, default=1, help="oracle episodes a task (default 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, every row (explicit flags still win)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here as JSON")
    parser.add_argument("--log", type=Path, default=None, help="keep the servers' stderr in this file (default: not kept)")
    args = parser.parse_args(argv)
    defaults = {"concurrency": [1, 16, 64], "rounds": 5, "calls": 300, "exec_calls": 20, "verify_tasks": None}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else value)
    needed = max(args.concurrency) * HOST_MB_PER_CONTAINER + 1024
    if mem_available_mb() < needed:
        raise SystemExit(f"{max(args.concurrency)} concurrent containers need about {needed} MiB of free memory; "
                         f"MemAvailable is {mem_available_mb()} MiB (lower --concurrency)")
    command = "python -m bench.harbor " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"{command}: load average {load_average()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-harbor-") as folder:
        # The servers' stderr: kept only where asked; its end is shown when the run fails.
        log = args.log or Path(folder) / "servers.log"
        try:
            run = measure(args, log)
        except BaseException:
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-40:]
                print("the servers' log ends:\n" + "\n".join(tail), file=sys.stderr)
            raise
    print(report(run, args, command.strip()))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "command": command.strip(), "load_start": run.load_start, "load_end": run.load_end,
            "mem_available_mb": run.mem_available_mb, "verify_load": run.verify_load, "figures": [f.summary() for f in run.figures],
            "verify": [[asdict(v) for v in round_] for round_ in run.verifies], "left_behind": run.left_behind,
        }, indent=2) + "\n")
    failed = [v for round_ in run.verifies for v in round_ if v.reward != 1.0]
    if failed or any(f.errors for f in run.figures) or run.left_behind:
        raise SystemExit(
            f"{len(failed)} oracle episode(s) scored under 1.0, {sum(f.errors for f in run.figures)} reset error(s), "
            f"{run.left_behind} container(s) left behind"
        )
    return run


if __name__ == "__main__":
    main()
