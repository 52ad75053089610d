"""One `envsdk serve` of the README-shaped echo env holding a thousand sessions of one client
process: each answers a reset and, after its lane went idle, a step; idle, the server holds no
lane thread; SIGTERM with every session open ends the server. (`python -m bench scale` runs the
same at 16,384 sessions.)"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability.helpers import start_server, stop_server
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from .helpers import frame, ws_url

SESSIONS = 1000


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def _idle_lanes(url: str) -> dict[str, Any]:
    """/health once no lane has a thread (polled, bounded)."""
    async with httpx.AsyncClient() as http:
        for _ in range(500):
            health: dict[str, Any] = (await http.get(url + "/health")).json()
            if health["lane_threads"] == 0:
                break
            await asyncio.sleep(0.02)
    return health


@pytest.mark.timeout(120)
async def test_a_thousand_sessions_of_one_client_hold_no_threads_while_idle(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(soft, hard) < SESSIONS + 256:
        if hard != resource.RLIM_INFINITY and hard < SESSIONS + 256:
            pytest.skip(f"{SESSIONS} client sockets need more than {hard} open files")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = start_server(
        "envsdk.testing:EchoEnvironment", tmp_path / "server.log",
        args=["--max-concurrent-envs", str(SESSIONS + 16)], env={"ENVSDK_LANE_IDLE_S": "0.2"},
    )
    sockets: list[Any] = []
    try:
        slots = asyncio.Semaphore(128)

        async def open_one() -> None:
            async with slots:
                ws = await connect(ws_url(server.url), ping_interval=None, open_timeout=30)
                sockets.append(ws)
                await ws.send(frame(type="reset", data={}))
                assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "observation"

        await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(SESSIONS))), 90)
        idle = await _idle_lanes(server.url)
        assert (idle["active_sessions"], idle["lane_threads"]) == (SESSIONS, 0)
        # uvicorn's loop and a few threads of its own; no lane threads (once the parked ones exited).
        for _ in range(500):
            if _threads(server.proc.pid) <= 8:
                break
            await asyncio.sleep(0.02)
        assert _threads(server.proc.pid) <= 8

        async def step(ws: Any) -> int:
            async with slots:
                await ws.send(frame(type="step", data={"message": "later"}))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                return int(reply["data"]["metadata"]["step"])

        assert await asyncio.wait_for(asyncio.gather(*(step(ws) for ws in sockets)), 60) == [1] * SESSIONS
        assert (await _idle_lanes(server.url))["lane_threads"] == 0
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        status = await asyncio.to_thread(server.proc.wait, 60)
        # Bounded generously (a loaded 2-core machine): what matters is that it exits at all
        # with a thousand sessions open, each env closed on a lane started for it.
        assert status == -signal.SIGTERM and time.monotonic() - started < 60
    finally:
        stop_server(server)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


def _few_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FEW_FILES, FEW_FILES))


FEW_FILES = 512


@pytest.mark.timeout(120)
async def test_lanes_never_take_the_descriptors_the_sessions_sockets_need(tmp_path: Path) -> None:
    """A server allowed 512 open files, serving 420 sessions whose lanes all keep a thread:
    with a quarter of the limit going to lanes' eventfds, sockets ran out and the last
    handshakes failed; lanes now leave one descriptor per session of the capacity."""
    sessions = 420
    server = start_server(
        "envsdk.testing:EchoEnvironment", tmp_path / "server.log", preexec_fn=_few_files,
        args=["--max-concurrent-envs", str(sessions)], env={"ENVSDK_LANE_IDLE_S": "600"},
    )
    sockets: list[Any] = []
    try:
        slots = asyncio.Semaphore(64)

        async def open_one() -> str:
            async with slots:
                try:
                    ws = await connect(ws_url(server.url), ping_interval=None, open_timeout=15)
                except (OSError, WebSocketException, asyncio.TimeoutError) as exc:  # the outcome under test
                    return type(exc).__name__
                sockets.append(ws)
                await ws.send(frame(type="reset", data={}))
                return str(json.loads(await asyncio.wait_for(ws.recv(), 30))["type"])

        outcomes = await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(sessions))), 90)
        assert outcomes == ["observation"] * sessions
        async with httpx.AsyncClient() as http:
            health = (await http.get(server.url + "/health", timeout=10)).json()
        assert (health["active_sessions"], health["lane_threads"]) == (sessions, sessions)
    finally:
        stop_server(server)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
