"""The Harbor server end to end, on real podman containers: one server of the fixture tasks for
the module (a good task, one with named reward parts, one with short timeouts, and one of each
broken kind). The wire round trip, MCP, OpenEnv's own clients and validator; a verifier no
agent can fool; the agent's time limit; each broken task a one-line error while another session
plays on; no container left once the server stops (also after SIGKILL and a restart)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from envsdk import EnvClient
from envsdk.errors import ServerError
from envsdk.sandbox.container import ContainerProvider
from envsdk.testing import free_port, running_server
from servers.harbor import (
    HarborAction,
    HarborEnvironment,
    HarborLimits,
    TaskFolderError,
    create_harbor_app,
    harbor_environment_factory,
)
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401 - fixtures

pytestmark = [pytest.mark.timeout(300), requires_containers]

FIXTURES = Path(__file__).parent / "harbor_fixtures"
REPOSITORY = Path(__file__).resolve().parents[2]
LIMITS = HarborLimits(command_timeout_s=20.0, max_verifier_timeout_s=20.0, max_memory_mb=512, max_storage_mb=512)
WRITE_GREETING = {"tool": "write_file", "path": "/app/greeting.txt", "content": "hello\n"}


@pytest.fixture(scope="module")
def provider(request: pytest.FixtureRequest) -> ContainerProvider:
    """tests/_containers.py's provider (its engine holds the base images)."""
    found: ContainerProvider = request.getfixturevalue("container_provider")
    return found


@pytest.fixture(scope="module")
def served(provider: ContainerProvider) -> Iterator[tuple[str, set[str]]]:
    """The fixture tasks' server (production mode, as OpenEnv's MCP client wants) and its images."""
    app = create_harbor_app(FIXTURES, provider=provider, limits=LIMITS, max_concurrent_envs=8, mode="production")
    images = set(app.state.envsdk_harbor_tasks.images.values())
    with running_server(app) as url:
        yield url, images
    assert _containers_of(provider, images) == []


@pytest.fixture
def url(served: tuple[str, set[str]]) -> str:
    return served[0]


def _containers_of(provider: ContainerProvider, images: set[str]) -> list[str]:
    listed = provider.engine.call(["ps", "-a", "--format", "{{.ID}} {{.Image}}"], timeout=60).stdout.decode()
    return [line for line in listed.splitlines() if line.split(" ", 1)[-1] in images]


def _frame_text(result: Any) -> str:
    """Everything a step result carries, as text (to look for what must never be in it)."""
    return json.dumps({"observation": result.observation, "reward": result.reward, "done": result.done}, default=str)


# ---------------------------------------------------------------- the wire


