"""Code execution: HumanEval episodes/s and sandbox start-up, envsdk's coding server vs OpenEnv's.

``python -m bench.coding_bench [--sessions 1 16 64] [--episodes 64]`` runs, at each number of
concurrent sessions, episodes of the canonical solution (reset, one step that defines the
function and runs the tests) against three servers on 127.0.0.1:

* ``envsdk-warm``: `servers.coding` with bubblewrap sandboxes and a warm pool as large as the
  sessions;
* ``envsdk-cold``: the same with no warm pool (every reset starts a sandbox);
* ``openenv``: OpenEnv's coding env logic (`OpenEnvCodingEnvironment` below: one smolagents
  ``LocalPythonExecutor`` per session, as OpenEnv's ``envs/coding_env`` does, the same
  HumanEval check run through it) served by OpenEnv's own ``create_app``. Its executor is an
  AST interpreter inside the server process: no process, memory, CPU, file or network
  boundary, an import allow-list only; a ``while True`` in it holds a server thread forever.

It prints episodes/s and the p50/p99 of reset (where envsdk's sandbox start-up shows) and
step latency, then the sandbox start-up alone: `BubblewrapProvider.start` (cold) and
`SandboxPool.take` with sandboxes ready (warm). Needs ``bwrap`` and ``pip install smolagents``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any
from uuid import uuid4

from envsdk import EnvClient
from envsdk.games.humaneval import Problem, humaneval
from envsdk.sandbox import BubblewrapProvider, SandboxPool
from envsdk.testing import running_server
from servers.coding import create_coding_app

#: Imports the canonical solutions and tests use, allowed in smolagents' executor.
AUTHORIZED_IMPORTS = ["math", "re", "string", "collections", "itertools", "functools", "hashlib", "heapq", "typing", "random"]


def openenv_app(max_sessions: int) -> Any:
    """OpenEnv's coding env logic on OpenEnv's server (see the module docstring)."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from smolagents import LocalPythonExecutor

    class CodeAction(Action):
        code: str

    class CodeObservation(Observation):
        stdout: str = ""
        stderr: str = ""
        exit_code: int = 0

    class CodeState(State):
        last_exit_code: int = 0

    class OpenEnvCodingEnvironment(Environment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = CodeState()
            self._problem: Problem | None = None
            self._executor: Any = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CodeObservation:
            problems = humaneval()
            self._problem = problems[(seed or 0) % len(problems)]
            self._executor = LocalPythonExecutor(additional_authorized_imports=AUTHORIZED_IMPORTS)
            self._executor.send_tools({})
            self._state = CodeState(episode_id=episode_id or str(uuid4()))
            return CodeObservation(metadata={"prompt": self._problem.prompt})

        def step(self, action: CodeAction, **kwargs: Any) -> CodeObservation:
            assert self._problem is not None
            self._state.step_count += 1
            try:
                result = self._executor(action.code)
                stdout, stderr, code = str(result.logs or ""), "", 0
            except Exception as exc:  # smolagents raises for errors in the code
                stdout, stderr, code = "", str(exc), 1
            passed = False
            if code == 0:
                try:
                    self._executor(f"{self._problem.test}\ncheck({self._problem.entry_point})")
                    passed = True
                except Exception as exc:
                    stderr = str(exc)
            self._state.last_exit_code = code
            return CodeObservation(stdout=stdout, stderr=stderr, exit_code=code, reward=float(passed), done=passed)

        @property
        def state(self) -> CodeState:
            return self._state

    return create_app(OpenEnvCodingEnvironment, CodeAction, CodeObservation, max_concurrent_envs=max_sessions)


def quantiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:.1f} / {p99 * 1000:.1f}"


async def play(url: str, sessions: int, episodes: int) -> dict[str, Any]:
    problems = humaneval()
    resets: list[float] = []
    steps: list[float] = []
    solved = 0
    queue = list(range(episodes))

    async def worker() -> None:
        nonlocal solved
        while queue:
            seed = queue.pop()
            async with EnvClient(url) as env:
                started = time.perf_counter()
                await env.reset(seed=seed)
                resets.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = await env.step({"code": problems[seed % len(problems)].solution})
                steps.append(time.perf_counter() - started)
                solved += int(result.reward == 1.0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(sessions)))
    elapsed = time.perf_counter() - started
    return {"episodes_per_s": episodes / elapsed, "solved": solved, "reset": quantiles(resets), "step": quantiles(steps)}


def startup(samples: int) -> tuple[str, str]:
    provider = BubblewrapProvider()
    cold: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        box = provider.start()
        cold.append(time.perf_counter() - started)
        box.close()
    warm: list[float] = []
    pool = SandboxPool(provider, warm=samples)
    try:
        while pool.ready < samples:
            time.sleep(0.05)
        for _ in range(samples):
            started = time.perf_counter()
            box = pool.take()
            warm.append(time.perf_counter() - started)
            box.close()
    finally:
        pool.close()
    return quantiles(cold), quantiles(warm)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.coding_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--episodes", type=int, default=64, help="episodes per server and session count")
    parser.add_argument("--startup-samples", type=int, default=16)
    args = parser.parse_args(argv)
    print("| server | sessions | episodes/s | solved | reset p50 / p99 ms | step p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for sessions in args.sessions:
        episodes = max(args.episodes, sessions)
        builds = {
            "envsdk-warm": lambda: create_coding_app(provider="bubblewrap", warm=sessions, max_concurrent_envs=sessions),
            "envsdk-cold": lambda: create_coding_app(provider="bubblewrap", warm=0, max_concurrent_envs=sessions),
            "openenv": lambda: openenv_app(sessions),
        }
        for name, build in builds.items():
            app = build()
            try:
                with running_server(app) as url:
                    if name == "envsdk-warm":
                        pool = app.state.envsdk_sandbox_pool
                        while pool.ready < sessions:
                            time.sleep(0.05)
                    row = asyncio.run(play(url, sessions, episodes))
            finally:
                pool_of = getattr(app.state, "envsdk_sandbox_pool", None)
                if pool_of is not None:
                    pool_of.close()
            print(f"| {name} | {sessions} | {row['episodes_per_s']:.1f} | {row['solved']}/{episodes} | {row['reset']} | {row['step']} |", flush=True)
    cold, warm = startup(args.startup_samples)
    print(f"\nsandbox start-up p50 / p99 ms: cold (BubblewrapProvider.start) {cold}; warm (SandboxPool.take) {warm}")


if __name__ == "__main__":
    main()
