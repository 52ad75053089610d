"""Fixtures of the client tests: a server built with OpenEnv's own `create_app`, an envsdk
server in a child process, and a TCP proxy that can cut connections on demand (the network fault the
client must survive)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from envsdk.testing import free_port, running_server, stop_process

from envsdk.testing.openenv_echo import make_openenv_app

__all__ = ["make_openenv_app", "TcpProxy"]


@pytest.fixture
def openenv_url() -> Iterator[str]:
    """A real uvicorn server running OpenEnv's own app (4 sessions)."""
    with running_server(make_openenv_app(4)) as url:
        yield url


@pytest.fixture
def subprocess_server_url() -> Iterator[str]:
    """envsdk's echo server (64 sessions) served by uvicorn in a child process, so that the
    server's own threads are not counted in this process."""
    port = free_port()
    code = (
        "import sys, uvicorn; from envsdk.server import create_app; "
        "from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation; "
        "app = create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=64); "
        "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server subprocess exited with {proc.returncode}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the server subprocess did not start in 30 s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc, 10)


class TcpProxy:
    """A loopback TCP proxy that forwards bytes both ways and can cut every connection.

    ``drop_all()`` aborts all connections now (both sides see a reset). ``arm("reply")`` cuts
    everything when the next server->client bytes arrive, before forwarding them (the request
    reached the server and was applied; its reply is lost). ``arm("request")`` cuts when the
    next client->server bytes arrive, before forwarding (the server never sees the request).
    WebSocket frames from a client are masked, so the proxy triggers on direction, not content.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.drops = 0
        self.accepted = 0
        self._armed: str | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.drop_all(count=False)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def arm(self, direction: str) -> None:
        assert direction in ("reply", "request")
        self._armed = direction

    def drop_all(self, *, count: bool = True) -> None:
        for client_w, upstream_w in self._pairs:
            client_w.transport.abort()
            upstream_w.transport.abort()
        if self._pairs and count:
            self.drops += 1
        self._pairs.clear()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        self._pairs.append((client_w, upstream_w))
        await asyncio.gather(
            self._pump(client_r, upstream_w, "request"),
            self._pump(upstream_r, client_w, "reply"),
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self._armed == direction:
                    self._armed = None
                    self.drop_all()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        writer.close()


@pytest.fixture
async def proxy_factory() -> AsyncIterator[Any]:
    """Start TcpProxy instances in front of a port; all are stopped at teardown."""
    proxies: list[TcpProxy] = []

    async def start(upstream_url: str) -> TcpProxy:
        proxy = TcpProxy(int(upstream_url.rsplit(":", 1)[1]))
        await proxy.start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        await proxy.stop()