def test_generic_client_plays_a_task_from_instruction_to_reward(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as env:
        first = env.reset(task="minimal")
        assert first.observation["text"].startswith("Write the word `hello`")
        assert first.observation["metadata"]["task"] == "minimal"
        assert first.observation["metadata"]["task_metadata"] == {"difficulty": "easy", "category": "fixture", "tags": ["files"]}
        assert first.observation["metadata"]["agent_timeout_s"] == 120.0
        ran = env.step({"tool": "bash", "command": "pwd; echo oops >&2; exit 3"})
        assert ran.observation["text"] == "/app\noops\n[exit status 3]"
        assert (ran.observation["exit_code"], ran.reward, ran.done) == (3, 0.0, False)
        assert (env.state()["done"], env.state()["success"]) == (False, None)  # no verdict yet
        wrote = env.step(WRITE_GREETING)
        assert wrote.observation["text"] == "wrote 6 bytes to /app/greeting.txt"
        assert env.step({"tool": "read_file", "path": "greeting.txt"}).observation["text"] == "hello\n"
        missing = env.step({"tool": "read_file", "path": "/app/nope.txt"})
        assert missing.observation["text"].startswith("error: read '/app/nope.txt'") and not missing.done
        done = env.step({"tool": "submit"})
        assert (done.reward, done.done) == (1.0, True)
        metadata = done.observation["metadata"]
        assert metadata["ended"] == "submit" and metadata["verifier"]["exit_code"] == 0
        assert set(metadata["verifier"]) == {"exit_code", "timed_out"}
        # Wall-clock figures are timings only: two equal episodes give equal observations but for them.
        assert set(metadata["timings"]) == {"time_s", "verifier_s"} and 0 < metadata["timings"]["verifier_s"] < 20
        assert "time_left_s" not in metadata and "time_left_s" not in wrote.observation["metadata"]
        state = env.state()
        assert (state["reward"], state["ended"], state["step_count"]) == (1.0, "submit", 5)
        assert (state["done"], state["success"]) == (True, True)
        # A plain OpenEnv peer gets EPISODE_DONE as EXECUTION_ERROR, the env's words kept; its
        # client raises RuntimeError("Server error: <message> (code: <code>)").
        with pytest.raises(RuntimeError, match=r"The episode is over .*\(code: EXECUTION_ERROR\)"):
            env.step({"tool": "bash", "command": "true"})


def test_reset_picks_the_task_by_name_or_seed_and_reward_json_parts_reach_the_wire(url: str) -> None:
    names = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    with GenericEnvClient(base_url=url).sync() as env:
        assert env.reset(task="minimal").observation["metadata"]["task"] == "minimal"
        seed = names.index("parts") + 3 * len(names)
        assert env.reset(seed=seed).observation["metadata"]["task"] == "parts"
        env.step({"tool": "bash", "command": "touch /app/a.txt"})
        done = env.step({"tool": "submit"})
        # "weight" is the task.toml's [verifier] env variable, as test.sh saw it.
        parts = {"a": 1.0, "b": 0.0, "weight": 1.0}
        assert (done.reward, done.observation["metadata"]["reward_components"]) == (0.5, parts)
        # A partial reward is not a success: every test must pass (Terminal-Bench's "resolved").
        assert (env.state()["reward_components"], env.state()["done"], env.state()["success"]) == (parts, True, False)


async def test_bad_reset_options_are_validation_errors_and_the_session_goes_on(url: str) -> None:
    async with EnvClient(url) as env:
        refusals: list[tuple[dict[str, Any], str]] = [
            ({"task": "nope"}, "unknown task 'nope'"), ({"seed": "x"}, "seed must be an integer"),
            ({"task": "minimal", "max_steps": 0}, "max_steps must be an integer from 1"),
        ]
        for options, said in refusals:
            with pytest.raises(ServerError, match=said) as refused:
                await env.reset(**options)
            assert refused.value.code == "VALIDATION_ERROR"
        assert (await env.reset(task="minimal", max_steps=1)).observation["metadata"]["max_steps"] == 1
        # The step limit ends the episode, verified: the one step left writes the answer.
        last = await env.step(WRITE_GREETING)
        assert (last.done, last.reward, last.observation["metadata"]["ended"]) == (True, 1.0, "max_steps")


def test_mcp_tools_play_a_task_with_named_reward_parts(url: str) -> None:
    with MCPToolClient(base_url=url).sync() as env:
        env.reset(task="parts")
        tools = {t.name: t for t in env.list_tools()}
        assert list(tools) == ["bash", "read_file", "write_file", "submit"]
        assert tools["write_file"].input_schema["required"] == ["path", "content"]
        assert env.call_tool("bash", command="touch /app/a.txt && ls /app") == "a.txt\n"
        assert env.call_tool("submit") == "[episode over: submitted; reward 0.5]"
        assert env.state().step_count == 2
        with pytest.raises(RuntimeError, match="episode is over"):
            env.call_tool("bash", command="true")


def test_openenv_validate_url_passes_every_criterion(url: str) -> None:
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "openenv"), "validate", "--url", url, "--json"],
        check=False, capture_output=True, text=True, timeout=60,
    )
    report = json.loads(out.stdout)
    assert [c["id"] for c in report["criteria"] if not c["passed"]] == [], out.stdout
    assert report["summary"]["passed_count"] == report["summary"]["total_count"] == 6


def test_health_lists_the_broken_tasks_with_their_errors(url: str) -> None:
    harbor = httpx.get(f"{url}/health", timeout=30).json()["harbor"]
    assert {"minimal", "parts", "sleepy"} <= set(harbor["ready"])
    assert set(harbor["broken"]) == {"bad-build", "offline-from", "no-instruction", "no-test", "no-toml"}
    assert harbor["containers"]["provider"] == "container"


