"""Faults survived: a client killed mid-step, the server killed and restarted mid-episode under
a scheduler, a network blackhole longer than the resume window, a hanging reset, a raising
close. (Raising and hanging steps are covered in tests/server.)"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from client.conftest import TcpProxy
from schedulers.policies import ScriptedPolicy
from server.helpers import frame, wait_for_active, ws_url

from envsdk.client import EnvClient, Keepalive, Retry, Timeouts
from envsdk.env import RolloutRequest
from envsdk.errors import EnvTimeoutError, SessionLostError
from envsdk.schedulers import OpenEnvScheduler
from envsdk.server import create_app
from envsdk.testing import (
    EchoAction,
    EchoEnvironment,
    EchoObservation,
    free_port,
    running_server,
)

from .envs import HANG_SEED, HangingResetEnvironment, RaisingCloseEnvironment
from .helpers import start_server, stop_server, tracebacks

# The client of the kill test: a session handshake (so the session is kept for a resume),
# a reset, then a step that sleeps in the server; it is SIGKILLed during that sleep.
_DOOMED_CLIENT = """
import asyncio, sys
from envsdk.client import EnvClient

async def main():
    client = EnvClient(sys.argv[1])
    await client.connect()
    await client.reset()
    print("stepping", flush=True)
    await client.step({"message": "sleep:0.5"})

