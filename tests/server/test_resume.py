"""Session handshake, resume after a dropped socket, exactly-once request ids."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from .helpers import frame, wait_for_active, ws_url


async def _call(ws, raw: str) -> dict:
    await ws.send(raw)
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


def _resume_url(url: str, info: dict) -> str:
    return ws_url(url, f"session_id={info['session_id']}&resume_token={info['resume_token']}")


@pytest.mark.timeout(30)
async def test_a_resent_step_after_resume_is_answered_from_the_record_not_applied_twice(serve_echo):
    url = await asyncio.to_thread(serve_echo, resume_window_s=5.0)
    ws = await connect(ws_url(url))
    info = (await _call(ws, frame(type="session", id="h")))["data"]
    assert info["resumed"] is False and info["resume_window_s"] == 5.0
    await _call(ws, frame(type="reset", data={}, id="r1"))
    first = await _call(ws, frame(type="step", data={"message": "hello"}, id="s1"))
    assert first["id"] == "s1" and first["data"]["observation"]["echoed_message"] == "hello"
    ws.transport.abort()  # no close frame

    async with connect(_resume_url(url, info)) as ws2:
        again = await _call(ws2, frame(type="step", data={"message": "hello"}, id="s1"))
        assert again == first
        state = await _call(ws2, frame(type="state"))
        assert state["data"]["step_count"] == 1  # not applied twice
        after = await _call(ws2, frame(type="session"))
        assert after["data"]["resumed"] is True and after["data"]["step_count"] == 1
        nxt = await _call(ws2, frame(type="step", data={"message": "next"}, id="s2"))
        assert nxt["data"]["observation"]["metadata"] == {"step": 2}  # same episode continues
    assert httpx.get(url + "/health").json()["active_sessions"] == 1  # kept for the window


@pytest.mark.timeout(30)
async def test_a_step_in_flight_when_the_socket_drops_is_awaited_by_the_resent_request(serve_echo):
    url = await asyncio.to_thread(serve_echo, resume_window_s=5.0)
    ws = await connect(ws_url(url))
    info = (await _call(ws, frame(type="session")))["data"]
    await _call(ws, frame(type="reset", data={}))
    await ws.send(frame(type="step", data={"message": "sleep:0.5"}, id="slow"))
    await asyncio.sleep(0.1)  # the step is running now
    ws.transport.abort()
    async with connect(_resume_url(url, info)) as ws2:
        reply = await _call(ws2, frame(type="step", data={"message": "sleep:0.5"}, id="slow"))
        assert reply["id"] == "slow" and reply["data"]["observation"]["echoed_message"] == "sleep:0.5"
        assert (await _call(ws2, frame(type="state")))["data"]["step_count"] == 1


@pytest.mark.timeout(30)
async def test_resume_with_a_bad_token_fails_and_a_resume_supersedes_the_old_socket(serve_echo):
    url = await asyncio.to_thread(serve_echo, resume_window_s=5.0)
    async with connect(ws_url(url)) as ws:
        info = (await _call(ws, frame(type="session")))["data"]
        bad = dict(info, resume_token="not-the-token")
        async with connect(_resume_url(url, bad)) as intruder:
            refusal = json.loads(await asyncio.wait_for(intruder.recv(), 10))
            assert refusal["data"]["code"] == "RESUME_FAILED"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(intruder.recv(), 10)
            assert intruder.close_code == 4404
        async with connect(ws_url(url, "session_id=unknown&resume_token=x")) as stranger:
            assert json.loads(await asyncio.wait_for(stranger.recv(), 10))["data"]["code"] == "RESUME_FAILED"
        async with connect(_resume_url(url, info)) as ws2:
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 4409
            assert (await _call(ws2, frame(type="reset", data={})))["type"] == "observation"


@pytest.mark.timeout(30)
async def test_a_dropped_resumable_session_is_freed_when_the_window_expires(serve_echo):
    url = await asyncio.to_thread(serve_echo, resume_window_s=0.5)
    ws = await connect(ws_url(url))
    info = (await _call(ws, frame(type="session")))["data"]
    ws.transport.abort()
    await asyncio.sleep(0.1)
    assert httpx.get(url + "/health").json()["active_sessions"] == 1
    assert await asyncio.to_thread(wait_for_active, url, 0, 5.0) == 0
    async with connect(_resume_url(url, info)) as late:
        assert json.loads(await asyncio.wait_for(late.recv(), 10))["data"]["code"] == "RESUME_FAILED"


@pytest.mark.timeout(30)
async def test_a_session_without_handshake_is_destroyed_at_disconnect(serve_echo):
    url = await asyncio.to_thread(serve_echo, resume_window_s=30.0)
    ws = await connect(ws_url(url))
    await _call(ws, frame(type="reset", data={}))
    ws.transport.abort()
    assert await asyncio.to_thread(wait_for_active, url, 0, 5.0) == 0
