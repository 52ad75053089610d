"""Graceful shutdown: SIGTERM lets the steps in flight finish, tells every client, frees every
session, and the client reports it as a shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from envsdk.client import EnvClient, Keepalive
from envsdk.errors import ServerShutdownError, SessionLostError

from .envs import CLOSE_LOG_ENV
from .helpers import start_server, stop_server


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


@pytest.mark.timeout(60)
async def test_sigterm_finishes_the_step_in_flight_then_closes_1001_and_closes_every_env(tmp_path):
    close_log = tmp_path / "closes.txt"
    close_log.touch()
    server = await asyncio.to_thread(
        start_server, "reliability.envs:CloseLoggingEnvironment", tmp_path / "server.log",
        env={CLOSE_LOG_ENV: str(close_log)},
    )
    try:
        client = EnvClient(server.url, keepalive=Keepalive.disabled())
        await client.connect()
        await client.reset(episode_id="stepping")
        idle = await connect(_ws(server.url))  # a plain OpenEnv-style session, idle at shutdown
        await idle.send(json.dumps({"type": "reset", "data": {"episode_id": "idle"}}))
        assert json.loads(await idle.recv())["type"] == "observation"

        step = asyncio.ensure_future(client.step({"message": "sleep:1.0"}))
        await asyncio.sleep(0.3)  # the step is sleeping in the server's worker thread
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)

        result = await asyncio.wait_for(step, 10)  # finished, not cut off
        assert result.observation["echoed_message"] == "sleep:1.0"
        with pytest.raises(ServerShutdownError, match="shutting down") as info:
            await client.state()
        assert isinstance(info.value, SessionLostError) and info.value.session_id == client.session_id

        told = json.loads(await asyncio.wait_for(idle.recv(), 10))
        assert told["type"] == "error" and told["data"]["code"] == "SHUTTING_DOWN"
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(idle.recv(), 10)
        assert (idle.close_code, idle.close_reason) == (1001, "server shutting down")

        await asyncio.to_thread(server.proc.wait, 15)
        assert time.monotonic() - sigterm_at < 10
        assert sorted(close_log.read_text().split("\n")[:-1]) == ["closed idle", "closed stepping"]
        assert "Traceback" not in server.log(), server.log()
        await client.close()
    finally:
        await asyncio.to_thread(stop_server, server, signal.SIGKILL)


@pytest.mark.timeout(60)
async def test_a_step_longer_than_the_drain_timeout_is_answered_shutting_down(tmp_path):
    close_log = tmp_path / "closes.txt"
    close_log.touch()
    server = await asyncio.to_thread(
        start_server, "reliability.apps:short_drain", tmp_path / "server.log",
        env={CLOSE_LOG_ENV: str(close_log)},
    )
    try:
        client = EnvClient(server.url, keepalive=Keepalive.disabled())
        await client.reset(episode_id="long")
        step = asyncio.ensure_future(client.step({"message": "sleep:3"}))
        await asyncio.sleep(0.3)
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ServerShutdownError, match="shutting down"):
            await asyncio.wait_for(step, 10)
        # The drain (0.3 s) gave up on the step: the client heard at once, not after 3 s.
        assert time.monotonic() - sigterm_at < 2.0
        await asyncio.to_thread(server.proc.wait, 15)
        # The env was still closed, once its step returned.
        assert close_log.read_text() == "closed long\n"
        await client.close()
    finally:
        await asyncio.to_thread(stop_server, server, signal.SIGKILL)