# ---------------------------------------------------------------- the verifier cannot be fooled


ATTACKS = {
    "writes the reward itself": "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
    "plants the tests": "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh",
    "leaves a process rewriting the reward": (
        "nohup setsid sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01; done' "
        "> /dev/null 2>&1 & sleep 0.3; cat /logs/verifier/reward.txt"
    ),
    "links /logs to its own folder": (
        "mkdir -p /tmp/own/verifier && echo 1 > /tmp/own/verifier/reward.txt && rm -rf /logs && ln -s /tmp/own /logs"
    ),
    "links the reward folder to its own": (
        "mkdir -p /tmp/mine /logs && echo 1 > /tmp/mine/reward.txt && rm -rf /logs/verifier "
        "&& ln -s /tmp/mine /logs/verifier && cat /logs/verifier/reward.txt"
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_nothing_the_agent_leaves_stands_in_for_the_verifier(url: str, attack: str) -> None:
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(task="minimal")
        looked = env.step({"tool": "bash", "command": "ls /tests; cat /tests/test.sh"})
        assert "No such file or directory" in looked.observation["text"] and "greeting" not in _frame_text(looked)
        env.step({"tool": "bash", "command": ATTACKS[attack]})
        done = env.step({"tool": "submit"})
    assert (done.reward, done.done) == (0.0, True), done.observation
    # The tests' output never reaches the wire, only how they ran.
    assert "greeting" not in _frame_text(done) and set(done.observation["metadata"]["verifier"]) == {
        "exit_code", "timed_out"
    }


# ---------------------------------------------------------------- the agent's time


def test_a_command_past_the_agents_time_ends_the_episode_verified(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as env:
        assert env.reset(task="sleepy").observation["metadata"]["agent_timeout_s"] == 3.0
        started = time.monotonic()
        cut = env.step({"tool": "bash", "command": "sleep 30; touch /app/done"})
        assert time.monotonic() - started < 20  # cut at ~3 s, then the verifier's 3 s
        metadata = cut.observation["metadata"]
        assert (cut.done, cut.reward, metadata["ended"], metadata["timed_out"]) == (True, 0.0, "agent_timeout", True)
        assert cut.observation["text"].startswith("[stopped: the command ran past ")
        # Its tests hang when the work was not done: past [verifier] timeout_sec the reward is 0.0.
        assert metadata["verifier"]["timed_out"] is True

        env.reset(task="sleepy")
        time.sleep(3.2)
        late = env.step({"tool": "bash", "command": "touch /app/done"})
        assert late.observation["text"] == "[not run: the agent's 3 s are up]"
        assert (late.done, late.reward, late.observation["metadata"]["ended"]) == (True, 0.0, "agent_timeout")


# ---------------------------------------------------------------- broken tasks


BROKEN_AT_RESET = {
    "no-toml": "task no-toml: task.toml: missing",
    "no-instruction": "task no-instruction: instruction.md: missing",
    "no-test": "task no-test: tests/test.sh: missing",
    "bad-build": "task bad-build: environment/Dockerfile: ",
    "offline-from": "task offline-from: environment/Dockerfile: ",
}
BROKEN_AT_VERDICT = {
    "no-reward": "task no-reward: tests/test.sh: wrote no reward",
    "reward-garbage": "task reward-garbage: /logs/verifier/reward.txt: not a number: 'passed!'",
    "reward-nan": "task reward-nan: /logs/verifier/reward.txt: nan is not a finite number",
}


async def test_each_broken_task_is_one_line_naming_task_and_file_while_another_session_plays(url: str) -> None:
    async with EnvClient(url) as honest, EnvClient(url) as other:
        await honest.reset(task="minimal")
        for name, said in BROKEN_AT_RESET.items():
            with pytest.raises(ServerError) as refused:
                await other.reset(task=name)
            assert said in str(refused.value) and "\n" not in str(refused.value), refused.value
        assert "registry.invalid/nobody/not-here:1.0" in str(await _reset_error(other, "offline-from"))
        for name, said in BROKEN_AT_VERDICT.items():
            await other.reset(task=name)
            with pytest.raises(ServerError) as refused:
                await other.step({"tool": "submit"})
            assert said in str(refused.value) and "\n" not in str(refused.value), refused.value
            state = await other.state()
            assert state["error"] is not None and said in state["error"] and state["reward"] == 0.0
            assert (state["done"], state["success"]) == (True, None)  # over, and never judged
        await honest.step(WRITE_GREETING)
        done = await honest.step({"tool": "submit"})
        assert (done.reward, done.done) == (1.0, True)


async def _reset_error(env: EnvClient, task: str) -> ServerError:
    try:
        await env.reset(task=task)
    except ServerError as exc:
        return exc
    raise AssertionError(f"reset of {task} did not fail")


# ---------------------------------------------------------------- without a server


def test_the_environment_factory_plays_without_a_server_and_the_web_view_reads_the_episode(
    provider: ContainerProvider, tmp_path: Path,
) -> None:
    shutil.copytree(FIXTURES / "minimal", tmp_path / "tasks" / "minimal")  # the module's image: nothing to build
    make = harbor_environment_factory(tmp_path / "tasks", provider=provider, limits=LIMITS)
    env = make()
    try:
        first = env.reset(task="minimal")
        ran = env.step(HarborAction(tool="bash", command="echo hello from the machine"))
        done = env.step(HarborAction(tool="submit"))
    finally:
        env.close()
    assert (done.done, done.reward, env.state.done, env.state.success) == (True, 0.0, True, False)
    views = [HarborEnvironment.render_web(o) for o in (first, ran, done)]
    assert views[0].text == f"# minimal\n{first.text}" and views[0].actions
    assert views[1].text == "# minimal\nhello from the machine\n"
    assert (views[2].text or "").endswith("[episode over: submit; the tests exited 0]") and views[2].actions == []
    with pytest.raises(TaskFolderError, match="no task can be served"):
        harbor_environment_factory(FIXTURES / "no-test", provider=provider, limits=LIMITS)


# ---------------------------------------------------------------- nothing left behind


def test_server_stop_closes_the_containers_of_open_sessions(provider: ContainerProvider, tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "minimal", tmp_path / "stop-check")
    app = create_harbor_app(tmp_path / "stop-check", provider=provider, limits=LIMITS)
    images = set(app.state.envsdk_harbor_tasks.images.values())
    clients: list[Any] = []
    try:
        with running_server(app) as url:
            for _ in range(2):
                clients.append(GenericEnvClient(base_url=url).sync())
                clients[-1].connect()
                clients[-1].reset()
            assert len(_containers_of(provider, images)) == 2
        assert _containers_of(provider, images) == []
    finally:
        for client in clients:
            with contextlib.suppress(Exception):  # the server is gone
                client.close()


def _serve(folder: Path, port: int, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "servers.harbor", "--tasks", str(folder), "--port", str(port), "--log-level", "warning",
         "--max-memory-mb", "512", "--max-storage-mb", "512"],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )


def _healthy(server: subprocess.Popen[bytes], port: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server exited with {server.returncode}"
        try:
            return dict(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json())
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("the server did not answer /health in 120 s")


def test_command_serves_and_a_restart_removes_what_a_killed_server_left(provider: ContainerProvider, tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    shutil.copytree(FIXTURES / "minimal", folder / "left-behind")
    port = free_port()
    server = _serve(folder, port, tmp_path)
    try:
        assert _healthy(server, port)["harbor"]["ready"] == ["left-behind"]
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
            env.reset(task="left-behind")
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
        listed = provider.engine.call(["ps", "-a", "--format", "{{.Image}}"], timeout=60).stdout.decode().split()
        images = {image for image in listed if "envsdk-task-left-behind:" in image}
        assert len(images) == 1 and len(_containers_of(provider, images)) == 1  # the killed server's container
        server = _serve(folder, port, tmp_path)
        _healthy(server, port)
        assert _containers_of(provider, images) == []  # removed at start-up
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
            env.reset(task="left-behind")
            assert len(_containers_of(provider, images)) == 1
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 128 + signal.SIGTERM
        assert _containers_of(provider, images) == []
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
