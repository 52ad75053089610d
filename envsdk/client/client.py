"""`EnvClient`: the async client of one environment session.

One client = one session = one episode at a time. The client speaks OpenEnv's frames and, when
the server supports it, envsdk's extensions: a session handshake at connect (capacity is noticed
there, not on the first request), request ids, and resume after a dropped connection with the
same request resent under the same id, so no step is lost or applied twice.

What it never does is continue silently in a new session: when a session cannot be resumed
(a plain OpenEnv server, an expired resume window, retries exhausted) the pending call raises
`SessionLostError`, and so does every later call on the same client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel

from envsdk.client.config import Keepalive, Retry, Timeouts
from envsdk.client.transports import (
    Connection,
    ConnectionSettings,
    Transport,
    TransportClosed,
    WebSocketTransport,
)
from envsdk.errors import (
    AuthenticationError,
    BaseUrlError,
    CapacityError,
    ConnectError,
    EnvSDKError,
    EnvTimeoutError,
    EpisodeDoneError,
    NotResetError,
    ProtocolError,
    RequestEncodingError,
    ServerError,
    ServerShutdownError,
    SessionLostError,
    ToolCallError,
    mask_secrets,
)
from envsdk.protocol import (
    SHUTDOWN_CLOSE_REASON,
    WS_PATH,
    CloseCode,
    CloseRequest,
    ErrorCode,
    ErrorData,
    ErrorReply,
    McpReply,
    McpRequest,
    ObservationReply,
    ResetRequest,
    SessionInfo,
    SessionReply,
    SessionRequest,
    StateReply,
    StateRequest,
    StepRequest,
    decode_reply,
    encode,
)
from envsdk.rewards.parts import non_finite
from envsdk.tools import ToolSpec
from envsdk.types import StepResult

__all__ = ["EnvClient", "RequestKind", "ServerKind", "error_from_frame", "websocket_url"]

logger = logging.getLogger("envsdk.client")

ServerKind = Literal["envsdk", "openenv"]
#: The kinds of request a server announces a deadline for (`SessionInfo.deadlines_s`).
RequestKind = Literal["reset", "step", "mcp", "state"]
_Reply = ObservationReply | StateReply | ErrorReply | SessionReply | McpReply

_ERROR_CLASSES: dict[str, type[ServerError]] = {
    ErrorCode.CAPACITY_REACHED.value: CapacityError,
    ErrorCode.TIMEOUT.value: EnvTimeoutError,
    ErrorCode.EPISODE_DONE.value: EpisodeDoneError,
    ErrorCode.NOT_RESET.value: NotResetError,
    ErrorCode.UNAUTHORIZED.value: AuthenticationError,
}

# A socket closed with one of these codes will not come back by reconnecting: the server
# refused the frame itself (policy, size) or the session is gone or taken over.
_FINAL_CLOSE_CODES = frozenset(
    {
        CloseCode.POLICY_VIOLATION.value,
        CloseCode.MESSAGE_TOO_BIG.value,
        CloseCode.SESSION_NOT_FOUND.value,
        CloseCode.SUPERSEDED.value,
    }
)


_TOKEN_ENV = "ENVSDK_TOKEN"


#: Servers already reported as plain OpenEnv ones in this process.
_WARNED_PLAIN_OPENENV: set[str] = set()


def _is_shutdown_close(code: int | None, reason: str) -> bool:
    """Whether a close is an envsdk server's shutdown drain. (uvicorn's own 1012 on exit is
    not: a resume is tried, and a restarted server refuses it with RESUME_FAILED.)"""
    return code == CloseCode.GOING_AWAY.value and reason == SHUTDOWN_CLOSE_REASON


async def _recv_within(conn: Connection, timeout: float | None) -> str:
    """``conn.recv()``, raising `asyncio.TimeoutError` after `timeout` seconds (None: no limit).

    ``asyncio.timeout`` (Python 3.11+) bounds the receive in place; ``wait_for`` wraps it in
    a new task per frame, a fifth of the client's own time per request."""
    if timeout is None:
        return await conn.recv()
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await conn.recv()
    return await asyncio.wait_for(conn.recv(), timeout)


