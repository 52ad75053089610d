"""The server's and client's fast paths give the same results as the general paths they
shortcut: inline sync env calls, one-pass frame decoding, model-free observation encoding,
and uvicorn's WebSocket protocol with read pausing only under load."""

from __future__ import annotations

import json
import threading
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from envsdk.client import EnvClient
from envsdk.client.transports import WebSocketTransport
from envsdk.errors import EnvTimeoutError, ServerError
from envsdk.protocol import (
    REQUEST_TYPES,
    FrameError,
    decode_request,
    encode,
    encode_observation,
    observation_reply,
)
from envsdk.server import create_app
from envsdk.server.launch import request_reply_ws_protocol
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server


class ThreadRecordingEnv(EchoEnvironment):
    """Echo env that records the thread each step ran on."""

    threads: ClassVar[list[str]] = []

    def step(self, action: EchoAction) -> EchoObservation:
        type(self).threads.append(threading.current_thread().name)
        return super().step(action)


class InlineEnv(ThreadRecordingEnv):
    INLINE_SYNC = True
    threads: ClassVar[list[str]] = []


class PooledEnv(ThreadRecordingEnv):
    threads: ClassVar[list[str]] = []


async def _steps(url: str, n: int, *messages: str) -> list[Any]:
    async with EnvClient(url) as client:
        await client.reset()
        return [await client.step({"message": m}) for m in (messages or ("hi",) * n)]


@pytest.mark.timeout(30)
async def test_inline_env_steps_on_the_event_loop_thread_and_default_env_in_the_pool() -> None:
    for env_cls in (InlineEnv, PooledEnv):
        app = create_app(env_cls, EchoAction, EchoObservation, max_concurrent_envs=4, web=False)
        with running_server(app, ws=request_reply_ws_protocol()) as url:
            results = await _steps(url, 3)
        assert [r.observation["echoed_message"] for r in results] == ["hi"] * 3
    assert len(InlineEnv.threads) == 3 and not any(n.startswith("envsdk-env") for n in InlineEnv.threads)
    assert len(PooledEnv.threads) == 3 and all(n.startswith("envsdk-env") for n in PooledEnv.threads)


@pytest.mark.timeout(30)
async def test_inline_env_under_a_deadline_runs_in_the_pool_so_the_deadline_holds() -> None:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4, web=False,
        inline_sync=True, step_timeout_s=0.2,
    )
    with running_server(app) as url:
        async with EnvClient(url) as client:
            await client.reset()
            with pytest.raises(EnvTimeoutError):
                await client.step({"message": "sleep:1.0"})
            await client.reset()
            assert (await client.step({"message": "ok"})).observation["echoed_message"] == "ok"


@pytest.mark.timeout(30)
async def test_inline_env_errors_become_execution_errors_and_the_session_goes_on() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False, inline_sync=True)
    with running_server(app) as url:
        async with EnvClient(url) as client:
            await client.reset()
            with pytest.raises(ServerError, match="echo env raised on purpose") as info:
                await client.step({"message": "raise"})
            assert type(info.value) is ServerError and info.value.code == "EXECUTION_ERROR", repr(info.value)
            assert (await client.step({"message": "again"})).observation["echoed_message"] == "again"


@pytest.mark.timeout(30)
def test_pipelined_and_large_frames_are_all_answered_in_order_with_the_request_reply_protocol() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False, inline_sync=True)
    messages = [f"m{i}" for i in range(40)] + ["x" * 200_000, "last"]
    with (
        running_server(app, ws=request_reply_ws_protocol()) as url,
        connect(url.replace("http", "ws") + "/ws", compression=None, max_size=None) as ws,
    ):
        ws.send(json.dumps({"type": "reset"}))
        json.loads(ws.recv(timeout=10))
        for m in messages:  # all sent before any reply is read: reads must pause and resume
            ws.send(json.dumps({"type": "step", "data": {"message": m}}))
        echoed = [json.loads(ws.recv(timeout=10))["data"]["observation"]["echoed_message"] for _ in messages]
    assert echoed == messages


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
    reward=st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True),
    done=st.booleans(),
    metadata=st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    request_id=st.none() | st.text(max_size=16),
)
def test_encode_observation_writes_the_same_text_as_the_model_path(
    body: dict[str, Any], reward: Any, done: bool, metadata: dict[str, Any] | None, request_id: str | None
) -> None:
    fast = encode_observation(body, reward, done, metadata=metadata, request_id=request_id)
    slow = encode(observation_reply(body, reward, done, metadata=metadata, request_id=request_id))
    assert fast == slow


def _decode_general(raw: str) -> Any:
    """What decode_request answered before its one-pass path: json.loads, then the model."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return "INVALID_JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str) or obj["type"] not in REQUEST_TYPES:
        return "OTHER"
    try:
        return REQUEST_TYPES[obj["type"]].model_validate(obj)
    except ValueError:
        return "VALIDATION_ERROR"


frames = st.fixed_dictionaries(
    {"type": st.sampled_from(["step", "reset", "state", "close", "session", "nope"])},
    optional={
        "data": json_values,
        "id": st.none() | st.text(max_size=130) | st.integers(),
        "extra": st.integers(),
    },
).map(json.dumps)


@settings(max_examples=300, deadline=None)
@given(raw=frames | st.text(max_size=40))
def test_decode_request_agrees_with_json_loads_and_model_validate(raw: str) -> None:
    expected = _decode_general(raw)
    try:
        got: Any = decode_request(raw)
    except FrameError as exc:
        got = exc.code.value
    if isinstance(expected, str) and expected != "OTHER":
        assert got == expected
    elif expected == "OTHER":
        assert got in ("UNKNOWN_TYPE", "VALIDATION_ERROR")
    else:
        # repr: a NaN in the data compares unequal to itself
        assert repr(got) == repr(expected) and got.model_fields_set == expected.model_fields_set


def test_websocket_transport_does_not_ask_for_compression_by_default() -> None:
    assert WebSocketTransport().compression is None
