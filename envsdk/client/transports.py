"""How a client's frames travel: over a real WebSocket, or into an ASGI app in the same process.

The client never touches a socket itself. It asks a `Transport` for a `Connection` and then
only sends and receives text frames, so the same client code drives a remote server
(`WebSocketTransport`) or an app running in this process with no socket at all
(`InProcessTransport`, the counterpart of httpx's ``ASGITransport``).

Contract of a connection: ``send`` and ``recv`` raise `TransportClosed` once the connection is
gone, whatever the cause (peer closed it, network error, keepalive timeout); ``close`` never
raises. ``Transport.connect`` raises `envsdk.errors.ConnectError` when no connection could be
opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, WebSocketException

from envsdk.client.config import Keepalive, Timeouts
from envsdk.errors import ConnectError, mask_secrets

__all__ = [
    "ConnectionSettings",
    "Connection",
    "Transport",
    "TransportClosed",
    "WebSocketTransport",
    "InProcessTransport",
    "DEFAULT_MAX_FRAME_BYTES",
]

logger = logging.getLogger("envsdk.client")

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
"""Largest frame a connection accepts by default: 100 MB, OpenEnv's client default."""

# RFC 6455: 1006 is never sent on the wire; it reports a connection that ended without a close frame.
_ABNORMAL_CLOSURE = 1006

ASGIMessage = MutableMapping[str, Any]
ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[ASGIMessage]], Callable[[ASGIMessage], Awaitable[None]]],
    Awaitable[None],
]


class TransportClosed(Exception):
    """The connection is gone. ``code`` is the WebSocket close code when one is known
    (1006 when the connection ended without a close frame), ``reason`` its reason;
    ``by_client`` is True when this side closed first (a frame over ``max_frame_bytes``: 1009,
    a keepalive timeout), not the server."""

    def __init__(self, code: int | None = None, reason: str = "", *, by_client: bool = False) -> None:
        text = f"connection closed (code {code})" if code is not None else "connection closed"
        super().__init__(f"{text}: {reason}" if reason else text)
        self.code = code
        self.reason = reason
        self.by_client = by_client


@dataclass(frozen=True)
class ConnectionSettings:
    """What a transport needs from the client's configuration to open a connection."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    keepalive: Keepalive = field(default_factory=Keepalive)


@runtime_checkable
class Connection(Protocol):
    """One open connection carrying text frames."""

    async def send(self, text: str) -> None:
        """Send one text frame; raises `TransportClosed` if the connection is gone."""
        ...

    async def recv(self) -> str:
        """Wait for the next text frame; raises `TransportClosed` if the connection is gone."""
        ...

    async def close(self, code: int = 1000) -> None:
        """Close the connection with ``code``; idempotent, never raises."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Opens connections to ``url`` (a ``ws://`` or ``wss://`` URL with path and query)."""

    async def connect(
        self, url: str, headers: Mapping[str, str], settings: ConnectionSettings
    ) -> Connection:
        """Open a connection; raises `envsdk.errors.ConnectError` on failure."""
        ...


# ---------------------------------------------------------------- WebSocket


class _WebSocketConnection:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws

    async def send(self, text: str) -> None:
        try:
            await self._ws.send(text)
        except ConnectionClosed as exc:
            raise _closed(exc) from exc
        except OSError as exc:
            raise TransportClosed(_ABNORMAL_CLOSURE, str(exc)) from exc

    async def recv(self) -> str:
        try:
            frame = await self._ws.recv()
        except ConnectionClosed as exc:
            raise _closed(exc) from exc
        except OSError as exc:
            raise TransportClosed(_ABNORMAL_CLOSURE, str(exc)) from exc
        return frame if isinstance(frame, str) else frame.decode("utf-8", errors="replace")

    async def close(self, code: int = 1000) -> None:
        # A dead peer must not make close() raise or hang past close_timeout (set at connect).
        with contextlib.suppress(Exception):
            await self._ws.close(code)


def _closed(exc: ConnectionClosed) -> TransportClosed:
    frame = exc.rcvd or exc.sent
    if frame is None:
        return TransportClosed(_ABNORMAL_CLOSURE, "no close frame")
    by_client = exc.sent is not None and not exc.rcvd_then_sent
    return TransportClosed(int(frame.code), frame.reason, by_client=by_client)


