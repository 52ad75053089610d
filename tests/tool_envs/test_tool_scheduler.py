"""`ToolScheduler`: a tool env played through a policy's tool calls, on envsdk's server and on
OpenEnv's own; the tools are discovered over MCP and the calls counted by the server."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from envsdk.env import RolloutRequest
from envsdk.registry import schedulers
from envsdk.schedulers import ToolScheduler, parse_tool_call

pytestmark = pytest.mark.timeout(60)


class LedgerSolver:
    """Reads balance and target from the first observation, makes one move, then stops."""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if messages[-1]["role"] == "user" and len(messages) > 2:
            return "Done."
        # The model reads the ledger's prompt text: "The ledger holds B. Bring it to exactly T ..."
        balance, target = (int(n) for n in re.findall(r"\d+", messages[1]["content"])[:2])
        gap = target - balance
        if gap == 0:
            return '<tool_call>{"name": "balance", "arguments": {}}</tool_call>'
        name = "deposit" if gap > 0 else "withdraw"
        return f'<tool_call>{{"name": "{name}", "arguments": {{"amount": {abs(gap)}}}}}</tool_call>'


class Tallier:
    async def act(self, messages: list[dict[str, Any]]) -> str:
        turn = sum(m["role"] == "assistant" for m in messages)
        calls = ['{"name": "tally", "arguments": {"x": 4}}', '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "tally", "arguments": "{\\"x\\": 1}"}</tool_call>']
        return calls[turn] if turn < len(calls) else "finished"


def test_parse_tool_call_reads_tagged_bare_and_string_arguments() -> None:
    assert parse_tool_call('x <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call> y') == ("a", {"k": 1})
    assert parse_tool_call('{"name": "a"}') == ("a", {})
    assert parse_tool_call('{"name": "a", "arguments": "{\\"k\\": 2}"}') == ("a", {"k": 2})
    assert parse_tool_call("no call") is None and parse_tool_call('{"arguments": {}}') is None


async def test_tool_scheduler_plays_the_ledger_to_its_reward(ledger_url: str) -> None:
    assert schedulers["tools"] is ToolScheduler
    before = int(re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{ledger_url}/metrics").text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    scheduler = ToolScheduler(base_url=ledger_url, max_turns=4)
    requests = [RolloutRequest(data_dict={"env_config": {"seed": s}}) for s in range(6)]
    done = await scheduler.run(requests, LedgerSolver())
    assert [t.status for t in done] == ["done"] * 6
    assert all(t.total_reward == 1.0 and t.rollout_infos["total_reward"] == 1.0 for t in done)
    assert "<tools>" in done[0].messages[0]["content"] and '"name": "deposit"' in done[0].messages[0]["content"]
    after = int(re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{ledger_url}/metrics").text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert after - before == 6


async def test_tool_scheduler_drives_an_mcp_environment_on_openenvs_own_server(openenv_tally_url: str) -> None:
    scheduler = ToolScheduler(base_url=openenv_tally_url, max_turns=5)
    [trajectory] = await scheduler.run([RolloutRequest()], Tallier())
    assert trajectory.status == "done" and trajectory.reason == "no tool call"
    replies = [m["content"] for m in trajectory.messages if m["role"] == "user"][1:]
    # Each result in a <tool_response> block, as a Qwen chat template renders a tool turn.
    assert replies[0] == "<tool_response>\n4\n</tool_response>" and replies[2] == "<tool_response>\n5\n</tool_response>"
    assert replies[1].startswith("<tool_response>\nerror: ") and "Unknown tool" in replies[1]
    assert len(trajectory.steps) == 3 and trajectory.steps[1].info["tool_error"]["error_type"] == "tool_not_found"


async def test_the_random_policy_calls_the_listed_tools_with_arguments_from_their_schemas(ledger_url: str) -> None:
    from envsdk.policies import make_policy

    scheduler = ToolScheduler(base_url=ledger_url, max_turns=4)
    requests = [RolloutRequest(data_dict={"env_config": {"seed": s}}) for s in range(4)]
    done = await scheduler.run(requests, make_policy("auto", "ledger", seed=0))
    for trajectory in done:
        # Every reply is a call the server ran: the episode is played to max_turns, not "done" at turn 1.
        assert trajectory.status == "max_turns" and len(trajectory.steps) == 4, trajectory.reason
        for step in trajectory.steps:
            assert step.action["tool_name"] in {"deposit", "withdraw", "balance"}
            # Known tools, well-typed arguments: only the ledger itself may refuse (an overdraft).
            assert step.info.get("tool_error", {}).get("error_type") in (None, "execution_error"), step.info
            if step.action["tool_name"] != "balance":
                assert isinstance(step.action["arguments"]["amount"], int)


def test_a_server_says_whether_it_serves_tools(ledger_url: str) -> None:
    from envsdk.schedulers import scheduler_for, serves_tools
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, free_port, running_server

    assert serves_tools(ledger_url) and scheduler_for(ledger_url) == "tools"
    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as echo_url:
        assert not serves_tools(echo_url) and scheduler_for(echo_url) == "openenv"
    assert not serves_tools(f"http://127.0.0.1:{free_port()}")  # nothing answers: not a tool server
