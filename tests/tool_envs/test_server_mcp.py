"""The MCP wire of envsdk's server: JSON-RPC over POST /mcp, WS /mcp and /ws, sessions created
over MCP and attached to /ws, exactly-once tool calls, production mode, build-time checks."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from examples.ledger_tools import LedgerEnvironment, create_ledger_app

pytestmark = pytest.mark.timeout(60)


def _rpc(url: str, method: str, params: dict[str, Any] | None = None, rid: int = 1) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
    reply = httpx.post(f"{url}/mcp", json=body, timeout=10)
    assert reply.status_code == 200
    return dict(reply.json())


def _ws(url: str, query: str = "") -> Any:
    return connect(url.replace("http://", "ws://") + "/ws" + query, open_timeout=10)


def _ask(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(frame))
    return dict(json.loads(ws.recv(timeout=10)))


def _active(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["active_sessions"])


def test_bad_json_rpc_gets_json_rpc_errors(ledger_url: str) -> None:
    empty = httpx.post(f"{ledger_url}/mcp", json={}, timeout=10).json()
    assert empty["jsonrpc"] == "2.0" and empty["error"]["code"] == -32600
    garbage = httpx.post(f"{ledger_url}/mcp", content=b"{nope", timeout=10).json()
    assert garbage["error"]["code"] == -32700
    assert _rpc(ledger_url, "resources/list")["error"]["code"] == -32601
    assert _rpc(ledger_url, "tools/call", {"arguments": {}})["error"]["code"] == -32602
    assert _rpc(ledger_url, "tools/list", {"session_id": "nobody.nothing"})["error"]["code"] == -32602


def test_tools_list_without_a_session_uses_a_throwaway_env(ledger_url: str) -> None:
    listed = _rpc(ledger_url, "tools/list")["result"]["tools"]
    assert [t["name"] for t in listed] == ["deposit", "withdraw", "balance"]
    assert listed[0]["inputSchema"]["properties"]["amount"]["type"] == "integer"
    assert _active(ledger_url) == 0


def test_a_session_created_over_mcp_attaches_to_ws_and_closes_over_mcp(ledger_url: str) -> None:
    before = _active(ledger_url)
    handle = _rpc(ledger_url, "openenv/session/create")["result"]["session_id"]
    assert len(handle.split(".")[1]) >= 40  # the resume token travels inside the handle
    with _ws(ledger_url, f"?session_id={handle}") as ws:
        start = _ask(ws, {"type": "reset", "data": {"seed": 2}})["data"]["observation"]["balance"]
        called = _rpc(ledger_url, "tools/call", {"name": "deposit", "arguments": {"amount": 4}, "session_id": handle})
        assert called["result"]["data"] == start + 4
        assert called["result"]["structured_content"] == {"result": start + 4}
        assert _ask(ws, {"type": "state"})["data"]["balance"] == start + 4
        closing = _rpc(ledger_url, "openenv/session/close", {"session_id": handle})["result"]
        assert closing == {"session_id": handle, "closed": False, "closing": True}
    deadline = time.monotonic() + 10
    while _active(ledger_url) > before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _rpc(ledger_url, "tools/list", {"session_id": handle})["error"]["code"] == -32602


def test_a_wrong_token_in_the_handle_is_refused(ledger_url: str) -> None:
    handle = _rpc(ledger_url, "openenv/session/create")["result"]["session_id"]
    session_id, token = handle.split(".")
    try:
        with _ws(ledger_url, f"?session_id={session_id}.{'A' * len(token)}") as ws:
            assert json.loads(ws.recv(timeout=10))["data"]["code"] == "RESUME_FAILED"
        with _ws(ledger_url, f"?session_id={session_id}") as ws:
            assert json.loads(ws.recv(timeout=10))["data"]["code"] == "RESUME_FAILED"
    finally:
        assert _rpc(ledger_url, "openenv/session/close", {"session_id": handle})["result"]["closed"] is True


def test_mcp_frames_and_tool_step_actions_on_ws(ledger_url: str) -> None:
    with _ws(ledger_url) as ws:
        start = _ask(ws, {"type": "reset", "data": {"seed": 9}})["data"]["observation"]["balance"]
        rpc = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "deposit", "arguments": {"amount": 1}}}
        reply = _ask(ws, {"type": "mcp", "data": rpc})
        assert reply["type"] == "mcp" and reply["data"]["id"] == 7 and reply["data"]["result"]["data"] == start + 1
        listed = _ask(ws, {"type": "step", "data": {"type": "list_tools"}})["data"]["observation"]
        assert [t["name"] for t in listed["tools"]] == ["deposit", "withdraw", "balance"]
        assert "input_schema" in listed["tools"][0]
        called = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "deposit", "arguments": {"amount": 2}}})
        assert called["data"]["observation"]["result"]["data"] == start + 3
        failed = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "withdraw", "arguments": {"amount": 999}}})
        assert failed["data"]["observation"]["error"]["error_type"] == "execution_error"
        assert _ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 8, "method": "nope"}})["data"]["error"]["code"] == -32601
        # A plain step of the env's own action still works.
        assert _ask(ws, {"type": "step", "data": {"note": "hi"}})["data"]["observation"]["balance"] == start + 3


def test_a_repeated_request_id_applies_a_tool_call_once(ledger_url: str) -> None:
    with _ws(ledger_url) as ws:
        assert _ask(ws, {"type": "session"})["type"] == "session"
        start = _ask(ws, {"type": "reset", "id": "r0", "data": {"seed": 4}})["data"]["observation"]["balance"]
        frame = {"type": "mcp", "id": "r1", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                     "params": {"name": "deposit", "arguments": {"amount": 5}}}}
        first, again = _ask(ws, frame), _ask(ws, frame)
        assert first == again and first["id"] == "r1"
        assert _ask(ws, {"type": "state", "id": "r2"})["data"]["balance"] == start + 5


def test_ws_mcp_endpoint_holds_a_session_per_socket(ledger_url: str) -> None:
    before = _active(ledger_url)  # resumable sessions of earlier tests may still be in their window
    with connect(ledger_url.replace("http://", "ws://") + "/mcp", open_timeout=10) as ws:
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "deposit", "arguments": {"amount": 3}}}))
        first = json.loads(ws.recv(timeout=10))["result"]["data"]
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "balance", "arguments": {}}}))
        assert json.loads(ws.recv(timeout=10))["result"]["data"] == first
        assert _active(ledger_url) == before + 1
        ws.send("{oops")
        assert json.loads(ws.recv(timeout=10))["error"]["code"] == -32700
    deadline = time.monotonic() + 10
    while _active(ledger_url) > before:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_session_create_is_refused_at_capacity() -> None:
    with running_server(create_ledger_app(max_concurrent_envs=1)) as url:
        with _ws(url) as ws:  # a connected session keeps its slot
            _ask(ws, {"type": "reset", "data": {"seed": 1}})
            refused = _rpc(url, "openenv/session/create")["error"]
            assert refused["data"]["code"] == "CAPACITY_REACHED" and refused["data"]["max_sessions"] == 1
        deadline = time.monotonic() + 10
        while _active(url):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first = _rpc(url, "openenv/session/create")["result"]["session_id"]
        # A session created over MCP with no socket gives its slot up to a newcomer.
        second = _rpc(url, "openenv/session/create")["result"]["session_id"]
        assert _rpc(url, "tools/list", {"session_id": first})["error"]["code"] == -32602
        assert _rpc(url, "openenv/session/close", {"session_id": second})["result"]["closed"] is True


def test_production_mode_drops_the_http_simulation_routes() -> None:
    with running_server(create_ledger_app(mode="production")) as url:
        assert httpx.post(f"{url}/reset", json={}, timeout=5).status_code in (404, 405)
        paths = httpx.get(f"{url}/openapi.json", timeout=5).json()["paths"]
        assert "/step" not in paths and "/state" not in paths and "/mcp" in paths
    with running_server(create_ledger_app(mode="simulation")) as url:
        assert httpx.post(f"{url}/reset", json={"seed": 1}, timeout=5).status_code == 200


def test_create_app_refuses_an_env_instance_with_openenvs_message() -> None:
    with pytest.raises(TypeError, match=r"env must be a callable \(class or factory function\)"):
        create_app(LedgerEnvironment(), EchoAction, EchoObservation)  # type: ignore[arg-type]


def test_a_non_tool_env_answers_mcp_with_an_error_not_a_crash() -> None:
    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as url:
        assert _rpc(url, "tools/list")["error"]["message"] == "Environment does not support MCP"
        with _ws(url) as ws:
            reply = _ask(ws, {"type": "step", "data": {"type": "list_tools"}})
            assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR"


def test_create_app_without_action_and_observation_types_serves_an_mcp_environment() -> None:
    from .envs import TallyMCPEnvironment

    with running_server(create_app(TallyMCPEnvironment, None, None)) as url:
        schema = httpx.get(f"{url}/schema", timeout=5).json()
        assert "metadata" in schema["action"]["properties"]
        tools = httpx.get(f"{url}/web/api/info", timeout=10).json()["tools"]
        assert {t["name"] for t in tools} == {"add", "tally", "nap", "fail"}
        assert _rpc(url, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}})["result"]["data"] == 3
        with _ws(url) as ws:
            called = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "tally", "arguments": {"x": 2}}})
            assert called["data"]["observation"]["result"]["data"] == 2


def test_a_close_frame_on_an_attached_socket_leaves_the_mcp_session_to_session_close(ledger_url: str) -> None:
    handle = _rpc(ledger_url, "openenv/session/create")["result"]["session_id"]
    with _ws(ledger_url, f"?session_id={handle}") as ws:
        _ask(ws, {"type": "reset", "data": {"seed": 1}})
        ws.send(json.dumps({"type": "close"}))
    listed = _rpc(ledger_url, "tools/call", {"name": "balance", "arguments": {}, "session_id": handle})
    assert "result" in listed, listed  # still there, as under OpenEnv
    assert _rpc(ledger_url, "openenv/session/close", {"session_id": handle})["result"]["closed"] is True
    assert _rpc(ledger_url, "tools/list", {"session_id": handle})["error"]["code"] == -32602


def test_ws_mcp_refuses_a_frame_over_the_frame_limit_and_goes_on() -> None:
    with running_server(create_ledger_app(max_frame_bytes=4096)) as url:
        with connect(url.replace("http://", "ws://") + "/mcp", open_timeout=10) as ws:
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "x" * 5000}}))
            refused = json.loads(ws.recv(timeout=10))["error"]
            assert refused["data"]["code"] == "FRAME_TOO_LARGE" and refused["data"]["limit"] == 4096
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            assert len(json.loads(ws.recv(timeout=10))["result"]["tools"]) == 3


def test_ws_mcp_closes_a_socket_that_sends_nothing_and_frees_its_slot() -> None:
    from websockets.exceptions import ConnectionClosed

    with running_server(create_ledger_app(first_frame_timeout_s=0.5)) as url:
        with connect(url.replace("http://", "ws://") + "/mcp", open_timeout=10) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        deadline = time.monotonic() + 10
        while _active(url):
            assert time.monotonic() < deadline
            time.sleep(0.05)
