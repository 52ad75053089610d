"""The blocks of docs/serving.md, tool-envs.md, local-env.md, rewards.md, rollouts.md (its
formatters) and scaling.md, run from an empty folder against real servers: Python blocks are
executed as written (top-level ``await`` as in an asyncio REPL), shell blocks command by command."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.testing import free_ports, stop_process
from tests.cli.conftest import REPO, ServeFn, envsdk, user_env
from tests.docs.blocks import DocBlock, commands, doc_block
from tests.docs.conftest import substitute


def _run_python(block: DocBlock, source: str | None = None, namespace: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """Execute a Python block (or `source`, the block after a substitution) as a module would
    run it, awaiting a top-level ``await``; return its namespace and what it printed."""
    code = compile(source if source is not None else block.text, f"{block.page}:{block.id}", "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": f"doc_{block.id.replace('-', '_') if block.id else 'block'}"} | (namespace or {})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = eval(code, namespace)  # the documented code itself is what is tested
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    return namespace, printed.getvalue()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ serving.md


@pytest.mark.timeout(240)
def test_check_env_with_replies_and_as_a_ci_gate(folder: Path) -> None:
    block = doc_block("docs/serving.md", "check-env")
    for line in commands(block):
        checked = envsdk(*line.split()[1:], cwd=folder)
        assert checked.returncode == 0, (line, checked.stdout, checked.stderr)
        assert "10 rules passed, 0 skipped" in checked.stdout, checked.stdout
    # The comment's alternative to --replies, given twice.
    assert """# or --action '{"message": "50"}' (repeatable)""" in block.text
    actions = envsdk("check-env", "my_env:MyEnv", "--action", '{"message": "50"}', "--action", '{"message": "25"}', cwd=folder)
    assert actions.returncode == 0, actions.stdout + actions.stderr


@pytest.mark.timeout(120)
def test_the_client_block_plays_the_readmes_env(folder: Path, serve: ServeFn) -> None:
    block = doc_block("docs/serving.md", "client")
    url = serve("my_env:MyEnv", cwd=folder)
    namespace, _ = _run_python(block, substitute(block.text, {"http://127.0.0.1:8000": url}))
    assert namespace["result"].observation["text"] == "you said 'hello'" and namespace["result"].reward == 5.0


# ------------------------------------------------------------------------------ tool-envs.md


def test_the_tool_block_declares_a_typed_documented_tool() -> None:
    from envsdk.tools import is_tool_env, tool_methods, tool_signature

    namespace, _ = _run_python(doc_block("docs/tool-envs.md", "tool-env"))
    ledger = namespace["Ledger"]
    assert is_tool_env(ledger) and list(tool_methods(ledger)) == ["deposit"]
    deposit = tool_methods(ledger)["deposit"]
    assert tool_signature(deposit).parameters["amount"].annotation is int
    assert (deposit.__doc__ or "").startswith("Add money to the ledger.")


@pytest.mark.timeout(120)
def test_the_tool_client_block_lists_and_calls_the_ledgers_tools(tmp_path: Path, serve: ServeFn) -> None:
    block = doc_block("docs/tool-envs.md", "tool-client")
    (tmp_path / "ledger_tools.py").write_text((REPO / "examples" / "ledger_tools.py").read_text(encoding="utf-8"))
    url = serve(cwd=tmp_path, module="ledger_tools")
    _, printed = _run_python(block, substitute(block.text, {"http://127.0.0.1:8000": url}))
    names, value = printed.splitlines()
    assert ast.literal_eval(names) == ["deposit", "withdraw", "balance"]
    assert value.strip()  # the tool's value, printed


# ------------------------------------------------------------------------------ local-env.md