class WebSocketTransport:
    """Connections over real WebSockets (the ``websockets`` library).

    ``max_frame_bytes`` is the largest frame accepted from the server (default 100 MB, as
    OpenEnv's client); a larger one closes the connection with 1009. The open timeout is
    ``Timeouts.connect``, the closing handshake waits ``Timeouts.close``, pings follow
    `Keepalive`. ``compression`` is passed to ``websockets``: ``None`` (default) or
    ``"deflate"`` (permessage-deflate). Compression is off by default: it cost about 43 KiB
    per connection on each side and 5–40 µs per frame per side in envsdk's measurements
    (bench/RESULTS.md), and loopback or datacenter links gain nothing from it; turn it on
    for slow links carrying large observations.
    """

    def __init__(
        self, *, max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES, compression: str | None = None
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.compression = compression

    async def connect(
        self, url: str, headers: Mapping[str, str], settings: ConnectionSettings
    ) -> Connection:
        try:
            ws = await websockets.connect(
                url,
                additional_headers=dict(headers),
                open_timeout=settings.timeouts.connect,
                close_timeout=settings.timeouts.close,
                ping_interval=settings.keepalive.interval,
                ping_timeout=settings.keepalive.timeout,
                max_size=self.max_frame_bytes,
                compression=self.compression,
            )
        except (OSError, TimeoutError, WebSocketException) as exc:
            # WebSocketException, not only InvalidHandshake: an upgrade redirected to a URL that is
            # no ws:// one (a gateway's https:// login page) raises InvalidURI.
            # A resume's URL carries its token: a message is logged and kept in records.
            raise ConnectError(mask_secrets(f"Could not open a WebSocket to {url}: {exc!r}")) from exc
        return _WebSocketConnection(ws)


# ---------------------------------------------------------------- in-process ASGI


class _InProcessConnection:
    """One ASGI websocket scope driven directly: our sends become ``websocket.receive``
    messages for the app, the app's ``websocket.send`` messages become our receives."""

    def __init__(
        self,
        to_app: asyncio.Queue[ASGIMessage],
        from_app: asyncio.Queue[ASGIMessage],
        close_timeout: float | None,
    ) -> None:
        self._to_app = to_app
        self._from_app = from_app
        self._close_timeout = close_timeout
        self.task: asyncio.Task[None] | None = None
        self._close_code: int | None = None
        self._close_reason = ""

    def _check_open(self) -> None:
        if self._close_code is not None:
            raise TransportClosed(self._close_code, self._close_reason)

    async def send(self, text: str) -> None:
        self._check_open()
        await self._to_app.put({"type": "websocket.receive", "text": text})

    async def recv(self) -> str:
        self._check_open()
        message = await self._from_app.get()
        kind = message["type"]
        if kind == "websocket.send":
            if message.get("text") is not None:
                return str(message["text"])
            return bytes(message.get("bytes") or b"").decode("utf-8", errors="replace")
        if kind == "websocket.close":
            self._close_code = int(message.get("code", 1000))
            self._close_reason = str(message.get("reason") or "")
        else:  # the app returned or raised without closing
            self._close_code = _ABNORMAL_CLOSURE
            self._close_reason = str(message.get("reason", "the app ended the connection"))
        await self._finish(self._close_code)
        raise TransportClosed(self._close_code, self._close_reason)

    async def close(self, code: int = 1000) -> None:
        if self._close_code is None:
            self._close_code = code
            self._close_reason = "closed by the client"
        await self._finish(code)

    async def _finish(self, code: int) -> None:
        task = self.task
        if task is None or task.done():
            return
        await self._to_app.put({"type": "websocket.disconnect", "code": code, "reason": ""})
        try:
            await asyncio.wait_for(asyncio.shield(task), self._close_timeout)
        except Exception:  # includes TimeoutError
            # An app that ignores the disconnect (or fails on it) is stopped, not left running.
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class InProcessTransport:
    """Connections into an ASGI app in this process, with no socket: the same client code
    runs against ``create_app(...)`` (envsdk's or OpenEnv's) in tests and local rollouts.

    The app's lifespan (startup/shutdown hooks) is run once, on the first connection, when
    ``lifespan`` is True; an app that does not speak the lifespan protocol is simply used
    without it. Close the transport (``await transport.aclose()`` or ``async with``) to run
    the shutdown hooks. A transport belongs to the event loop it first connected on.

    Frame size limits and keepalive do not apply: no bytes leave the process.
    """

    def __init__(self, app: ASGIApp, *, lifespan: bool = True) -> None:
        self.app = app
        self._use_lifespan = lifespan
        self._lifespan_state: dict[str, Any] = {}
        self._lifespan_task: asyncio.Task[None] | None = None
        self._lifespan_to_app: asyncio.Queue[ASGIMessage] | None = None
        self._lifespan_from_app: asyncio.Queue[ASGIMessage] | None = None
        self._started = False
        self._start_lock = asyncio.Lock()

    async def __aenter__(self) -> InProcessTransport:
        await self._ensure_started()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _ensure_started(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            self._started = True
            if self._use_lifespan:
                await self._startup()

    async def _startup(self) -> None:
        to_app: asyncio.Queue[ASGIMessage] = asyncio.Queue()
        from_app: asyncio.Queue[ASGIMessage] = asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self._lifespan_state}

        async def run() -> None:
            try:
                await self.app(scope, to_app.get, from_app.put)
            except Exception as exc:  # noqa: BLE001 - an app without lifespan support raises here
                await from_app.put({"type": "_lifespan.error", "error": repr(exc)})
            else:
                await from_app.put({"type": "_lifespan.ended"})

        self._lifespan_to_app, self._lifespan_from_app = to_app, from_app
        self._lifespan_task = asyncio.get_running_loop().create_task(run(), name="envsdk-inprocess-lifespan")
        await to_app.put({"type": "lifespan.startup"})
        message = await from_app.get()
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            return
        if kind == "lifespan.startup.failed":
            raise ConnectError(f"The app's lifespan startup failed: {message.get('message', '')}")
        # The app does not support lifespan (it raised or returned at once): use it without.
        self._lifespan_task = None
        logger.debug("in-process app does not run a lifespan: %s", message)

    async def aclose(self) -> None:
        """Run the app's shutdown hooks (if its lifespan was started). Idempotent."""
        task, self._lifespan_task = self._lifespan_task, None
        if task is None or task.done() or self._lifespan_to_app is None or self._lifespan_from_app is None:
            return
        await self._lifespan_to_app.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._lifespan_from_app.get(), 10.0)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 5.0)

    async def connect(
        self, url: str, headers: Mapping[str, str], settings: ConnectionSettings
    ) -> Connection:
        await self._ensure_started()
        parts = urlsplit(url)
        host = parts.hostname or "testserver"
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        raw_headers = [(b"host", f"{host}:{port}".encode("latin-1"))]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        scope: dict[str, Any] = {
            "type": "websocket",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "scheme": parts.scheme or "ws",
            "server": (host, port),
            "client": ("127.0.0.1", 0),
            "root_path": "",
            "path": parts.path or "/",
            "raw_path": (parts.path or "/").encode("latin-1"),
            "query_string": parts.query.encode("latin-1"),
            "headers": raw_headers,
            "subprotocols": [],
            "state": dict(self._lifespan_state),
            "extensions": {},
        }
        to_app: asyncio.Queue[ASGIMessage] = asyncio.Queue()
        from_app: asyncio.Queue[ASGIMessage] = asyncio.Queue()
        connection = _InProcessConnection(to_app, from_app, settings.timeouts.close)

        async def run() -> None:
            try:
                await self.app(scope, to_app.get, from_app.put)
            except Exception as exc:  # noqa: BLE001 - the client sees it as an abnormal close
                logger.warning("in-process app raised on %s: %r", parts.path, exc)
                await from_app.put({"type": "_app.ended", "reason": f"the app raised {exc!r}"})
            else:
                await from_app.put({"type": "_app.ended", "reason": "the app ended the connection"})

        connection.task = asyncio.get_running_loop().create_task(run(), name="envsdk-inprocess-ws")
        await to_app.put({"type": "websocket.connect"})
        try:
            first = await asyncio.wait_for(from_app.get(), settings.timeouts.connect)
        except asyncio.TimeoutError:
            await connection.close(_ABNORMAL_CLOSURE)
            raise ConnectError(f"The in-process app did not accept {url} in time") from None
        if first["type"] != "websocket.accept":
            await connection.close(_ABNORMAL_CLOSURE)
            raise ConnectError(f"The in-process app refused {url}: {dict(first)}")
        return connection
