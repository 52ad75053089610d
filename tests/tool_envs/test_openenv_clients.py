"""OpenEnv 0.10's own MCP client and validator against envsdk servers, unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from openenv.core.env_server.mcp_types import ListToolsAction
from openenv.core.mcp_client import MCPToolClient

pytestmark = pytest.mark.timeout(120)


def _active(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["active_sessions"])


def _wait_active(url: str, n: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while _active(url) != n:
        assert time.monotonic() < deadline, f"active sessions stayed {_active(url)}, expected {n}"
        time.sleep(0.05)


def test_mcp_tool_client_plays_the_native_ledger(ledger_url: str) -> None:
    with MCPToolClient(base_url=ledger_url).sync() as first, MCPToolClient(base_url=ledger_url).sync() as second:
        one = first.reset(seed=3)
        two = second.reset(seed=4)
        assert one.observation.balance != two.observation.balance or one.observation.target != two.observation.target
        tools = first.list_tools()
        assert [t.name for t in tools] == ["deposit", "withdraw", "balance"]
        deposit = next(t for t in tools if t.name == "deposit")
        assert deposit.input_schema["properties"]["amount"]["type"] == "integer"
        assert "Add money" in deposit.description
        start_one = first.call_tool("balance")
        start_two = second.call_tool("balance")
        assert first.call_tool("deposit", amount=7) == start_one + 7
        # The other session's ledger did not move.
        assert second.call_tool("balance") == start_two
        assert second.call_tool("deposit", amount=1) == start_two + 1
        assert first.state().step_count == 1 and second.state().step_count == 1
        with pytest.raises(RuntimeError, match="cannot withdraw"):
            first.call_tool("withdraw", amount=1000)
        assert _active(ledger_url) == 2
    _wait_active(ledger_url, 0)


def test_mcp_tool_client_plays_an_openenv_mcp_environment_on_envsdk(tally_url: str) -> None:
    with MCPToolClient(base_url=tally_url).sync() as first, MCPToolClient(base_url=tally_url).sync() as second:
        first.reset()
        second.reset()
        assert {t.name for t in first.list_tools()} == {"add", "tally", "nap", "fail"}
        assert first.call_tool("add", a=2, b=3) == 5
        assert first.call_tool("tally", x=5) == 5
        assert first.call_tool("tally", x=5) == 10
        assert second.call_tool("tally", x=1) == 1
        with pytest.raises(RuntimeError, match="boom"):
            first.call_tool("fail", message="boom")
        with pytest.raises(RuntimeError, match="Unknown tool"):
            first.call_tool("nope")
        # The step action OpenEnv's client sends for tools is answered on the session too.
        result = first.step(ListToolsAction())
        assert {t.name for t in result.observation.tools} == {"add", "tally", "nap", "fail"}
        assert _active(tally_url) == 2
    _wait_active(tally_url, 0)


@pytest.mark.parametrize("which", ["ledger_url", "tally_url"])
def test_openenv_validate_url_passes_every_criterion(which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "openenv"), "validate", "--url", url, "--json"],
        capture_output=True, text=True, timeout=60,
    )
    report = json.loads(out.stdout)
    failed = [c["id"] for c in report["criteria"] if not c["passed"]]
    assert failed == [], out.stdout
    assert report["summary"]["passed_count"] == report["summary"]["total_count"] == 6
    assert report["mode"] == "production"