@pytest.mark.timeout(240)
def test_the_plugin_commands_roll_out_check_and_serve_the_plugin(tmp_path: Path, serve: ServeFn) -> None:
    (tmp_path / "my_plugin.py").write_text(doc_block("docs/local-env.md", "plugin").text, encoding="utf-8")
    rollout, check, serve_line = commands(doc_block("docs/local-env.md", "plugin-commands"))
    rolled = envsdk(*rollout.split()[1:], "--no-progress", cwd=tmp_path)
    assert rolled.returncode == 0, rolled.stderr
    records = _records(tmp_path / "completions.jsonl")
    assert len(records) == 4 and {r["turns"] for r in records} == {2} and {r["total_reward"] for r in records} == {2.0}
    checked = envsdk(*check.split()[1:], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert serve_line == "envsdk serve my_plugin:MyEnv --port 8000"
    url = serve(*serve_line.split()[2:-2], cwd=tmp_path)
    from envsdk import OpenEnvWrapper

    with OpenEnvWrapper(url) as env:
        assert env.reset(seed=1).observation["text"] == "say 2 things"


# ------------------------------------------------------------------------------ rewards.md


@pytest.mark.timeout(120)
def test_the_rubric_env_sends_every_named_part_with_the_step(tmp_path: Path, serve: ServeFn) -> None:
    from envsdk import OpenEnvWrapper

    block = doc_block("docs/rewards.md", "rubric")
    assert block.text.startswith("# code_env.py")
    (tmp_path / "code_env.py").write_text(block.text, encoding="utf-8")
    url = serve("code_env:MyEnv", cwd=tmp_path)
    with OpenEnvWrapper(url) as env:
        env.reset(seed=1)
        solved = env.step({"code": "def answer():\n    return 42\n"})
        env.reset(seed=2)
        broken = env.step({"code": "def answer(:"})
    assert solved.reward == 1.0 and broken.reward == pytest.approx(0.7)
    parts = broken.observation["metadata"]["reward_components"]
    assert parts == {"rubric_0": 0.0, "rubric_0.rubric": 0.0, "rubric_1": 1.0, "rubric_1.rubric_0": 1.0, "rubric_1.rubric_1": 1.0}


# ------------------------------------------------------------------------------ rollouts.md


def test_the_formatter_block_registers_a_formatter_and_overrides_both_methods() -> None:
    from envsdk.formats import formatters

    before = set(formatters)
    try:
        namespace, _ = _run_python(doc_block("docs/rollouts.md", "formatters"))
        assert formatters["board"]({"board": "1 2\n3 4"}, None) == "Board:\n1 2\n3 4"
        guess = namespace["GuessScheduler"](base_url="http://127.0.0.1:9")
        assert guess.parse_action(" 7\n") == {"guess": 7}
        assert guess.format_observation({"text": "Higher."}) == "Higher.\nReply with one number."
    finally:
        for name in set(formatters) - before:
            del formatters[name]


# ------------------------------------------------------------------------------ scaling.md


def _wait_for_replicas(proc: subprocess.Popen[str], urls: list[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if all(httpx.get(f"{u}/health", timeout=2).status_code == 200 for u in urls):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"replicas {urls} did not start")


@pytest.mark.timeout(400)
def test_replicas_serve_a_pooled_rollout_and_stop_on_sigterm(tmp_path: Path) -> None:
    block = doc_block("docs/scaling.md", "replicas")
    port = free_ports(4)
    # Ports the test found free for 8000..8003; 64 episodes rather than 256 on two shared cores.
    server_line, rollout_line = commands(block)
    server = substitute(server_line, {"--port 8000": f"--port {port}"})
    rollout = substitute(rollout_line, {
        "127.0.0.1:8000": f"127.0.0.1:{port}", "127.0.0.1:8001": f"127.0.0.1:{port + 1}", "--episodes 256": "--episodes 64",
    })
    proc = subprocess.Popen(
        [sys.executable, *server.split()[1:]], cwd=tmp_path, env=user_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        _wait_for_replicas(proc, [f"http://127.0.0.1:{port + i}" for i in range(4)])
        assert len(json.loads((tmp_path / "urls.json").read_text(encoding="utf-8"))["base_urls"]) == 4
        rolled = envsdk(*rollout.split()[1:], "--no-progress", cwd=tmp_path, timeout=300)
        assert rolled.returncode == 0, rolled.stderr[-3000:]
        records = _records(tmp_path / "completions.jsonl")
        assert len(records) == 64 and all(r["success"] for r in records)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_the_thread_bound_declaration_keeps_a_sessions_thread() -> None:
    # The page's class, as written (its action and observation types stood in by the echo env's):
    # the server gives its sessions lanes that keep their thread; an undeclared env's park.
    from envsdk import Environment, State
    from envsdk.server.executors import Executors
    from envsdk.testing import EchoAction, EchoObservation

    block = doc_block("docs/scaling.md", "thread-bound")
    scope: dict[str, Any] = {"Environment": Environment, "State": State, "MyAction": EchoAction,
                             "MyObservation": EchoObservation}
    exec(compile(block.text, "docs/scaling.md", "exec"), scope)  # noqa: S102 - the page's own block
    executors = Executors(max_abandoned_threads=4, lane_idle_s=5.0)

    class Plain(Environment[EchoAction, EchoObservation, State]):  # type: ignore[misc]
        pass

    try:
        assert executors.lane(scope["MyEnv"]).keeps_thread is True
        assert executors.lane(Plain).keeps_thread is False
    finally:
        executors.shutdown()