asyncio.run(main())
"""


@pytest.mark.timeout(30)
def test_a_client_killed_mid_step_keeps_its_slot_for_the_resume_window_then_frees_it_quietly(caplog):
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, resume_window_s=1.5)
    with running_server(app, log_config=None) as url:
        proc = subprocess.Popen([sys.executable, "-c", _DOOMED_CLIENT, url], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "stepping"
            time.sleep(0.2)  # the step is now sleeping in the server
            proc.kill()
            proc.wait(5)
            killed_at = time.monotonic()
            time.sleep(0.3)
            assert httpx.get(url + "/health").json()["active_sessions"] == 1  # waiting for a resume
            assert wait_for_active(url, 0, timeout_s=10) == 0
            assert time.monotonic() - killed_at >= 1.2  # freed by the window, not before
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert tracebacks(caplog.records) == []


def _rows(url: str, n: int) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": i, "system_message": f"row {i}"}})
            for i in range(n)]


@pytest.mark.timeout(90)
async def test_a_server_killed_and_restarted_mid_episode_fails_only_the_running_trajectories(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    server = await asyncio.to_thread(start_server, "envsdk.testing:EchoEnvironment", log, port=port)
    slow_rows = {3, 4, 5}
    mid_episode = asyncio.Event()

    def reply(turn: int, messages: list[dict[str, Any]]) -> str:
        row = int(messages[0]["content"].split()[1])
        if row not in slow_rows:
            return ["a", "done"][turn]
        if turn == 2:
            mid_episode.set()
        return "sleep:0.4"

    def client_factory(base_url: str) -> EnvClient:
        # Enough reconnect attempts to outlast the restart, so the resume reaches the new server.
        return EnvClient(base_url, retry=Retry(max_attempts=60, backoff_base=0.05, backoff_max=0.25))

    scheduler = OpenEnvScheduler(max_turns=8, client_factory=client_factory)
    try:
        batch = asyncio.ensure_future(scheduler.run(_rows(server.url, 6), ScriptedPolicy(reply)))
        await asyncio.wait_for(mid_episode.wait(), 30)
        await asyncio.to_thread(stop_server, server, signal.SIGKILL)
        server = await asyncio.to_thread(start_server, "envsdk.testing:EchoEnvironment", log, port=port)
        trajectories = await asyncio.wait_for(batch, 60)

        statuses = {i: t.status for i, t in enumerate(trajectories)}
        assert statuses == {0: "done", 1: "done", 2: "done", 3: "error", 4: "error", 5: "error"}
        for i in slow_rows:
            lost = trajectories[i]
            assert lost.error_kind == "SessionLostError", lost.reason
            assert "refused to resume" in (lost.reason or ""), lost.reason  # never a silent new episode
            assert len(lost.steps) >= 1  # it was mid-episode
        assert wait_for_active(server.url, 0) == 0  # the refused resumes opened no session
        again = await OpenEnvScheduler(max_turns=3).run(_rows(server.url, 2), ScriptedPolicy(["a", "done"]))
        assert [t.status for t in again] == ["done", "done"]
    finally:
        await asyncio.to_thread(stop_server, server, signal.SIGKILL)


class BlackholeProxy(TcpProxy):
    """`TcpProxy` that can swallow bytes instead of cutting: while ``blackholed`` nothing
    passes either way and no one is told (a dead link, not a reset)."""

    blackholed = False

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        await super()._pump(reader, _Gate(writer, self), direction)  # type: ignore[arg-type]


class _Gate:
    def __init__(self, writer: asyncio.StreamWriter, proxy: BlackholeProxy) -> None:
        self._writer = writer
        self._proxy = proxy

    def write(self, data: bytes) -> None:
        if not self._proxy.blackholed:
            self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


@pytest.mark.timeout(60)
async def test_a_blackhole_longer_than_the_resume_window_frees_the_slot_and_loses_the_session():
    # Server pings every 0.2 s: a dead link is noticed in ~0.5 s, then the 0.5 s window runs.
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, resume_window_s=0.5)
    server = running_server(app, log_config=None, ws_ping_interval=0.2, ws_ping_timeout=0.3)
    url = await asyncio.to_thread(server.__enter__)
    proxy = BlackholeProxy(int(url.rsplit(":", 1)[1]))
    await proxy.start()
    try:
        client = EnvClient(
            proxy.url, keepalive=Keepalive.disabled(), timeouts=Timeouts(connect=0.5, request=0.5, close=0.3),
            retry=Retry(max_attempts=40, backoff_base=0.1, backoff_max=0.3),
        )
        await client.connect()
        await client.reset()
        await client.step({"message": "a"})
        proxy.blackholed = True
        step = asyncio.ensure_future(client.step({"message": "b"}))
        # While the link is dead, the server frees the half-open session on its own.
        assert await asyncio.to_thread(wait_for_active, url, 0, 10.0) == 0
        assert not step.done()  # the client is still trying to resume
        proxy.blackholed = False
        with pytest.raises(SessionLostError) as info:
            await asyncio.wait_for(step, 30)
        assert info.value.code == "RESUME_FAILED" and info.value.session_id == client.session_id
        assert await asyncio.to_thread(wait_for_active, url, 0) == 0
        await client.close()
    finally:
        await proxy.stop()
        await asyncio.to_thread(server.__exit__, None, None, None)


@pytest.mark.timeout(30)
async def test_a_hanging_reset_times_out_and_the_next_reset_gets_a_fresh_env():
    app = create_app(HangingResetEnvironment, EchoAction, EchoObservation, reset_timeout_s=0.3)
    with running_server(app, log_config=None) as url:
        async with EnvClient(url) as env, EnvClient(url) as bystander:
            started = time.monotonic()
            with pytest.raises(EnvTimeoutError, match="deadline of 0.3s"):
                await env.reset(seed=HANG_SEED)
            assert time.monotonic() - started < 2.0  # the deadline, not the 3 s hang
            await bystander.reset(seed=1)  # another session was never blocked
            assert (await env.reset(seed=1)).observation["echoed_message"] == "ready"
            assert (await env.step({"message": "after"})).observation["echoed_message"] == "after"


@pytest.mark.timeout(30)
async def test_a_close_that_raises_still_frees_the_slot_without_a_traceback(caplog):
    from websockets.asyncio.client import connect

    RaisingCloseEnvironment.closes = 0
    app = create_app(RaisingCloseEnvironment, EchoAction, EchoObservation, max_concurrent_envs=1)
    with running_server(app, log_config=None) as url:
        for how in ("close message", "websocket close", "abrupt"):
            ws = await connect(ws_url(url))  # capacity 1: refused if the last slot leaked
            await ws.send(frame(type="reset", data={}))
            assert json.loads(await ws.recv())["type"] == "observation", how
            if how == "close message":
                await ws.send(frame(type="close"))
                await ws.wait_closed()
            elif how == "websocket close":
                await ws.close()
            else:
                ws.transport.abort()
            assert await asyncio.to_thread(wait_for_active, url, 0) == 0, how
        for _ in range(100):  # the env closes run in the background
            if RaisingCloseEnvironment.closes == 3:
                break
            await asyncio.sleep(0.02)
        assert RaisingCloseEnvironment.closes == 3
    assert tracebacks(caplog.records) == []
    assert sum("close failed on purpose" in r.getMessage() for r in caplog.records) == 3
