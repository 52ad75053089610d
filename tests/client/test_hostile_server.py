"""The client against hostile or broken servers written for the test (real sockets): whatever
the peer sends, a call ends with a typed error within its timeouts, the client's sockets are
released, and a session is never silently continued on a stream that can no longer be trusted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from envsdk.client import (
    EnvClient,
    EnvPool,
    PoolSettings,
    Retry,
    Timeouts,
    WebSocketTransport,
)
from envsdk.errors import ConnectError, ProtocolError, SessionLostError
from envsdk.testing import free_port

pytestmark = pytest.mark.timeout(30)

_SESSION = {"session_id": "s1", "resume_token": "tok", "resume_window_s": 30}
_FAST = Timeouts(connect=2.0, request=2.0, close=1.0)
_FAST_RETRY = Retry(max_attempts=2, backoff_base=0.01)

Handler = Callable[[ServerConnection], Awaitable[None]]


def _frame(kind: str, data: dict[str, Any], request_id: str | None = None) -> str:
    frame: dict[str, Any] = {"type": kind, "data": data}
    if request_id is not None:
        frame["id"] = request_id
    return json.dumps(frame)


@asynccontextmanager
async def hostile(handler: Handler, **kwargs: Any) -> AsyncIterator[tuple[str, Server]]:
    """A WebSocket server on 127.0.0.1 running ``handler`` per connection; yields its base URL."""
    port = free_port()
    async with serve(handler, "127.0.0.1", port, **kwargs) as server:
        yield f"http://127.0.0.1:{port}", server


async def _wait_all_closed(server: Server, seconds: float = 3.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if not server.connections:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(server.connections)} connection(s) of the client are still open")


async def _first_call_raises(
    handler: Handler, call: Callable[[EnvClient], Awaitable[Any]], error: type[Exception], match: str
) -> None:
    """A client's first `call` against `handler` raises `error` (matching `match`), and once
    the client is closed no socket of it is left open on the server."""
    async with hostile(handler) as (url, server):
        client = EnvClient(url, timeouts=_FAST, retry=_FAST_RETRY)
        with pytest.raises(error, match=match):
            await call(client)
        await client.close()
        await _wait_all_closed(server)


async def test_upgrade_redirected_to_a_non_websocket_url_is_a_connect_error() -> None:
    # A proxy or login gateway answering the upgrade with 302 to an https:// page.
    def redirect(connection: ServerConnection, request: Request) -> Response:
        return Response(302, "Found", Headers([("Location", "http://127.0.0.1:9/login")]), b"")

    async def never(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async with hostile(never, process_request=redirect) as (url, _):
        client = EnvClient(url, timeouts=_FAST)
        with pytest.raises(ConnectError, match="login"):
            await client.connect()
        await client.close()


async def test_resume_answered_with_garbage_loses_the_session_and_closes_its_socket() -> None:
    connections = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        await ws.recv()  # the session handshake (a resume from the second connection on)
        if connections == 1:
            await ws.send(_frame("session", _SESSION))
            await ws.recv()  # the reset
            await ws.close(1011)  # dropped mid-reset: the client resumes
        else:
            await ws.send("<html>502 Bad Gateway</html>")
            await ws.wait_closed()

    async with hostile(handler) as (url, server):
        client = EnvClient(url, timeouts=_FAST, retry=_FAST_RETRY)
        with pytest.raises(SessionLostError, match="502 Bad Gateway"):
            await client.reset()
        with pytest.raises(SessionLostError):
            await client.state()
        await client.close()
        await _wait_all_closed(server)
        assert connections == 2  # one resume attempt, then the session is given up


async def test_garbage_frame_without_request_ids_loses_the_session_not_shifts_replies() -> None:
    # A plain OpenEnv peer (no ids) that sends a stray frame before its real reply: the reply
    # that follows would be read as the next call's answer, a step given the reset's observation.
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("error", {"message": "Unknown message type: session", "code": "UNKNOWN_TYPE"}))
        await ws.recv()  # reset
        await ws.send("garbage")
        await ws.send(_frame("observation", {"observation": {"answers": "reset"}, "reward": 0.0, "done": False}))
        await ws.recv()  # the next call
        await ws.send(_frame("observation", {"observation": {"answers": "step"}, "reward": 1.0, "done": True}))
        await ws.wait_closed()

    async with hostile(handler) as (url, server):
        client = EnvClient(url, timeouts=_FAST, retry=_FAST_RETRY)
        await client.connect()
        assert client.server_kind == "openenv"
        with pytest.raises(SessionLostError, match="garbage"):
            await client.reset()
        with pytest.raises(SessionLostError):
            await client.step({"message": "x"})
        await client.close()
        await _wait_all_closed(server)



async def test_reply_nested_past_the_recursion_limit_is_a_protocol_error() -> None:
    # pydantic-core refuses it as too deep; the stdlib parser tried next raised RecursionError.
    deep = '{"type": "observation", "data": {"observation": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}}"

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("session", _SESSION))
        request = json.loads(await ws.recv())
        await ws.send(deep.replace('"type"', f'"id": "{request["id"]}", "type"', 1))
        await ws.wait_closed()

    await _first_call_raises(handler, lambda client: client.reset(), ProtocolError, "not a known reply")


async def test_reply_over_the_clients_frame_limit_is_reported_as_the_clients_limit() -> None:
    # The client refused the frame (1009 from its side): the message named the server as the
    # one that closed with 1009, which reads as "the request was too big".
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("session", _SESSION))
        request = json.loads(await ws.recv())
        await ws.send(_frame("observation", {"observation": {"pad": "x" * 200_000}}, request["id"]))
        await ws.wait_closed()

    async with hostile(handler) as (url, server):
        transport = WebSocketTransport(max_frame_bytes=100_000)
        client = EnvClient(url, timeouts=_FAST, retry=_FAST_RETRY, transport=transport)
        with pytest.raises(SessionLostError, match="max_frame_bytes=100000") as info:
            await client.reset()
        assert "the server closed" not in str(info.value)
        await client.close()
        await _wait_all_closed(server)


async def test_resume_answered_by_another_session_does_not_leak_its_resume_token() -> None:
    # A server that lost its state answers the resume with a fresh session of its own: the
    # error (logged, written into records) quoted that session's resume token, which lets its
    # reader take that session over.
    connections = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        await ws.recv()
        if connections == 1:
            await ws.send(_frame("session", _SESSION))
            await ws.recv()
            await ws.close(1011)
        else:
            other = {"session_id": "s2", "resume_token": "SECRET-OF-S2", "resume_window_s": 30}
            await ws.send(_frame("session", other))
            await ws.wait_closed()

    async with hostile(handler) as (url, server):
        client = EnvClient(url, timeouts=_FAST, retry=_FAST_RETRY)
        with pytest.raises(SessionLostError, match="s2") as info:
            await client.reset()
        assert "SECRET-OF-S2" not in str(info.value)
        await client.close()
        await _wait_all_closed(server)


async def test_reward_of_more_digits_than_a_float_holds_is_a_protocol_error() -> None:
    # An int reward of 401 digits is a JSON number pydantic keeps as an int: float() of it
    # raised a bare OverflowError out of reset().
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("session", _SESSION))
        request_id = json.loads(await ws.recv())["id"]
        huge = "1" + "0" * 400
        await ws.send(
            f'{{"id": "{request_id}", "type": "observation", "data": '
            f'{{"observation": {{}}, "reward": {huge}, "done": false}}}}'
        )
        await ws.wait_closed()

    await _first_call_raises(handler, lambda client: client.reset(), ProtocolError, "reward")


@pytest.mark.parametrize(
    "tools",
    [["echo"], [{"description": "no name"}], [{"name": "echo", "inputSchema": [1, 2]}]],
    ids=["a string", "no name", "a list for a schema"],
)
async def test_malformed_tool_list_is_a_protocol_error(tools: list[Any]) -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("session", _SESSION))
        request = json.loads(await ws.recv())
        rpc = {"jsonrpc": "2.0", "id": request["data"]["id"], "result": {"tools": tools}}
        await ws.send(_frame("mcp", rpc, request["id"]))
        await ws.wait_closed()

    await _first_call_raises(handler, lambda client: client.list_tools(), ProtocolError, "tools/list")


@pytest.mark.parametrize(
    "answer",
    [{"error": "the tool crashed"}, {}],
    ids=["an error that is a string", "neither result nor error"],
)
async def test_tool_call_answer_without_a_result_is_a_protocol_error_not_none(answer: dict[str, Any]) -> None:
    # call_tool() returned None for these, as if the tool had returned nothing.
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(_frame("session", _SESSION))
        request = json.loads(await ws.recv())
        await ws.send(_frame("mcp", {"jsonrpc": "2.0", "id": request["data"]["id"], **answer}, request["id"]))
        await ws.wait_closed()

    await _first_call_raises(handler, lambda client: client.call_tool("echo", text="hi"), ProtocolError, "tools/call")

_PADDED_HEALTH = b'{"active_sessions": 0, "max_sessions": 4, "pad": "' + b"x" * (4 << 20) + b'"}'
_HEALTH_ANSWERS = {
    "no HTTP at all": b"SSH-2.0-OpenSSH_9.6\r\n",
    "a body shorter than its length": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{",
    "a header line of 100 kB": b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\n{}",
    "JSON nested 100000 deep": b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100_000,
    "a 4 MB body": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(_PADDED_HEALTH), _PADDED_HEALTH),
}


@pytest.mark.parametrize("answer", list(_HEALTH_ANSWERS))
async def test_pool_health_poll_answered_by_a_broken_server_marks_it_failed(answer: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(_HEALTH_ANSWERS[answer])
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        pool = EnvPool([f"http://127.0.0.1:{port}"], settings=PoolSettings(health_timeout_s=2.0))
        await pool.refresh_health(force=True)  # raised http.client's or json's own error before
        (status,) = pool.servers()
        assert status.failures == 1
        assert status.last_error is not None and "/health failed" in status.last_error
        assert status.max_sessions is None
    finally:
        server.close()
        await server.wait_closed()


async def test_pool_health_poll_stops_reading_a_trickling_body_at_its_timeout() -> None:
    hung_up = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
        try:
            for _ in range(150):  # 15 s at most: a few bytes, never the whole body
                writer.write(b" " * 100)
                await writer.drain()
                await asyncio.sleep(0.1)
        except ConnectionError:
            hung_up.set()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        pool = EnvPool([f"http://127.0.0.1:{port}"], settings=PoolSettings(health_timeout_s=0.5))
        await pool.refresh_health(force=True)
        (status,) = pool.servers()
        assert status.failures == 1
        # The poll's thread hangs up soon after the timeout, not when the server stops sending.
        await asyncio.wait_for(hung_up.wait(), 5.0)
    finally:
        server.close()
        await server.wait_closed()
