"""The MCP path keeps the step path's limits and the execution core's promises: bounded errors and
echoes, typed JSON-RPC errors for bad input, tools on the session's lane, MCP sessions that give
their slot up, the web page's tool list within capacity, and OpenEnv's step semantics for an
`MCPEnvironment`. Each attack runs against a real server on 127.0.0.1 while an honest client is
measured alongside."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import connect

from envsdk.server import create_app
from envsdk.testing import running_server
from examples.ledger_tools import create_ledger_app

from .envs import CallToolAction, CallToolObservation, QuizMCPEnvironment

pytestmark = pytest.mark.timeout(120)

# Largest reply an error about client input may take: 20 errors of 256-character echoes, and words.
_BOUNDED_REPLY = 24 * 1024


def _post(url: str, body: Any, timeout: float = 30) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/mcp", content=raw, headers={"content-type": "application/json"}, timeout=timeout)


def _rpc(url: str, method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    reply = _post(url, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
    assert reply.status_code == 200, reply.text[:500]
    return dict(reply.json())


def _honest_call(url: str) -> float:
    """Seconds an honest stateless ``tools/call`` takes; it must succeed."""
    started = time.monotonic()
    reply = _rpc(url, "tools/call", {"name": "lookup", "arguments": {"key": "k"}})
    assert reply["result"]["data"] == "k is 42", reply
    return time.monotonic() - started


def _ws(url: str, path: str = "/ws") -> Any:
    return connect(url.replace("http://", "ws://") + path, open_timeout=10, max_size=2**26)


def _ask(ws: Any, frame: dict[str, Any] | str) -> tuple[dict[str, Any], int]:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    raw = ws.recv(timeout=30)
    return dict(json.loads(raw)), len(raw)


@pytest.fixture(scope="module")
def quiz_url() -> Iterator[str]:
    app = create_app(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8)
    with running_server(app) as url:
        yield url


def _wide(n: int) -> dict[str, int]:
    return {f"k{i}": i for i in range(n)}


# ---------------------------------------------------------------- 4: wide tool arguments


def test_wide_tool_arguments_get_a_bounded_error_on_every_route(quiz_url: str) -> None:
    ledger_app = create_ledger_app(max_concurrent_envs=4, max_body_bytes=1024 * 1024)
    with running_server(ledger_app) as ledger_url:
        # A POST of 0.95 MiB: tens of thousands of unknown argument keys.
        wide = _wide(55_000)
        for url, name in ((ledger_url, "deposit"), (quiz_url, "lookup")):
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": wide}}
            assert len(json.dumps(body)) < 1024 * 1024
            reply = _post(url, body)
            assert reply.status_code == 200 and len(reply.content) < _BOUNDED_REPLY, len(reply.content)
            error = reply.json()["error"]
            assert len(error["data"]["errors"]) == 20, error
            assert error["data"]["errors_omitted"] >= 55_000 - 20
            assert "unknown" in error["message"]
        # Many wrong items of a list argument: the same bound (the env's own FastMCP validates).
        many = _rpc(quiz_url, "tools/call", {"name": "total", "arguments": {"values": ["x"] * 60_000}})
        assert len(json.dumps(many)) < _BOUNDED_REPLY, len(json.dumps(many))
        assert many["error"]["code"] == -32603
        # A 7 MiB frame of unknown keys over /ws, with a request id (the reply is recorded).
        rpc = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "lookup", "arguments": _wide(400_000)}}
        frame = json.dumps({"type": "mcp", "id": "w1", "data": rpc})
        with _ws(quiz_url) as ws:
            started = time.monotonic()
            reply, size = _ask(ws, frame)
            assert size < _BOUNDED_REPLY and reply["data"]["error"]["data"]["errors_omitted"] > 300_000
            assert time.monotonic() - started < 20
            assert _honest_call(quiz_url) < 3.0
            step, size = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "lookup", "arguments": _wide(50_000)}})
            assert size < _BOUNDED_REPLY and step["data"]["observation"]["error"]["error_type"] == "invalid_args"


# ---------------------------------------------------------------- 8: echoes


def test_mcp_echoes_at_most_256_characters_of_client_input(quiz_url: str) -> None:
    long = "m" * 900_000
    for method, params in (
        (long, {}),
        ("tools/list", {"session_id": long}),
        ("openenv/session/close", {"session_id": long}),
        ("tools/call", {"name": long, "arguments": {}}),
    ):
        reply = _post(quiz_url, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert reply.status_code == 200 and len(reply.content) < 2048, (method[:20], len(reply.content))
        assert "more characters" in reply.json()["error"]["message"]
    with _ws(quiz_url) as ws:
        reply, size = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": long, "arguments": {}}})
        assert size < 2048 and reply["data"]["observation"]["error"]["error_type"] == "tool_not_found"
    assert _honest_call(quiz_url) < 3.0


# ---------------------------------------------------------------- 11: bad Unicode, deep nesting


def test_bad_unicode_and_deep_ids_get_typed_json_rpc_errors_never_http_500(quiz_url: str) -> None:
    deep_id = "[" * 900 + "1" + "]" * 900
    for raw in (
        b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}',
        b'{"jsonrpc":"2.0","id":"\\udc00","method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"session_id":"a.\\ud800"}}',
        b'{"jsonrpc":"2.0","id":' + deep_id.encode() + b',"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":' + b"[" * 150 + b"1" + b"]" * 150 + b',"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}',
    ):
        reply = _post(quiz_url, raw)
        assert reply.status_code == 200, (raw[:60], reply.status_code, reply.text[:200])
        error = reply.json()["error"]
        assert error["code"] in (-32700, -32600) and reply.json()["id"] is None, error
    with _ws(quiz_url, "/mcp") as ws:
        for frame in (
            '{"jsonrpc":"2.0","id":' + deep_id + ',"method":"tools/list"}',
            '{"jsonrpc":"2.0","id":1,"method":"\\ud800"}',
        ):
            reply, _ = _ask(ws, frame)
            assert reply["error"]["code"] in (-32700, -32600), reply
        # The socket goes on serving.
        reply, _ = _ask(ws, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "lookup", "arguments": {"key": "z"}}})
        assert reply["result"]["data"] == "z is 42"
    assert _honest_call(quiz_url) < 3.0


# ---------------------------------------------------------------- 14: NOT_RESET after a TIMEOUT


def test_a_call_tool_step_after_a_timeout_gets_not_reset(slow_url: str) -> None:
    with _ws(slow_url) as ws:
        _ask(ws, {"type": "session"})  # an envsdk client: it reads envsdk's own error codes
        _ask(ws, {"type": "reset", "data": {}})
        hung, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "slow", "arguments": {"seconds": 3}}})
        assert hung["data"]["code"] == "TIMEOUT"
        after, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "thread_id", "arguments": {}}})
        assert after["type"] == "error" and after["data"]["code"] == "NOT_RESET", after
        listed, _ = _ask(ws, {"type": "step", "data": {"type": "list_tools"}})
        assert listed["data"]["code"] == "NOT_RESET"
        _ask(ws, {"type": "reset", "data": {}})
        again, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "thread_id", "arguments": {}}})
        assert isinstance(again["data"]["observation"]["result"]["data"], int)


# ---------------------------------------------------------------- 6: sync tools on lanes


def test_hung_sync_tools_of_an_mcp_environment_are_written_off_not_left_in_a_shared_pool() -> None:
    app = create_app(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=64, web=True)
    with running_server(app) as url:
        hang = {"name": "hang", "arguments": {"seconds": 8}}
        with ThreadPoolExecutor(45) as pool:
            replies = list(pool.map(lambda _: _rpc(url, "tools/call", hang), range(45), timeout=60))
        assert all(r["error"]["data"]["code"] == "TIMEOUT" for r in replies), replies[0]
        health = httpx.get(f"{url}/health", timeout=5).json()
        assert health["abandoned_threads"] >= 45, health
        # Honest clients, while the 45 hung calls still sleep: a tool call and a static file.
        assert _honest_call(url) < 3.0
        started = time.monotonic()
        assert httpx.get(f"{url}/web/static/app.js", timeout=10).status_code == 200
        assert time.monotonic() - started < 3.0


def test_a_hung_sync_tool_inside_a_step_times_the_step_out_and_the_session_starts_over(quiz_url: str) -> None:
    with _ws(quiz_url) as ws:
        _ask(ws, {"type": "session"})
        _ask(ws, {"type": "reset", "data": {}})
        started = time.monotonic()
        hung, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "hang", "arguments": {"seconds": 8}}})
        assert hung["data"]["code"] == "TIMEOUT" and time.monotonic() - started < 1.0 + 2.5, hung
        assert _honest_call(quiz_url) < 3.0
        after, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "lookup", "arguments": {"key": "a"}}})
        assert after["data"]["code"] == "NOT_RESET"
        _ask(ws, {"type": "reset", "data": {}})
        again, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "lookup", "arguments": {"key": "a"}}})
        assert again["data"]["observation"]["result"]["data"] == "a is 42"


# ---------------------------------------------------------------- 7: MCP sessions give their slot up


def test_sessions_created_over_mcp_give_their_slot_to_a_newcomer() -> None:
    app = create_app(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=2)
    with running_server(app) as url:
        handles = [_rpc(url, "openenv/session/create")["result"]["session_id"] for _ in range(2)]
        # The first one was used last, so the second is the one given up.
        assert "result" in _rpc(url, "tools/call", {"name": "lookup", "arguments": {"key": "a"}, "session_id": handles[0]})
        for _ in range(10):  # a client that keeps creating sessions and leaving them
            assert "session_id" in _rpc(url, "openenv/session/create")["result"]
        with _ws(url) as ws:  # an honest /ws client gets a slot too
            reset, _ = _ask(ws, {"type": "reset", "data": {}})
            assert reset["type"] == "observation"
        gone = _rpc(url, "tools/list", {"session_id": handles[1]})["error"]
        assert gone["code"] == -32602


def test_an_mcp_session_with_a_socket_attached_keeps_its_slot() -> None:
    app = create_app(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=1)
    with running_server(app) as url:
        handle = _rpc(url, "openenv/session/create")["result"]["session_id"]
        with _ws(url, f"/ws?session_id={handle}") as ws:
            _ask(ws, {"type": "reset", "data": {}})
            refused = _rpc(url, "openenv/session/create")["error"]
            assert refused["data"]["code"] == "CAPACITY_REACHED"
            reply, _ = _ask(ws, {"type": "state"})
            assert reply["type"] == "state"


# ---------------------------------------------------------------- 13: the web page's tool list


def test_the_web_page_lists_tools_within_capacity_and_builds_one_env() -> None:
    app = create_app(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=1, web=True)
    with running_server(app) as url:
        with _ws(url) as ws:  # the honest client holds the only slot
            _ask(ws, {"type": "reset", "data": {}})
            before = QuizMCPEnvironment.built
            with ThreadPoolExecutor(20) as pool:
                answers = list(pool.map(lambda _: httpx.get(f"{url}/web/api/info", timeout=30), range(20), timeout=60))
            assert QuizMCPEnvironment.built == before  # no env built past capacity
            assert all(a.status_code in (200, 503) for a in answers)
            reply, _ = _ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "lookup", "arguments": {"key": "q"}}})
            assert reply["type"] == "observation"
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health", timeout=5).json()["active_sessions"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = QuizMCPEnvironment.built
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: httpx.get(f"{url}/web/api/info", timeout=30), range(20), timeout=60))
        assert all(a.status_code == 200 for a in answers)
        assert {t["name"] for t in answers[0].json()["tools"]} == {"lookup", "submit_answer", "total", "hang"}
        assert QuizMCPEnvironment.built - before == 1


# ---------------------------------------------------------------- 17: OpenEnv's step semantics


@pytest.mark.parametrize("served_by", ["envsdk", "openenv"])
def test_call_tool_steps_go_through_the_envs_step_as_under_openenv(served_by: str) -> None:
    from openenv.core.env_server.http_server import create_app as openenv_create_app

    build = create_app if served_by == "envsdk" else openenv_create_app
    app = build(QuizMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=4)
    with running_server(app) as url, MCPToolClient(base_url=url).sync() as client:
        client.reset()
        first = client.step(CallToolAction(tool_name="lookup", arguments={"key": "answer"}))
        assert first.done is False
        last = client.step(CallToolAction(tool_name="submit_answer", arguments={"answer": "42"}))
        assert (last.reward, last.done) == (1.0, True)
        assert client.state().step_count == 2
        # A direct tools/call (POST /mcp) calls the tool only: no step is counted.
        assert client.call_tool("lookup", key="x") == "x is 42"
        assert client.state().step_count == 2
