"""Capacity is explicit, and every exit path frees the slot."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoObservation, running_server

from .envs import failing_factory
from .helpers import frame, wait_for_active, ws_url

RESET = frame(type="reset", data={})


@pytest.mark.timeout(30)
def test_capacity_is_refused_with_its_numbers_and_freed_by_a_close(serve_echo):
    url = serve_echo(max_concurrent_envs=4)
    held = [connect(ws_url(url)) for _ in range(4)]
    try:
        for ws in held:
            ws.send(RESET)
            assert json.loads(ws.recv(timeout=5))["type"] == "observation"
        with connect(ws_url(url)) as extra:
            refusal = json.loads(extra.recv(timeout=5))  # sent unasked, right after accept
            assert refusal["data"]["code"] == "CAPACITY_REACHED"
            assert refusal["data"]["message"] == (
                "Server at capacity: 4/4 sessions active. Cannot accept new connections."
            )
            assert refusal["data"]["active_sessions"] == 4 and refusal["data"]["max_sessions"] == 4
            assert refusal["data"]["retry_after_s"] > 0
            with pytest.raises(ConnectionClosed):
                extra.recv(timeout=5)
            assert extra.close_code == 1013
        health = httpx.get(url + "/health").json()
        assert (health["active_sessions"], health["max_sessions"]) == (4, 4)
        held[0].send(frame(type="close"))
        held.pop(0).close()
        assert wait_for_active(url, 3) == 3
        with connect(ws_url(url)) as newcomer:
            newcomer.send(RESET)
            assert json.loads(newcomer.recv(timeout=5))["type"] == "observation"
    finally:
        for ws in held:
            ws.close()
    assert wait_for_active(url, 0) == 0


async def _cycle(url: str, i: int) -> None:
    ws = await aconnect(ws_url(url))
    await ws.send(RESET)
    reply = json.loads(await ws.recv())
    assert reply["type"] == "observation", reply
    kind = i % 4
    if kind == 0:  # the protocol's close message
        await ws.send(frame(type="close"))
        await ws.wait_closed()
    elif kind == 1:  # a plain WebSocket close
        await ws.close()
    else:  # abrupt: TCP dropped, no close frame
        ws.transport.abort()


@pytest.mark.timeout(90)
async def test_a_thousand_open_close_cycles_half_abrupt_leave_no_session(serve_echo):
    url = await asyncio.to_thread(serve_echo, max_concurrent_envs=64)
    workers, cycles = 16, 1000

    async def worker(w: int) -> None:
        for i in range(w, cycles, workers):
            await _cycle(url, i)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    assert await asyncio.to_thread(wait_for_active, url, 0, 15.0) == 0
    metrics = httpx.get(url + "/metrics").text
    assert "envsdk_sessions_opened_total 1000" in metrics
    assert "envsdk_sessions_closed_total 1000" in metrics


@pytest.mark.timeout(30)
def test_factory_error_is_reported_and_holds_no_slot():
    app = create_app(failing_factory, EchoAction, EchoObservation, max_concurrent_envs=1)
    with running_server(app, log_config=None) as url:
        for _ in range(2):  # the failed session must not keep the single slot
            with connect(ws_url(url)) as ws:
                reply = json.loads(ws.recv(timeout=5))
                assert reply["data"]["code"] == "FACTORY_ERROR"
                assert "no env for you" in reply["data"]["message"]
                with pytest.raises(ConnectionClosed):
                    ws.recv(timeout=5)
        assert httpx.get(url + "/health").json()["active_sessions"] == 0


@pytest.mark.timeout(30)
def test_server_shutdown_closes_every_env():
    from .envs import CountingEnvironment

    CountingEnvironment.closed = 0
    app = create_app(CountingEnvironment, EchoAction, EchoObservation)
    with running_server(app, log_config=None) as url:
        sockets = [connect(ws_url(url)) for _ in range(3)]
        sockets[0].send(frame(type="session"))
        sockets[0].recv(timeout=5)  # a resumable session must be closed at shutdown too
        assert wait_for_active(url, 3) == 3
    for ws in sockets:
        ws.close()
    assert CountingEnvironment.closed == 3


@pytest.mark.timeout(30)
def test_configured_idle_timeout_closes_an_idle_session_with_1001(serve_echo):
    url = serve_echo(idle_timeout_s=0.3)
    with connect(ws_url(url)) as ws:
        ws.send(RESET)
        ws.recv(timeout=5)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)  # closed by the reaper, not by us
        assert ws.close_code == 1001
    assert wait_for_active(url, 0) == 0
