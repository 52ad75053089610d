"""The coding server end to end: real uvicorn, OpenEnv's own clients, MCP tools, HumanEval rewards,
the rollout command (164/164 with the oracle, 0/164 with wrong solutions)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient as OpenEnvClient
from openenv.core.env_server.types import Action as OpenEnvAction
from openenv.core.env_server.types import Observation as OpenEnvObservation
from openenv.core.env_server.types import State as OpenEnvState
from openenv.core.generic_client import GenericEnvClient

from envsdk import EnvClient
from envsdk.cli import main as envsdk_main
from envsdk.errors import ServerError
from envsdk.games.humaneval import humaneval
from envsdk.schedulers.coding import render_code_observation
from envsdk.testing import running_server
from servers.coding import create_coding_app
from tests.sandbox.conftest import ensure_bwrap, processes_of

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    if (reason := ensure_bwrap()) is not None:
        pytest.skip(reason)
    app = create_coding_app(provider="bubblewrap", warm=2, max_concurrent_envs=8)
    with running_server(app) as url:
        yield url


# OpenEnv's coding env client, as its repository writes it, on OpenEnv's own (strict) models.
class CodeAction(OpenEnvAction):
    code: str


class CodeObservation(OpenEnvObservation):
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class CodeState(OpenEnvState):
    last_exit_code: int = 0


class CodingEnv(OpenEnvClient[CodeAction, CodeObservation, CodeState]):
    def _step_payload(self, action: CodeAction) -> dict[str, Any]:
        return {"code": action.code}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[CodeObservation]:
        obs = CodeObservation(**payload["observation"])
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> CodeState:
        return CodeState(
            episode_id=payload.get("episode_id"),
            step_count=payload.get("step_count", 0),
            last_exit_code=payload.get("last_exit_code", 0),
        )


def test_openenv_style_client_keeps_the_interpreter_across_steps(base_url: str) -> None:
    with CodingEnv(base_url=base_url).sync() as env:
        env.reset(seed=0)
        assert env.step(CodeAction(code="x = 41")).observation.exit_code == 0
        result = env.step(CodeAction(code="print(x + 1)"))
        assert (result.observation.stdout, result.reward, result.done) == ("42\n", 0.0, False)
        failed = env.step(CodeAction(code="raise ValueError('boom')"))
        assert failed.observation.exit_code == 1 and "ValueError: boom" in failed.observation.stderr
        assert env.state().last_exit_code == 1


def test_generic_client_solves_a_problem_with_reward_parts(base_url: str) -> None:
    problem = humaneval()[7]
    with GenericEnvClient(base_url=base_url).sync() as env:
        first = env.reset(task_id=problem.task_id)
        assert set(first.observation) == {"stdout", "stderr", "exit_code", "metadata"}
        assert first.observation["metadata"]["prompt"] == problem.prompt
        wrong = env.step({"code": f"{problem.prompt}    return []\n"})
        assert (wrong.reward, wrong.done) == (0.0, False)
        assert wrong.observation["metadata"]["tests"]["passed"] is False
        solved = env.step({"code": problem.solution})
        assert (solved.reward, solved.done) == (1.0, True)
        parts = solved.observation["metadata"]["reward_components"]
        assert parts == {"compiles": 1.0, "tests_passed": 1.0}  # a latency is no part of the reward
        assert solved.observation["metadata"]["timings"]["time_s"] > 0
        assert env.state()["solved"] is True


def test_reset_picks_the_problem_by_seed_or_task_id(base_url: str) -> None:
    with GenericEnvClient(base_url=base_url).sync() as env:
        by_seed = env.reset(seed=164 + 5).observation["metadata"]["task_id"]
        by_id = env.reset(task_id="HumanEval/5").observation["metadata"]["task_id"]
    assert by_seed == by_id == "HumanEval/5"


async def test_bad_reset_options_get_typed_errors_and_the_session_goes_on(base_url: str) -> None:
    async with EnvClient(base_url) as env:
        with pytest.raises(ServerError, match="unknown task_id 'HumanEval/999'") as unknown:
            await env.reset(task_id="HumanEval/999")
        with pytest.raises(ServerError, match="max_steps must be") as no_steps:
            await env.reset(seed=1, max_steps=0)
        # Options the reset refuses are the caller's to fix: a validation error, not the env failing.
        assert unknown.value.code == no_steps.value.code == "VALIDATION_ERROR"
        ok = await env.reset(seed=1)
        assert ok.observation["metadata"]["task_id"] == "HumanEval/1"


@pytest.mark.parametrize(
    "cheat",
    ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "import os, sys\nprint(sys.stdin.read())\nos._exit(0)"],
)
def test_a_program_that_exits_before_the_tests_does_not_pass(base_url: str, cheat: str) -> None:
    problem = humaneval()[2]
    with GenericEnvClient(base_url=base_url).sync() as env:
        env.reset(task_id=problem.task_id)
        result = env.step({"code": f"{problem.prompt}    return 0\n{cheat}\n"})
    assert result.reward == 0.0 and result.observation["metadata"]["tests"]["passed"] is False


async def test_mcp_tools_run_test_and_submit(base_url: str) -> None:
    problem = humaneval()[0]
    async with EnvClient(base_url) as env:
        await env.reset(task_id=problem.task_id)
        assert {t.name for t in await env.list_tools()} == {"run_python", "run_tests", "submit"}
        ran = await env.call_tool("run_python", code="print(6 * 7)")
        assert ran["stdout"] == "42\n" and ran["exit_code"] == 0
        assert (await env.call_tool("run_tests"))["passed"] is False
        submitted = await env.call_tool("submit", code=problem.solution)
        assert submitted["passed"] is True
        state = await env.state()
        assert state["reward"] == 1.0 and state["solved"] is True


def test_health_says_which_provider_isolates_what(base_url: str) -> None:
    sandbox = httpx.get(base_url + "/health").json()["sandbox"]
    assert sandbox["provider"] == "bubblewrap" and "network" in sandbox["isolates"]
    assert sandbox["limits"]["cpu_s"] > 0
    app = create_coding_app(provider="process", warm=0)
    try:
        with running_server(app) as url:
            weak = httpx.get(url + "/health").json()["sandbox"]
    finally:
        app.state.envsdk_sandbox_pool.close()
    assert weak["provider"] == "process" and weak["isolation"].startswith("weaker")


def test_capacity_counts_sandboxes() -> None:
    app = create_coding_app(provider="auto", warm=0, max_concurrent_envs=2)
    try:
        with running_server(app) as url:
            held = [GenericEnvClient(base_url=url).sync() for _ in range(2)]
            for env in held:
                env.connect()
                env.reset(seed=0)
            # OpenEnv's client reports any error frame as this RuntimeError, naming its code.
            full = r"Server at capacity: 2/2 sessions active.*\(code: CAPACITY_REACHED\)"
            with pytest.raises(RuntimeError, match=full), GenericEnvClient(base_url=url).sync() as third:
                third.reset(seed=0)
            for env in held:
                env.close()
    finally:
        app.state.envsdk_sandbox_pool.close()


def test_web_page_shows_what_the_model_reads(base_url: str) -> None:
    problem = humaneval()[0]
    with GenericEnvClient(base_url=base_url).sync() as env:
        env.reset(task_id=problem.task_id)
        observation = env.step({"code": problem.solution + "print('hi')\n"}).observation
    view = httpx.post(base_url + "/web/api/render", json={"observation": observation}).json()
    assert view["text"] == "# HumanEval/0\n" + render_code_observation(observation, {})
    assert "stdout:\nhi" in view["text"] and "tests: passed" in view["text"]


@pytest.mark.parametrize("policy, solved", [("oracle", 164), ("envsdk.policies.coding:CodingWrongPolicy", 0)])
def test_rollout_command_scores_every_humaneval_problem(
    policy: str, solved: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if (reason := ensure_bwrap()) is not None:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "completions.jsonl"
    code = envsdk_main([
        "rollout", "--env", "coding", "--policy", policy, "--episodes", "164", "--concurrency", "8",
        "--max-turns", "1", "--out", str(out), "--no-progress",
    ])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 164 and {r["env_config"]["seed"] for r in rows} == set(range(164))
    assert sum(r["success"] for r in rows) == solved
    assert sum(r["total_reward"] for r in rows) == float(solved)


def test_server_shutdown_closes_the_warm_sandboxes() -> None:
    app = create_coding_app(provider="process", warm=2)
    pool = app.state.envsdk_sandbox_pool
    with running_server(app):
        deadline = time.monotonic() + 30
        while pool.ready < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = list(pool._ready)
        assert len(ready) == 2
    assert pool.ready == 0 and all(not box.alive for box in ready)
    assert all(processes_of(box.uid, box.pid) == [] for box in ready)


def test_launcher_serves_and_leaves_nothing_after_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from envsdk.testing import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "servers.coding", "--port", str(port), "--sandbox", "process", "--warm", "2",
         "--log-level", "warning"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        health: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health").json()
                if health["sandbox"]["ready"] == 2:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert health["sandbox"]["provider"] == "process" and health["sandbox"]["ready"] == 2
        uids = {p.uids().real for p in psutil.Process(server.pid).children(recursive=True)} - {os.getuid()}
        assert uids
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 128 + signal.SIGTERM  # as the README says of a server SIGTERM stopped
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        assert server.stderr is not None
        server.stderr.close()
    assert all(processes_of(uid, -1) == [] for uid in uids)


@pytest.mark.parametrize("reset", [{"task_id": "nope"}, {"task_id": 7}, {"seed": "x"}, {"max_steps": 0}])
async def test_a_reset_value_the_server_cannot_use_is_a_validation_error_naming_it(
    base_url: str, reset: dict[str, Any]
) -> None:
    """It was EXECUTION_ERROR ('CodingEnvironment.reset raised TaskSetError'), as if the server
    had failed; the game servers answer the same mistake with VALIDATION_ERROR."""
    from envsdk.errors import ServerError

    async with EnvClient(base_url) as env:
        with pytest.raises(ServerError) as refused:
            await env.reset(**reset)
        assert refused.value.code == "VALIDATION_ERROR", refused.value
        assert next(iter(reset)) in str(refused.value)
        assert (await env.reset(task_id="HumanEval/0")).observation is not None  # the session goes on
