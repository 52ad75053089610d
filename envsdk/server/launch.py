"""`serve`: run an app with uvicorn, bound to loopback unless told otherwise, and drain it
gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import copy
import errno
import functools
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from envsdk._process import cannot_write
from envsdk.errors import mask_secrets
from envsdk.server.config import ServerConfig, log_level_name

__all__ = [
    "serve",
    "PortInUseError",
    "AddressNotAvailableError",
    "ensure_port_free",
    "DrainingServer",
    "request_reply_ws_protocol",
    "handshake_timeout_http_protocol",
    "raise_open_files_limit",
    "redact_secrets_in_logs",
    "route_envsdk_logs",
    "SigtermDuringStartUp",
    "TERMINATED",
]

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
    set to 4 × ``max_frame_bytes``, ``ws_per_message_deflate`` to False, ``ws_ping_interval``
    and ``ws_ping_timeout`` to the config's, ``ws`` to `request_reply_ws_protocol` and
    ``http`` to `handshake_timeout_http_protocol` unless given, the soft limit of open files is
    raised to the hard one (`raise_open_files_limit`), and the first SIGTERM or SIGINT drains it
    (see `envsdk.server.app`: requests in flight finish within ``drain_timeout_s``, clients
    get SHUTTING_DOWN and a 1001 close, envs are closed) before uvicorn shuts down; a second
    SIGINT stops waiting; after a SIGINT the process exits with status 130. `log_level` (one of
    `LOG_LEVELS` in any case, or logging's ``warn``; ValueError otherwise) applies to envsdk's own
    loggers too (`route_envsdk_logs`).
    Other keyword arguments go to `uvicorn.Config` (an envsdk app's ``loop`` is asyncio unless
    given). Secrets in query
    strings (``resume_token``, ``token``) and a URL's ``user:password@`` are masked in uvicorn's
    logs (`redact_secrets_in_logs`).
    A port outside 0-65535 raises ValueError; a port another socket listens on `PortInUseError`,
    and a `host` that is no address of this machine `AddressNotAvailableError`, before the app
    starts.
    A standard output or error closed at start (``>&-``) is opened on /dev/null, so that logging
    has somewhere to go; a standard output that cannot be written (``> /dev/full``) is let go
    with one line on stderr (`envsdk._process.cannot_write`) the first time uvicorn's access log
    fails to write to it, rather than a traceback per request.
    """
    log_level = log_level_name(log_level)  # uvicorn's own lookup is a KeyError, and knows no "warn"
    host = host or os.environ.get("HOST") or "127.0.0.1"
    port = port if port is not None else int(os.environ.get("PORT") or 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{port!r} is not a port number (0-65535)")  # the bind's is an OverflowError
    # Before uvicorn starts: it would run the app's startup, then fail to bind and exit 3.
    ensure_port_free(host, port)
    open_closed_std_streams()  # before uvicorn.Config, whose log formatters ask sys.stdout.isatty()
    uvicorn_kwargs.setdefault("log_config", _log_config())
    config = getattr(getattr(app_or_target, "state", None), "envsdk_config", None)
    if isinstance(config, ServerConfig):
        uvicorn_kwargs.setdefault("ws_max_size", config.max_frame_bytes * _WS_MAX_SIZE_FACTOR)
        # permessage-deflate is declined unless asked for: negotiated, it costs ~43 KiB per
        # connection and microseconds per frame on each side (bench/RESULTS.md, "Scale").
        uvicorn_kwargs.setdefault("ws_per_message_deflate", False)
        # asyncio unless asked (``loop="uvloop"``): uvloop cut the default path's CPU per step by
        # only 2-7 % on a 2-core machine (`python -m bench trivial --loops asyncio uvloop`), and
        # uvicorn's "auto" would otherwise switch loops whenever some package installs uvloop.
        uvicorn_kwargs.setdefault("loop", "asyncio")
        uvicorn_kwargs.setdefault("ws_ping_interval", config.ws_ping_interval_s)
        uvicorn_kwargs.setdefault("ws_ping_timeout", config.ws_ping_timeout_s)
        protocol = request_reply_ws_protocol()
        if protocol is not None:
            uvicorn_kwargs.setdefault("ws", protocol)
        uvicorn_kwargs.setdefault("http", handshake_timeout_http_protocol(config.handshake_timeout_s))
        raise_open_files_limit()
    drain = getattr(getattr(app_or_target, "state", None), "envsdk_drain", None)
    uv_config = uvicorn.Config(app_or_target, host=host, port=port, log_level=log_level, **uvicorn_kwargs)
    redact_secrets_in_logs()  # after uvicorn.Config, which (re)configures its loggers
    route_envsdk_logs(log_level)
    server = uvicorn.Server(uv_config) if drain is None else DrainingServer(uv_config, drain)
    try:
        server.run()
    except KeyboardInterrupt:
        # uvicorn raises the signal it caught again once it has shut down (drained, for an envsdk
        # app): the server stopped as asked, so exit as an interrupted program does, quietly.
        sys.exit(130)
    if drain is not None and not server.started:
        sys.exit(3)  # uvicorn.run's exit status when startup fails


class PortInUseError(OSError):
    """The address `serve` was asked to listen on is already taken by another socket."""


class AddressNotAvailableError(OSError):
    """The host `serve` was asked to listen on is not an address of this machine
    (``--host 8.8.8.8``); ``host`` is that address. Its text starts with the address, so that a
    command can prefix the option it came from (``--host``)."""

    def __init__(self, host: str) -> None:
        super().__init__(errno.EADDRNOTAVAIL, f"{host} is not an address of this machine: cannot listen on it")
        self.host = host

    def __str__(self) -> str:
        return str(self.strerror)


def ensure_port_free(host: str, port: int) -> None:
    """Raise `PortInUseError` when `port` on `host` cannot be bound (port 0 is always free), and
    `AddressNotAvailableError` when `host` is no address of this machine.
    Bound as uvicorn binds, with ``SO_REUSEADDR``: a port whose last connections linger in
    TIME_WAIT is free, one another process listens on is not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror:
        return  # an unresolvable host: uvicorn's own error says so
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            # Any other refusal (a privileged port) is uvicorn's to report.
            if exc.errno == errno.EADDRINUSE and port != 0:
                raise PortInUseError(f"port {port} on {host} is already in use") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise AddressNotAvailableError(host) from None


def open_closed_std_streams() -> None:
    """Open standard output and error on /dev/null where the process started with them closed
    (``>&-``: Python then has None for them, and uvicorn's logging fails on that). Opened in
    order, each takes its own descriptor (1, 2) when that is still free."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the process's stream, until it ends)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


class _LogStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """uvicorn's log handlers (`_log_config`): a record that standard output cannot take (its
    reader went away, a full disk) lets standard output go, said once on stderr
    (`cannot_write`), instead of logging's traceback on stderr for every record."""

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and self.stream is not None and self.stream is sys.stdout:
            cannot_write(exc)
            return
        super().handleError(record)


def _log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration, its handlers `_LogStreamHandler`s."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    for handler in config["handlers"].values():
        handler["class"] = f"{__name__}._LogStreamHandler"
    return config


#: A server's exit status after SIGTERM: what the shell reports for a program it ended (128 + 15).
TERMINATED = 128 + signal.SIGTERM


class SigtermDuringStartUp:
    """A server command's SIGTERM handler (`install`; the game servers' in ``servers/``). While the server starts, a SIGTERM is only
    noted: raised as SystemExit wherever the main thread was, it could land in a finaliser
    (which drops it: the server then served on) or in the start of a worker process (whose exit
    then waited for a worker that waits for its parent). `arm`, called once the start-up is
    done, collects the start-up's garbage (its finalisers run while a SIGTERM is still only
    noted), then exits for a SIGTERM noted before; from then on each one raises SystemExit at once, so
    the caller's ``finally`` stops the workers (uvicorn re-raises the SIGTERM it handled once it
    has shut down). The exit status is `TERMINATED`, as for any program a SIGTERM ended."""

    def __init__(self) -> None:
        self.noted = False
        self.armed = False

    @classmethod
    def install(cls) -> SigtermDuringStartUp:
        handler = cls()
        signal.signal(signal.SIGTERM, handler)
        return handler

    def __call__(self, signum: int, frame: object) -> None:
        if not self.armed:
            self.noted = True
            return
        raise SystemExit(TERMINATED)

    def arm(self) -> None:
        # Collected later, a finaliser (regex's parser leaves cycles of them) would take the
        # SystemExit and drop it.
        gc.collect()
        self.armed = True
        if self.noted:
            raise SystemExit(TERMINATED)

    def serve(self, app: Any, args: argparse.Namespace) -> int:
        """`arm`, then serve `app` on ``args.host``/``args.port`` until stopped; the exit status
        (1, said in one line, when another server holds the port or the host is no address of
        this machine)."""
        self.arm()
        try:
            serve(app, host=args.host, port=args.port, log_level=args.log_level)
        except PortInUseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except AddressNotAvailableError as exc:
            print(f"error: --host {exc}", file=sys.stderr)
            return 1
        return 0


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
_READ_BYTES = 16 * 1024


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
        # Set when the transport's write buffer passed its high-water mark: reads stop until
        # it drains (a peer that sends pings and never reads cannot grow the buffer of pongs),
        # and a peer that has not drained it within ws_ping_timeout is dropped.
        _writes_blocked = False
        _stall_timer: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            self._writes_blocked = True
            self.transport.pause_reading()
            if self._stall_timer is None:
                self._stall_timer = self.loop.call_later(self.ping_timeout or 20.0, self._drop_stalled_peer)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._writes_blocked = False
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None
            if not self.read_paused and not self._parsing_backlog and not self.transport.is_closing():
                self.transport.resume_reading()

        def _drop_stalled_peer(self) -> None:
            self._stall_timer = None
            self.logger.info("%s - WebSocket peer read nothing for %s s: dropped", self.client, self.ping_timeout)
            self.transport.abort()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            # asyncio reads up to 256 KiB at a time, and all of it is handled before the loop
            # does anything else: 256 KiB of pings is 43,000 frames, seconds of work and
            # megabytes of frame objects. Smaller reads keep the loop's timers (keepalive) and
            # other clients served during a flood.
            if hasattr(transport, "max_size"):
                setattr(transport, "max_size", _READ_BYTES)  # noqa: B010 (not in the type)

        def handle_ping(self) -> None:
            pass  # the pong goes out with the rest of this read's output, in `data_received`

        # Read and not yet parsed. uvloop ignores `max_size`: it reads 256 KiB at a time, up to
        # 32 reads in a row while the socket has data. Such a read is parsed `_READ_BYTES` per
        # turn of the loop, reads paused meanwhile, as asyncio's reads of that size would be.
        _unparsed = b""
        _parsing_backlog = False

        def data_received(self, data: bytes) -> None:
            self._unparsed = self._unparsed + data if self._unparsed else data
            if not self._parsing_backlog:
                self._parse_some()

        def _parse_some(self) -> None:
            if self.transport.is_closing():
                self._unparsed = b""
                return
            data, self._unparsed = self._unparsed[:_READ_BYTES], self._unparsed[_READ_BYTES:]
            super().data_received(data)
            # One write per slice, not one per ping: a slice can hold thousands of pings, and a
            # write each kept the loop (keepalive timers, other clients) waiting.
            output = self.conn.data_to_send()
            if output and not self.transport.is_closing():
                self.transport.write(b"".join(output))
            if self._unparsed:
                if not self._parsing_backlog:
                    self._parsing_backlog = True
                    self.transport.pause_reading()
                self.loop.call_soon(self._parse_some)
            elif self._parsing_backlog:
                self._parsing_backlog = False
                if not self.read_paused and not self._writes_blocked and not self.transport.is_closing():
                    self.transport.resume_reading()

        def keepalive_timeout(self) -> None:
            super().keepalive_timeout()
            # The close frame cannot reach a peer that does not read: closing would wait for
            # the send buffer forever, keeping the memory, the socket and the session's slot.
            if self.transport.get_write_buffer_size():
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None
            super().connection_lost(exc)

        async def receive(self) -> Any:
            message = await self.queue.get()
            if self.read_paused and self.queue.empty():
                self.read_paused = False
                if not self._writes_blocked and not self._parsing_backlog:
                    self.transport.resume_reading()
            return message

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


@functools.cache
def handshake_timeout_http_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 HTTP protocol, closing a connection whose request head (a WebSocket
    upgrade's included) is not complete `timeout_s` after the connection opened or its previous
    response was sent.

    uvicorn itself waits forever for a head that never ends (slowloris): enough such sockets use
    up the process's file descriptors and lock every client out.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HandshakeTimeoutH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timeout)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # a request head arrived (or the peer left)
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

    return HandshakeTimeoutH11Protocol


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit (where the platform has
    one): the soft default of 1,024 is one socket per client, and a server out of descriptors
    refuses every client until some close."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. a sandbox that forbids it
        logger.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)


class _RedactSecrets(logging.Filter):
    """Masks a record's secrets (`mask_secrets`) in its message and its string arguments (uvicorn's
    access formatter reads the arguments one by one, so they stay a tuple)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(mask_secrets(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = mask_secrets(record.msg)
        return True


def redact_secrets_in_logs() -> None:
    """Mask resume tokens, bearer tokens and passwords (`mask_secrets`) in uvicorn's access and
    error logs (which print every request's target with its query string). Idempotent."""
    for name in ("uvicorn.access", "uvicorn.error"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _RedactSecrets) for f in log.filters):
            log.addFilter(_RedactSecrets())


def route_envsdk_logs(log_level: str | int) -> None:
    """Give envsdk's loggers (``envsdk.*``: env tracebacks, session lifecycle) uvicorn's
    `log_level`, and, unless logging is configured already (a handler on ``envsdk`` or on the
    root logger), a stderr handler in uvicorn's format. uvicorn configures only its own
    loggers, so ``--log-level debug`` would otherwise never show envsdk's DEBUG lines."""
    level = uvicorn.config.LOG_LEVELS.get(log_level.lower(), logging.INFO) if isinstance(log_level, str) else log_level
    log = logging.getLogger("envsdk")
    log.setLevel(level)
    if not log.handlers and not logging.getLogger().handlers:
        from uvicorn.logging import DefaultFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(name)s: %(message)s"))
        log.addHandler(handler)
