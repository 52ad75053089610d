"""`serve`: run an app with uvicorn, bound to loopback unless told otherwise, and drain it
gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from envsdk.server.config import ServerConfig

__all__ = ["serve", "DrainingServer", "request_reply_ws_protocol"]

logger = logging.getLogger("envsdk.server")

# Frames up to this multiple of max_frame_bytes reach the app and get a typed FRAME_TOO_LARGE
# reply; larger ones are refused by the WebSocket layer itself (close 1009).
_WS_MAX_SIZE_FACTOR = 4


def serve(
    app_or_target: Any,
    host: str | None = None,
    port: int | None = None,
    *,
    log_level: str = "info",
    **uvicorn_kwargs: Any,
) -> None:
    """Run `app_or_target` (an ASGI app, or uvicorn's ``"module:attr"`` import string) until
    interrupted.

    `host` defaults to ``$HOST``, else ``127.0.0.1`` (never all interfaces by default); `port`
    to ``$PORT``, else 8000. For an app built by `create_app`, uvicorn's ``ws_max_size`` is
    set to 4 × ``max_frame_bytes``, ``ws_per_message_deflate`` to False and ``ws`` to
    `request_reply_ws_protocol` unless given, and the first SIGTERM or SIGINT drains it
    (see `envsdk.server.app`: requests in flight finish within ``drain_timeout_s``, clients
    get SHUTTING_DOWN and a 1001 close, envs are closed) before uvicorn shuts down; a second
    SIGINT stops waiting. Other keyword arguments go to `uvicorn.Config`.
    """
    host = host or os.environ.get("HOST") or "127.0.0.1"
    port = port if port is not None else int(os.environ.get("PORT") or 8000)
    config = getattr(getattr(app_or_target, "state", None), "envsdk_config", None)
    if isinstance(config, ServerConfig):
        uvicorn_kwargs.setdefault("ws_max_size", config.max_frame_bytes * _WS_MAX_SIZE_FACTOR)
        # permessage-deflate is declined unless asked for: negotiated, it costs ~43 KiB per
        # connection and microseconds per frame on each side (bench/RESULTS.md, "Scale").
        uvicorn_kwargs.setdefault("ws_per_message_deflate", False)
        protocol = request_reply_ws_protocol()
        if protocol is not None:
            uvicorn_kwargs.setdefault("ws", protocol)
    drain = getattr(getattr(app_or_target, "state", None), "envsdk_drain", None)
    if drain is None:
        uvicorn.run(app_or_target, host=host, port=port, log_level=log_level, **uvicorn_kwargs)
        return
    server = DrainingServer(
        uvicorn.Config(app_or_target, host=host, port=port, log_level=log_level, **uvicorn_kwargs), drain
    )
    server.run()
    if not server.started:
        sys.exit(3)  # uvicorn.run's exit status when startup fails


class DrainingServer(uvicorn.Server):
    """uvicorn's server, running the app's ``drain`` coroutine before its own shutdown.

    uvicorn alone closes every WebSocket with 1012 as soon as it is told to exit, so a step
    in flight loses its reply; the drain lets it finish first. Listening sockets are closed
    before the drain, so no connection arrives during it.
    """

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for listener in self.servers:
            listener.close()
        task = asyncio.ensure_future(self._drain())
        while not task.done() and not self.force_exit:
            await asyncio.wait({task}, timeout=0.1)
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is not None:
            logger.error("draining the server failed: %r", task.exception())
        await super().shutdown(sockets)


# A connection's reads pause once this many messages, or one message this large, wait for the
# app: enough for request/reply traffic never to pause, little enough to bound the memory a
# client that floods a connection can take.
_READ_PAUSE_MESSAGES = 8
_READ_PAUSE_BYTES = 64 * 1024


@functools.cache
def request_reply_ws_protocol() -> type[asyncio.Protocol] | None:
    """uvicorn's ``websockets-sansio`` WebSocket protocol, pausing a connection's reads only
    when messages pile up; None when this uvicorn lacks the hook it needs (then uvicorn's own
    protocol is used).

    uvicorn pauses reading after every message and resumes when the app takes it: two
    ``epoll_ctl`` system calls and selector bookkeeping per request, about a tenth of the
    server's time for a trivial env. A client that waits for each reply never has more than
    one message waiting, so reads only pause past ``_READ_PAUSE_MESSAGES`` queued messages or
    a message over ``_READ_PAUSE_BYTES``.
    """
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )
    except ImportError:
        return None
    if not hasattr(WebSocketsSansIOProtocol, "send_receive_event_to_app"):
        return None

    class RequestReplyWebSocketProtocol(WebSocketsSansIOProtocol):
        def send_receive_event_to_app(self) -> None:
            if (
                self.read_paused
                or self.queue.qsize() + 1 >= _READ_PAUSE_MESSAGES
                or sum(map(len, self.frames)) > _READ_PAUSE_BYTES
            ):
                super().send_receive_event_to_app()
                return
            # The base class pauses unless reads look paused already: make them look so.
            self.read_paused = True
            try:
                super().send_receive_event_to_app()
            finally:
                self.read_paused = False

    return RequestReplyWebSocketProtocol
