"""envsdk's client (`EnvClient.list_tools` / `call_tool`, and the blocking `OpenEnvWrapper`)
against envsdk's server and against OpenEnv 0.10's own MCP server."""

from __future__ import annotations

import re

import httpx
import pytest

from envsdk.client import EnvClient, OpenEnvWrapper
from envsdk.errors import EnvTimeoutError, ToolCallError

pytestmark = pytest.mark.timeout(60)


def _tool_calls(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(r"^envsdk_tool_calls_total (\d+)$", text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


async def test_envsdk_client_calls_native_tools_and_the_server_counts_them(ledger_url: str) -> None:
    before = _tool_calls(ledger_url)
    async with EnvClient(ledger_url) as env:
        first = await env.reset(seed=1)
        tools = await env.list_tools()
        assert [t.name for t in tools] == ["deposit", "withdraw", "balance"]
        assert tools[1].input_schema["required"] == ["amount"]
        start = first.observation["balance"]
        assert await env.call_tool("deposit", amount=10) == start + 10
        assert await env.call_tool("balance") == start + 10
        with pytest.raises(ToolCallError, match="cannot withdraw") as failed:
            await env.call_tool("withdraw", amount=1000)
        assert failed.value.code == "-32603"
        with pytest.raises(ToolCallError, match="Unknown tool"):
            await env.call_tool("transfer", amount=1)
        with pytest.raises(ToolCallError, match="amount"):
            await env.call_tool("deposit", amount="lots")
        assert (await env.state())["balance"] == start + 10
    assert _tool_calls(ledger_url) - before == 5


@pytest.mark.parametrize("which", ["tally_url", "openenv_tally_url"])
async def test_envsdk_client_calls_openenv_mcp_tools_on_both_servers(which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    async with EnvClient(url) as one, EnvClient(url) as two:
        await one.reset()
        await two.reset()
        assert {t.name for t in await one.list_tools()} == {"add", "tally", "nap", "fail"}
        assert await one.call_tool("add", a=20, b=22) == 42
        assert await one.call_tool("tally", x=3) == 3
        assert await one.call_tool("tally", x=3) == 6
        assert await two.call_tool("tally", x=1) == 1  # its own env
        with pytest.raises(ToolCallError, match="kaput"):
            await one.call_tool("fail", message="kaput")
        # The session goes on after a failed tool call.
        assert await one.call_tool("tally", x=1) == 7


def test_openenv_wrapper_lists_and_calls_tools(ledger_url: str) -> None:
    with OpenEnvWrapper(ledger_url) as env:
        start = env.reset(seed=5).observation["balance"]
        assert "withdraw" in [t.name for t in env.list_tools()]
        assert env.call_tool("deposit", amount=5) == start + 5


async def test_a_tool_call_past_the_step_deadline_is_a_timeout_that_ends_the_episode(slow_url: str) -> None:
    async with EnvClient(slow_url) as env:
        await env.reset()
        assert await env.call_tool("bump") == 1
        with pytest.raises(EnvTimeoutError):
            await env.call_tool("slow", seconds=3.0)
        # As after a timed-out step: the env was discarded; a reset builds a fresh one.
        with pytest.raises(ToolCallError):
            await env.call_tool("bump")
        await env.reset()
        assert await env.call_tool("bump") == 1
