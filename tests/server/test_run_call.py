"""`Session.run_call`, the one way any env call (a future tool call included) gets a session's
lane, deadline and exactly-once record: driven on a real server's event loop, next to a real
WebSocket session."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from websockets.sync.client import connect

from envsdk.protocol import dumps
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from .helpers import frame, ws_url


def _reply(result: Any) -> str:
    return dumps({"type": "tool_result", "data": result})


@pytest.mark.timeout(60)
def test_run_call_runs_on_the_session_lane_once_per_request_id_under_a_deadline() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url, connect(ws_url(url)) as ws:
        ws.send(frame(type="reset", data={}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        table = app.state.envsdk_sessions
        (session,) = table.sessions()
        loop = table.executors._loop

        def run(coro: Coroutine[Any, Any, str]) -> dict[str, Any]:
            return json.loads(asyncio.run_coroutine_threadsafe(coro, loop).result(10))  # type: ignore[no-any-return]

        threads: list[int] = []

        def tool(x: int) -> dict[str, int]:
            threads.append(threading.get_ident())
            return {"sum": x + 1}

        first = run(session.run_call("tool", tool, 1, reply=_reply, request_id="t1", request_hash=b"a"))
        assert first == {"type": "tool_result", "data": {"sum": 2}}
        assert run(session.run_call("tool", tool, 1, reply=_reply, request_id="t1", request_hash=b"a")) == first
        assert threads == [session._lane.thread.ident]  # ran once, on the session's own thread
        reused = run(session.run_call("tool", tool, 7, reply=_reply, request_id="t1", request_hash=b"b"))
        assert reused["data"]["code"] == "ID_REUSED" and len(threads) == 1
        as_json_rpc = run(session.run_call(
            "tool", tool, 7, reply=_reply, request_id="t1", request_hash=b"b",
            error_reply=lambda e: dumps({"jsonrpc": "2.0", "error": {"code": -32603, "message": e.code.value}}),
        ))
        assert as_json_rpc["error"]["message"] == "ID_REUSED"

        unencodable = run(session.run_call("tool", tool, 1, reply=lambda r: dumps(object()), request_id="t2"))
        assert unencodable["data"]["code"] == "EXECUTION_ERROR" and unencodable["id"] == "t2"

        async def async_tool() -> int:
            return threading.get_ident()

        on_loop = run(session.run_call("tool", async_tool, reply=_reply))
        assert on_loop["data"] != session._lane.thread.ident  # a coroutine runs on the loop

        started = time.monotonic()
        hung = run(session.run_call("tool", time.sleep, 3.0, reply=_reply, deadline_s=0.2))
        assert hung["data"]["code"] == "TIMEOUT" and time.monotonic() - started < 2.0
        ws.send(frame(type="step", data={"message": "x"}, id="s1"))  # a timed-out call ends the episode
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "NOT_RESET"
        ws.send(frame(type="reset", data={}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
