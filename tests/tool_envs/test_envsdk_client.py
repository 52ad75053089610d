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


async def test_sync_tool_calls_run_on_the_sessions_own_thread(slow_url: str) -> None:
    async with EnvClient(slow_url) as one, EnvClient(slow_url) as two:
        thread_one = int((await one.reset()).observation["echoed_message"])
        thread_two = int((await two.reset()).observation["echoed_message"])
        assert thread_one != thread_two  # each session has its lane
        for _ in range(5):
            assert await one.call_tool("thread_id") == thread_one
            assert await two.call_tool("thread_id") == thread_two


async def test_an_envsdk_resume_and_the_mcp_handle_both_reach_a_session_made_over_mcp(ledger_url: str) -> None:
    import json as _json

    from websockets.asyncio.client import connect

    ws_base = ledger_url.replace("http://", "ws://") + "/ws"
    created = httpx.post(f"{ledger_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).json()
    handle = created["result"]["session_id"]
    async with connect(f"{ws_base}?session_id={handle}") as ws:
        await ws.send(_json.dumps({"type": "reset", "data": {"seed": 2}}))
        start = _json.loads(await ws.recv())["data"]["observation"]["balance"]
        await ws.send(_json.dumps({"type": "session"}))
        info = _json.loads(await ws.recv())["data"]
    session_id, token = info["session_id"], info["resume_token"]
    assert handle.startswith(session_id + ".") and token not in handle
    async with connect(f"{ws_base}?session_id={session_id}&resume_token={token}") as ws:  # envsdk resume
        await ws.send(_json.dumps({"type": "state"}))
        assert _json.loads(await ws.recv())["data"]["balance"] == start
    # The resume rotated the resume token; the MCP handle still names the session.
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "balance", "arguments": {}, "session_id": handle}}
    assert httpx.post(f"{ledger_url}/mcp", json=call).json()["result"]["data"] == start
    async with connect(f"{ws_base}?session_id={session_id}&resume_token={token}") as ws:
        assert _json.loads(await ws.recv())["data"]["code"] == "RESUME_FAILED"  # a token resumes once
    closed = httpx.post(f"{ledger_url}/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "openenv/session/close",
                                                   "params": {"session_id": handle}}).json()
    assert closed["result"]["closed"] is True