def error_from_frame(data: ErrorData) -> EnvSDKError:
    """The typed exception for an error frame, keeping its code, message and every detail.

    ``RESUME_FAILED`` becomes `SessionLostError`, ``SHUTTING_DOWN`` `ServerShutdownError`;
    codes without a class of their own become `ServerError`.
    """
    if data.code == ErrorCode.SHUTTING_DOWN.value:
        return ServerShutdownError(data.message, code=data.code, details=data.details)
    if data.code == ErrorCode.RESUME_FAILED.value:
        return SessionLostError(
            f"The server refused to resume the session: {data.message}",
            session_id=data.details.get("session_id"),
            code=data.code,
            details=data.details,
        )
    cls = _ERROR_CLASSES.get(data.code, ServerError)
    return cls(data.message, data.code, data.details)


def websocket_url(base_url: str) -> str:
    """The ``/ws`` URL of a server given as ``http``, ``https``, ``ws`` or ``wss`` base URL.

    ``http://h:8000/prefix`` becomes ``ws://h:8000/prefix/ws``; a path already ending in
    ``/ws`` is kept; a query string is kept. A URL no connection can be made with raises
    `BaseUrlError` (a `ValueError`) saying what is wrong, here rather than at the first connect
    (where it was a bare ``ValueError`` of urllib's, or a misleading "connection refused").
    """
    shown = mask_secrets(base_url)  # a refusal never repeats a password
    try:
        parts = urlsplit(base_url.strip())
    except ValueError as exc:  # "Invalid IPv6 URL": a '[' without its ']'
        raise BaseUrlError(shown, f"is not a URL ({exc})") from None
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc:
        raise BaseUrlError(shown, "is not an http://, https://, ws:// or wss:// URL with a host")
    if "@" in parts.netloc:
        raise BaseUrlError(
            shown, "holds a user name or password, which envsdk does not send: drop it "
            "(a server's token goes in $ENVSDK_TOKEN)"
        )
    try:
        _ = parts.port  # urllib checks the port only when it is read
    except ValueError:
        port = parts.netloc.rpartition(":")[2]
        what = "is not a number" if not port.isdigit() else "is not in 0 to 65535"
        raise BaseUrlError(shown, f"has a port, {port!r}, that {what}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/web"):
        # The page's address, copied from the browser: the session lives at the server's root.
        root = urlunsplit((parts.scheme, parts.netloc, path[: -len("/web")], "", ""))
        raise BaseUrlError(shown, f"is the server's web page, not its API: use the base URL {mask_secrets(root)!r}")
    if not path.endswith(WS_PATH):
        path += WS_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += list(params.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


class EnvClient:
    """Async client of one environment session over `/ws`.

    Usage::

        async with EnvClient("http://127.0.0.1:8000") as env:
            result = await env.reset(seed=7)
            result = await env.step({"message": "[1 2 3]"})
            state = await env.state()

    ``action_type``: a pydantic model that ``step`` validates dict actions with before sending.
    ``observation_type``: a pydantic model; when given, ``StepResult.observation`` is
    ``observation_type.model_validate(body | {"reward": r, "done": d})`` instead of the dict
    body. ``resume=False`` turns resume off: any dropped connection loses the session.
    ``transport`` defaults to `WebSocketTransport()`; a transport passed in is not closed by
    the client (its owner closes it). ``headers`` go with every connection. ``token`` is
    sent as ``Authorization: Bearer <token>`` (default: the ``ENVSDK_TOKEN`` environment
    variable, unless ``headers`` already carry an Authorization); a server that refuses it
    makes ``connect`` raise `AuthenticationError`.

    A server that shuts down under the session (SIGTERM) makes the pending or next call raise
    `ServerShutdownError` (a `SessionLostError`), not a generic connection error.

    Calls are serialised (one request in flight per client). The client connects on
    ``connect()`` or lazily on its first call; it cannot be reconnected after ``close()`` or
    after its session was lost: make a new client for a new session.
    """

    def __init__(
        self,
        base_url: str,
        *,
        action_type: type[BaseModel] | None = None,
        observation_type: type[BaseModel] | None = None,
        timeouts: Timeouts = Timeouts(),
        keepalive: Keepalive = Keepalive(),
        retry: Retry = Retry(),
        resume: bool = True,
        transport: Transport | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.url = websocket_url(base_url)
        self.action_type = action_type
        self.observation_type = observation_type
        self.timeouts = timeouts
        self.keepalive = keepalive
        self.retry = retry
        self.resume = resume
        self.transport: Transport = transport if transport is not None else WebSocketTransport()
        self.headers: dict[str, str] = dict(headers or {})
        has_auth = any(k.lower() == "authorization" for k in self.headers)
        if token is None and not has_auth:
            token = os.environ.get(_TOKEN_ENV) or None
        if token is not None:
            self.headers = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
            self.headers["Authorization"] = f"Bearer {token}"
        self._settings = ConnectionSettings(timeouts=timeouts, keepalive=keepalive)
        self._lock = asyncio.Lock()
        self._conn: Connection | None = None
        self._session: SessionInfo | None = None
        self._server_kind: ServerKind | None = None
        self._lost: SessionLostError | None = None
        self._closed = False
        self._rpc_id = 0

    # ------------------------------------------------------------ properties

    @property
    def session_id(self) -> str | None:
        """The server's session id (envsdk servers only; None before connect or for OpenEnv)."""
        return self._session.session_id if self._session else None

    @property
    def server_kind(self) -> ServerKind | None:
        """``"envsdk"`` when the server answered the session handshake, ``"openenv"`` when it
        did not know it (plain OpenEnv behaviour); None before the first connection."""
        return self._server_kind

    @property
    def resumable(self) -> bool:
        """Whether a dropped connection will be resumed rather than lose the session."""
        return (
            self.resume
            and self._server_kind == "envsdk"
            and self._session is not None
            and self._lost is None
            and not self._closed
        )

    @property
    def session(self) -> SessionInfo | None:
        """The server's latest session handshake reply (envsdk servers only)."""
        return self._session

    def request_timeout(self, kind: RequestKind) -> float | None:
        """How long this client waits for the reply to a request of `kind` (None: forever):
        ``Timeouts.request`` where it is a number, else (a `ServerDeadline`) the time the
        server announced for that kind in its session handshake plus the margin, or the
        deadline's ``otherwise`` before the handshake and where the server announced none."""
        announced = self._session.deadlines_s.get(kind) if self._session is not None else None
        return self.timeouts.request_s(announced)

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> EnvClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection and do the session handshake. Idempotent while connected.

        Raises `CapacityError` when the server is full, `ConnectError` when it cannot be
        reached or does not answer the handshake within ``Timeouts.connect``.
        """
        async with self._lock:
            self._check_usable()
            await self._ensure_connected(self.retry.max_attempts)

    async def close(self) -> None:
        """Say goodbye (the server ends the session) and close the connection. Idempotent."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                await asyncio.wait_for(conn.send(encode(CloseRequest())), self.timeouts.close)
            except (TransportClosed, asyncio.TimeoutError):
                pass  # the connection is already gone; nothing to say goodbye to
            await conn.close(CloseCode.NORMAL.value)

    # ------------------------------------------------------------ requests

    async def reset(self, **kwargs: Any) -> StepResult[Any]:
        """Start a new episode; ``kwargs`` (``seed``, ``episode_id``, env-specific) go to the
        environment's ``reset``."""
        reply = await self._request("reset", lambda rid: ResetRequest(id=rid, data=kwargs), kind="reset")
        return self._step_result(reply, "reset")

    async def step(self, action: Mapping[str, Any] | BaseModel) -> StepResult[Any]:
        """Apply one action (a dict of the action's fields, or a pydantic model)."""
        data = self._action_data(action)
        reply = await self._request("step", lambda rid: StepRequest(id=rid, data=data), kind="step")
        return self._step_result(reply, "step")

    async def state(self) -> dict[str, Any]:
        """The environment's current state (``episode_id``, ``step_count``, …)."""
        reply = await self._request("state", lambda rid: StateRequest(id=rid), kind="state")
        if not isinstance(reply, StateReply):
            raise ProtocolError(f"Expected a state reply to state, got {reply.type!r}")
        return dict(reply.data)

    async def list_tools(self) -> list[ToolSpec]:
        """The tools of a tool environment (MCP ``tools/list`` on this session), from an
        envsdk or an OpenEnv 0.10 server."""
        result = await self._mcp("tools/list", {})
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            raise ProtocolError(f"tools/list answered without a tool list: {result!r:.200}")
        specs = []
        for entry in tools:
            try:
                specs.append(ToolSpec.from_wire(entry))
            except (AttributeError, KeyError, TypeError, ValueError):  # not {"name": ..., "inputSchema": {...}}
                raise ProtocolError(f"tools/list answered with an entry that is no tool: {entry!r:.200}") from None
        return specs

    async def call_tool(self, name: str, /, **arguments: Any) -> Any:
        """Call one tool on this session's env (MCP ``tools/call``) and return its value (the
        result's ``data``). Raises `ToolCallError` for an unknown tool, bad arguments or a tool
        that raised; `EnvTimeoutError` past the server's step deadline."""
        result = await self._mcp("tools/call", {"name": name, "arguments": arguments})
        if isinstance(result, dict) and "data" in result:
            return result["data"]
        return result

    async def _mcp(self, method: str, params: dict[str, Any]) -> Any:
        """One JSON-RPC request in a ``{"type": "mcp"}`` frame on the session's socket: the
        same ordering, resume and exactly-once ids as a step."""
        self._rpc_id += 1
        payload = {"jsonrpc": "2.0", "id": self._rpc_id, "method": method, "params": params}
        reply = await self._request(method, lambda rid: McpRequest(id=rid, data=payload), kind="mcp")
        if not isinstance(reply, McpReply):
            raise ProtocolError(f"Expected an mcp reply to {method}, got {reply.type!r}")
        error = reply.data.get("error")
        if isinstance(error, dict):
            data = error.get("data")
            details = dict(data) if isinstance(data, dict) else {"data": data}
            message = str(error.get("message", "unknown error"))
            if details.get("code") == ErrorCode.TIMEOUT.value:
                raise EnvTimeoutError(message, ErrorCode.TIMEOUT.value, details)
            raise ToolCallError(message, str(error.get("code")), details)
        if error is not None or "result" not in reply.data:
            # JSON-RPC 2.0: a result, or an error object. Returning None here read as a tool
            # that returned nothing.
            raise ProtocolError(f"{method} was answered with neither a result nor an error object: {reply.data!r:.200}")
        return reply.data["result"]

    # ------------------------------------------------------------ internals

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise type(self._lost)(
                f"This client's session was lost earlier ({self._lost.message}); "
                "create a new client to start a new session",
                session_id=self._lost.session_id,
                code=self._lost.code,
                details=self._lost.details,
            )
        if self._closed:
            raise SessionLostError(
                "This client was closed; create a new client to start a new session",
                session_id=self.session_id,
            )

    def _action_data(self, action: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
        if not isinstance(action, (Mapping, BaseModel)):
            raise TypeError(
                f"step() takes the action as a dict of its fields (or a pydantic model), got "
                f"{type(action).__name__}: for a text action send e.g. {{'message': {action!r}}}"
            )
        if isinstance(action, BaseModel):
            return action.model_dump(mode="json")
        if self.action_type is not None:
            # Fail here, with pydantic's message, rather than after a round trip.
            return self.action_type.model_validate(dict(action)).model_dump(mode="json")
        return dict(action)

    def _step_result(self, reply: _Reply, what: str) -> StepResult[Any]:
        if not isinstance(reply, ObservationReply):
            raise ProtocolError(f"Expected an observation reply to {what}, got {reply.type!r}")
        data = reply.data
        metadata = (data.model_extra or {}).get("metadata") or {}
        problem = non_finite(data.reward, metadata) or non_finite(None, data.observation.get("metadata"))
        if problem is not None:
            # JSON has no NaN: some peer wrote a non-standard literal. Taken as a number, or as
            # the null an envsdk server would never send, it would poison a training signal.
            raise ProtocolError(f"The server's {what} reply carries {problem}: rewards must be finite numbers")
        try:
            reward = None if data.reward is None else float(data.reward)
        except OverflowError:  # a JSON int of more digits than any float holds
            raise ProtocolError(
                f"The server's {what} reply carries an integer reward larger than any float: rewards"
                " must be finite numbers"
            ) from None
        body = dict(data.observation)
        observation: Any = body
        if self.observation_type is not None:
            observation = self.observation_type.model_validate({**body, "reward": data.reward, "done": data.done})
        return StepResult(observation=observation, reward=reward, done=data.done, metadata=dict(metadata))

    async def _request(self, what: str, make: Callable[[str | None], BaseModel], *, kind: RequestKind) -> _Reply:
        """Send one request (`what`, of `kind`) and return its reply; error frames raise their
        typed error.

        A dropped connection or a reply later than `request_timeout` of `kind` is recovered by
        resume (same request id, so the server never applies it twice) or loses the session.
        """
        async with self._lock:
            self._check_usable()
            attempts_left = await self._ensure_connected(self.retry.max_attempts)
            request_id = uuid.uuid4().hex if self._server_kind == "envsdk" else None
            try:
                raw = encode(make(request_id))
            except ValueError as exc:  # pydantic's: a lone surrogate, a type JSON lacks, a malformed body
                raise RequestEncodingError(
                    f"{what}: the request cannot be written as a JSON frame, so nothing was sent and the session"
                    f" is as it was ({' '.join(str(exc).split())})"
                ) from exc
            while True:
                conn = self._conn
                assert conn is not None  # _ensure_connected and _recover either set it or raise
                close_code: int | None = None
                try:
                    await conn.send(raw)
                    waited = self.request_timeout(kind)
                    reply = await self._read_reply(conn, request_id, waited)
                except TransportClosed as exc:
                    if _is_shutdown_close(exc.code, exc.reason):
                        raise await self._lose(
                            f"the server shut down during {what} (close {exc.code}: {exc.reason or 'no reason'})",
                            cls=ServerShutdownError,
                        ) from None
                    if exc.by_client and exc.code == CloseCode.MESSAGE_TOO_BIG.value:
                        # Not the server's refusal of the request: this client refused the reply
                        # (a resume would be sent the same frame again).
                        limit = getattr(self.transport, "max_frame_bytes", None)
                        raise await self._lose(
                            f"the reply to {what} is larger than this client accepts ({exc}); "
                            f"raise WebSocketTransport(max_frame_bytes={limit}) to accept it"
                        ) from None
                    reason = f"the connection dropped during {what} ({exc})"
                    close_code = exc.code
                except asyncio.TimeoutError:
                    reason = f"no reply to {what} within {waited} s"
                except ProtocolError as exc:
                    if request_id is None:
                        # Without ids the frames can no longer be paired with requests: the reply
                        # still to come would be read as the next request's answer.
                        raise await self._lose(f"{exc} (during {what})") from exc
                    raise  # with ids a late reply is recognised and discarded
                except asyncio.CancelledError:
                    if request_id is None:
                        # Without ids the late reply would be read as the next request's answer.
                        self._mark_lost(f"{what} was cancelled while in flight")
                    raise
                else:
                    if isinstance(reply, ErrorReply):
                        error = error_from_frame(reply.data)
                        if isinstance(error, SessionLostError):
                            raise await self._lose(
                                f"{error.message} (during {what})", cls=type(error), code=error.code,
                                details=error.details,
                            )
                        raise error
                    return reply
                attempts_left = await self._recover(reason, close_code, attempts_left, pending=kind)

    async def _read_reply(self, conn: Connection, request_id: str | None, timeout: float | None) -> _Reply:
        """The next frame that answers ``request_id``; replies to other (earlier, abandoned)
        ids are discarded so a late reply is never taken for this request's answer."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError
            raw = await _recv_within(conn, remaining)
            try:
                reply: _Reply = decode_reply(raw)
            except ValueError as exc:
                raise ProtocolError(f"The server sent a frame that is not a known reply: {raw[:200]!r}") from exc
            if request_id is None or reply.id == request_id:
                return reply
            if reply.id is None and isinstance(reply, ErrorReply):
                # Errors the server cannot tie to a request (FRAME_TOO_LARGE, SHUTTING_DOWN).
                return reply
            logger.debug("discarding a reply to request %s while awaiting %s", reply.id, request_id)

    async def _ensure_connected(self, attempts_left: int) -> int:
        """Make sure a connection is open; returns the reconnect attempts left.

        Only the first connection opens a session. Once a session existed, a missing
        connection (a call cancelled while reconnecting) is resumed, never replaced by a new
        session.
        """
        if self._conn is not None:
            return attempts_left
        if self._server_kind is None:
            await self._open()
            return attempts_left
        return await self._recover("the connection was abandoned by a cancelled call", None, attempts_left)

    async def _open(self) -> None:
        """Connect and do the handshake; sets ``_conn``, ``_server_kind`` and ``_session``."""
        conn = await self.transport.connect(self.url, self.headers, self._settings)
        try:
            await self._handshake_send(conn)
            reply = await self._read_reply(conn, None, self.timeouts.connect)
        except TransportClosed as exc:
            await conn.close()
            raise ConnectError(f"{self.url} closed the connection during the session handshake: {exc}") from exc
        except asyncio.TimeoutError:
            await conn.close()
            raise ConnectError(
                f"{self.url} did not answer the session handshake within {self.timeouts.connect} s"
            ) from None
        except BaseException:
            await conn.close()
            raise
        if isinstance(reply, SessionReply):
            self._server_kind = "envsdk"
            self._session = reply.data
        elif isinstance(reply, ErrorReply) and reply.data.code == ErrorCode.UNKNOWN_TYPE.value:
            self._server_kind = "openenv"
            if self.url not in _WARNED_PLAIN_OPENENV:  # once per server, not once per episode
                _WARNED_PLAIN_OPENENV.add(self.url)
                logger.warning(
                    "%s does not support envsdk sessions (plain OpenEnv server): no request ids and no "
                    "resume; a dropped connection will lose the session",
                    self.url,
                )
        else:
            await conn.close()
            if isinstance(reply, ErrorReply):
                raise error_from_frame(reply.data)
            raise ProtocolError(f"Unexpected {reply.type!r} frame in answer to the session handshake")
        self._conn = conn

    @staticmethod
    async def _handshake_send(conn: Connection) -> None:
        """Send the session request. A server at capacity may have sent its error and closed
        before it arrives: a failed send is ignored so that the frame already received (the
        real answer) is still read."""
        try:
            await conn.send(encode(SessionRequest()))
        except TransportClosed:
            pass

    async def _recover(
        self, reason: str, close_code: int | None, attempts_left: int, *, pending: RequestKind | None = None
    ) -> int:
        """Resume the session after ``reason`` or lose it. Returns the reconnect attempts left.

        `pending`: the kind of request in flight when the connection went. The server answers
        the resume's handshake only once that call is done (and takes up the resume token as it
        attaches, so a second attempt cannot use it): the handshake is waited for as long as the
        call may take, not ``Timeouts.connect`` alone."""
        if not self.resumable:
            why = "resume is turned off" if not self.resume else "the server does not support resume"
            raise await self._lose(f"{reason}; {why}")
        if close_code in _FINAL_CLOSE_CODES:
            raise await self._lose(f"{reason}; the server closed the connection with code {close_code}")
        old, self._conn = self._conn, None
        if old is not None:
            # Going away, not goodbye: the server must keep the session for the resume.
            await old.close(CloseCode.GOING_AWAY.value)
        session = self._session
        assert session is not None  # resumable implies a handshake
        handshake_s = self.timeouts.connect
        if pending is not None:
            call_s = self.request_timeout(pending)
            handshake_s = None if call_s is None or handshake_s is None else max(handshake_s, call_s)
        last_error = reason
        attempt = 0
        while attempts_left > 0:
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1
            attempts_left -= 1
            url = _with_query(self.url, session_id=session.session_id, resume_token=session.resume_token)
            try:
                conn = await self.transport.connect(url, self.headers, self._settings)
            except ConnectError as exc:
                last_error = str(exc)
                continue
            try:
                await self._handshake_send(conn)
                reply = await self._read_reply(conn, None, handshake_s)
            except (TransportClosed, asyncio.TimeoutError) as exc:
                await conn.close()
                last_error = f"the resume handshake failed: {exc!r}"
                continue
            except ProtocolError as exc:
                # A frame that is no reply at all (a gateway's error page): not a resume, as any
                # other wrong answer below; the connection is closed, not left open.
                await conn.close()
                raise await self._lose(f"{reason}; the resume handshake was answered with {exc}") from None
            except BaseException:
                await conn.close()  # cancelled mid-handshake: this connection is no one's
                raise
            if isinstance(reply, SessionReply) and reply.data.session_id == session.session_id:
                if not reply.data.resumed:
                    await conn.close()
                    raise await self._lose(f"{reason}; the server answered with a fresh session, not a resume")
                self._session = reply.data
                self._conn = conn
                logger.info(
                    "resumed session %s after %s (attempt %d)", session.session_id, reason, attempt
                )
                return attempts_left
            await conn.close()
            if isinstance(reply, ErrorReply):
                error = error_from_frame(reply.data)
                if isinstance(error, CapacityError):
                    last_error = str(error)
                    continue
                if isinstance(error, SessionLostError):
                    raise await self._lose(
                        f"{reason}; {error.message}", cls=type(error), code=error.code, details=error.details
                    )
                raise await self._lose(f"{reason}; resume refused: {error}")
            # Not the reply's repr: a session reply carries that session's resume token.
            answer = (
                f"session {reply.data.session_id!r} (resumed={reply.data.resumed})"
                if isinstance(reply, SessionReply)
                else f"a {reply.type!r} frame"
            )
            raise await self._lose(
                f"{reason}; the resume of session {session.session_id!r} was answered with {answer}"
            )
        raise await self._lose(
            f"{reason}; gave up after {self.retry.max_attempts} reconnect attempts (last: {last_error})"
        )

    def _mark_lost(
        self,
        reason: str,
        *,
        cls: type[SessionLostError] = SessionLostError,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> SessionLostError:
        """Mark the session lost for good; the connection is closed in the background."""
        sid = self.session_id
        # `reason` may quote a resume URL (a failed reconnect): its token would let a reader take
        # the session over, and the message is logged and written into records.
        self._lost = cls(
            mask_secrets(f"Session {sid or '(openenv)'} lost: {reason}"), session_id=sid, code=code, details=details
        )
        conn, self._conn = self._conn, None
        if conn is not None:
            asyncio.get_running_loop().create_task(conn.close(CloseCode.GOING_AWAY.value))
        return self._lost

    async def _lose(
        self,
        reason: str,
        *,
        cls: type[SessionLostError] = SessionLostError,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> SessionLostError:
        """Mark the session lost for good, close the connection, and return the error to raise."""
        conn, self._conn = self._conn, None
        # Marked before awaiting anything: a cancellation must not leave the session usable.
        error = self._mark_lost(reason, cls=cls, code=code, details=details)
        # INFO, not WARNING: the error raised says the same, and whoever catches it says it once
        # (a scheduler logs the episode's error); a warning here made it two lines per episode.
        logger.info("%s", error)
        if conn is not None:
            await conn.close(CloseCode.GOING_AWAY.value)
        return error
