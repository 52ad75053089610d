"""`create_app`: a FastAPI app serving one environment over `/ws` and HTTP.

WebSocket ``/ws`` speaks OpenEnv's protocol (see `envsdk.protocol`), plus envsdk's opt-in
extensions:

* ``{"type": "session"}`` answers a `SessionInfo`; from then on the session survives its
  socket for ``resume_window_s``. Resume by connecting to
  ``/ws?session_id=<id>&resume_token=<token>``: nothing is sent on success (send
  ``{"type":"session"}`` again to read ``resumed: true``, the episode's position and the new
  resume token: each token resumes once); an
  unknown id, a wrong token or an expired session gets ``RESUME_FAILED`` then close 4404.
  A resume closes the session's previous socket, if still open, with 4409.
* ``"id"`` on a request: echoed on the reply; exactly-once replay (see `sessions`).

Frame size: text frames of more than ``max_frame_bytes`` UTF-8 bytes get FRAME_TOO_LARGE
and the session goes on. Frames beyond the WebSocket layer's own limit (uvicorn's
``ws_max_size``; `envsdk.server.serve` sets it to four times ``max_frame_bytes``) are refused
by that layer with close code 1009. Binary frames are answered with INVALID_JSON.

A socket that sends no frame within ``first_frame_timeout_s`` is closed (1008).

HTTP: ``GET /health``, ``/metadata``, ``/schema``, ``/metrics`` (Prometheus text), and
OpenEnv's stateless ``POST /reset``, ``POST /step``, ``GET /state`` (not in production mode,
``ServerConfig.mode``); each stateless call holds a slot of ``max_concurrent_envs`` while it
runs. MCP (``POST /mcp``, ``WS /mcp``, ``{"type":"mcp"}`` on ``/ws``, OpenEnv's
``/ws?session_id=<handle>`` attach): see `envsdk.server.mcp`. Bodies over ``max_body_bytes`` get 413
(`envsdk.server.limits`).

Access: every route but ``/health`` passes `envsdk.server.auth.AccessControl` (Host allow-list,
optional bearer token, browser Origin check). Graceful shutdown: ``app.state.envsdk_drain`` (run by
`envsdk.server.serve` on SIGTERM/SIGINT, before uvicorn closes the sockets) stops taking
requests, lets those in flight finish for up to ``drain_timeout_s``, sends every connection a
``SHUTTING_DOWN`` error frame, closes it with 1001 "server shutting down" and closes every env.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Callable

from fastapi import Body, FastAPI, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

import envsdk
from envsdk.env import Environment
from envsdk.protocol import (
    PROTOCOL_VERSION,
    WS_PATH,
    CloseCode,
    ErrorCode,
    FrameError,
    decode_request,
    encode,
)
from envsdk.server.auth import AccessControl
from envsdk.server.limits import BodyLimit
from envsdk.server.config import ServerConfig
from envsdk.server.executors import Executors
from envsdk.server.mcp import attach_target, created_over_mcp, mount_mcp
from envsdk.server.metrics import Metrics
from envsdk.server.sessions import EnvSpec, Session, SessionTable, error_frame
from envsdk.types import Action, Observation, State

__all__ = ["create_app"]

logger = logging.getLogger("envsdk.server")

_HTTP_STATUS = {
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.SHUTTING_DOWN: 503,
}
OPENENV_API_VERSION = "1.0.0"
"""The OpenEnv HTTP API version these apps implement (their OpenAPI ``info.version``)."""
_BINARY_FRAME = "Binary frames are not accepted: send each request as a JSON text frame"


class _HTTPStepBody(BaseModel):
    """OpenEnv's ``POST /step`` body; ``timeout_s`` and ``request_id`` are accepted and unused."""

    action: dict[str, Any]
    timeout_s: float | None = None
    request_id: str | None = None


def create_app(
    env_factory: type[Environment[Any, Any, Any]] | Callable[[], Environment[Any, Any, Any]],
    action_type: type[BaseModel] | None,
    observation_type: type[BaseModel] | None,
    *,
    state_type: type[BaseModel] = State,
    reset_observation_type: type[BaseModel] | None = None,
    config: ServerConfig | None = None,
    **config_overrides: Any,
) -> FastAPI:
    """Build the app that serves `env_factory` (an Environment subclass or a zero-argument
    callable returning an env instance; called once per session). An instance is refused
    with OpenEnv's TypeError. `action_type` / `observation_type` None: envsdk's base `Action` /
    `Observation` (an env driven by its tools, as OpenEnv's ``create_fastapi_app(env, None, None)``).

    `reset_observation_type` (OpenEnv's ``reset_observation_cls``): the model of reset's
    observation published as ``reset_observation`` in ``/schema``; default `observation_type`.

    `config_overrides` are `ServerConfig` fields applied on top of `config` (or the defaults):
    ``create_app(Env, A, O, max_concurrent_envs=4)``. The app's lifespan shutdown closes every
    env and the pools; a new lifespan (the app served again) takes sessions again, as OpenEnv's
    apps do. ``app.state.envsdk_config`` is the effective config.
    """
    if not callable(env_factory):
        # OpenEnv's own words, at build time rather than at the first connection.
        raise TypeError(
            f"env must be a callable (class or factory function), got {type(env_factory)}. "
            f"Pass the environment class (e.g., MyEnvironment) not an instance (e.g., MyEnvironment())."
        )
    action_type = action_type or Action
    observation_type = observation_type or Observation
    reset_observation = reset_observation_type or observation_type
    base = config or ServerConfig()
    cfg = ServerConfig.model_validate({**base.model_dump(), **config_overrides}) if config_overrides else base
    env_class = env_factory if isinstance(env_factory, type) else None
    name = str(cfg.env_name or getattr(env_factory, "__name__", type(env_factory).__name__))
    # The class's own docstring only: inspect.getdoc would inherit envsdk's `Environment` one.
    own_doc = env_class.__dict__.get("__doc__") if env_class is not None else None
    doc = inspect.cleandoc(own_doc) if isinstance(own_doc, str) and own_doc.strip() else None
    spec = EnvSpec(
        factory=env_factory,
        action_type=action_type,
        observation_type=observation_type,
        state_type=state_type,
        name=name,
        description=doc.splitlines()[0] if doc else f"{name} environment",
        version=str(getattr(env_class, "version", "1.0.0")),
    )
    executors = Executors(cfg.max_abandoned_threads, cfg.process_workers, cfg.lane_idle_s, cfg.max_concurrent_envs)
    metrics = Metrics()
    table = SessionTable(spec, cfg, executors, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # A previous lifespan's shutdown refused new sessions; this one serves again.
        table.reopen()
        drain.draining = False
        reaper = asyncio.ensure_future(_reap_forever(table)) if cfg.idle_timeout_s else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
            await table.close_all()
            executors.shutdown()

    # OpenAPI's info.version is the HTTP API's version, which `openenv validate` reads to rate
    # a server: OpenEnv's API 1.x is what this app speaks (the env's own version is in /metadata).
    app = FastAPI(title=name, description=spec.description, version=OPENENV_API_VERSION, lifespan=lifespan)
    app.state.envsdk_config = cfg
    app.state.envsdk_sessions = table
    drain = _Drain(table)
    app.state.envsdk_drain = drain.run
    app.add_middleware(
        AccessControl,
        token=cfg.token.get_secret_value() if cfg.token else None,
        allowed_origins=cfg.allowed_origins,
        allowed_hosts=cfg.allowed_hosts,
    )
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    if cfg.web:
        from envsdk.web import mount_web

        mount_web(app, spec)
    mount_mcp(app, table)

    @app.websocket(WS_PATH)
    async def ws_endpoint(ws: WebSocket) -> None:
        await ws.accept()
        executors.bind()
        query = ws.query_params
        session_id, resume_token = query.get("session_id"), query.get("resume_token")
        if session_id is not None or resume_token is not None:
            found = attach_target(table, session_id, resume_token)
            if found is None:
                table.metrics.errors[ErrorCode.RESUME_FAILED.value] += 1
                await _refuse(
                    ws,
                    error_frame(
                        ErrorCode.RESUME_FAILED,
                        f"Cannot resume session {session_id!r}: unknown, expired, or wrong resume token",
                        session_id=session_id,
                    ),
                    CloseCode.SESSION_NOT_FOUND,
                )
                return
            session = found
            previous = table.attach(session, ws)
            if previous is not None:
                asyncio.ensure_future(_close_superseded(previous))
        else:
            try:
                session = await table.open(ws)
            except FrameError as exc:
                table.metrics.errors[exc.code.value] += 1
                code = (
                    CloseCode.TRY_AGAIN_LATER
                    if exc.code in (ErrorCode.CAPACITY_REACHED, ErrorCode.SHUTTING_DOWN)
                    else CloseCode.NORMAL
                )
                await _refuse(ws, error_frame(exc.code, exc.message, **exc.details), code)
                return
        drain.connections.add(ws)
        try:
            await _serve_connection(ws, session, table, drain)
        finally:
            drain.connections.discard(ws)
            table.detach(session, ws)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "healthy",
            "active_sessions": table.active,
            "max_sessions": cfg.max_concurrent_envs,
            "env_name": spec.name,
            "lane_threads": executors.live_lanes,
            "abandoned_threads": executors.abandoned_threads,
            "max_abandoned_threads": cfg.max_abandoned_threads,
        }

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": spec.name,
            "description": spec.description,
            "readme_content": None,
            "version": spec.version,
            "author": None,
            "documentation_url": None,
            "envsdk_version": envsdk.__version__,
            "protocol_version": PROTOCOL_VERSION,
        }

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": action_type.model_json_schema(),
            "observation": observation_type.model_json_schema(),
            "reset_observation": reset_observation.model_json_schema(),
            "state": state_type.model_json_schema(),
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> str:
        return metrics.render(
            active_sessions=table.active, max_sessions=cfg.max_concurrent_envs,
            lane_threads=executors.live_lanes, abandoned_threads=executors.abandoned_threads,
            loop_stalls=table.stalls.counts, loop_stall_seconds=table.stalls.seconds,
        )

    if cfg.mode == "production":
        return app

    @app.post("/reset")
    async def http_reset(body: dict[str, Any] | None = Body(default=None)) -> Any:
        """Stateless, as in OpenEnv: a fresh env is built, reset with the body's keyword
        arguments, and closed; the reply is ``{observation, reward, done, metadata}``."""
        return await _stateless(table, "reset", body or {})

    @app.post("/step")
    async def http_step(body: _HTTPStepBody) -> Any:
        """Stateless, as in OpenEnv: a fresh env (never reset) takes the one action, then is
        closed. Useful only for envs that can step without a reset."""
        return await _stateless(table, "step", body.action)

    @app.get("/state")
    async def http_state() -> Any:
        """Stateless, as in OpenEnv: the state of a freshly built env, which is then closed."""
        return await _stateless(table, "state", {})

    return app


class _Drain:
    """What graceful shutdown needs to know: the open sockets and how many requests are
    being answered (from decoding to the reply's send)."""

    def __init__(self, table: SessionTable) -> None:
        self.table = table
        self.connections: set[WebSocket] = set()
        self.busy = 0
        self.draining = False

    async def run(self) -> None:
        """Stop taking requests (new ones get SHUTTING_DOWN), wait up to ``drain_timeout_s``
        for those in flight to be answered, tell every connection SHUTTING_DOWN, then close
        every session (sockets with 1001, envs closed). Idempotent."""
        if self.draining:
            return
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.table.config.drain_timeout_s
        while self.busy and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.busy:
            logger.warning("shutting down with %d request(s) still running after the drain timeout", self.busy)
        frame = error_frame(ErrorCode.SHUTTING_DOWN, _SHUTTING_DOWN)
        # Bounded as a whole: a client that stopped reading must not hold up the shutdown. One
        # timeout for all (not one each: 16,384 of those took seconds of the loop's time).
        sends = [asyncio.ensure_future(_send_quietly(ws, frame)) for ws in list(self.connections)]
        if sends:
            _, late = await asyncio.wait(sends, timeout=_SHUTDOWN_SEND_S)
            for send in late:
                send.cancel()
        await self.table.close_all()


#: How long the drain waits for its SHUTTING_DOWN frames to be sent.
_SHUTDOWN_SEND_S = 1.0
_SHUTTING_DOWN = "The server is shutting down: this session is over; start a new one on a server that is up"


async def _send_quietly(ws: WebSocket, frame: str) -> None:
    try:
        await ws.send_text(frame)
    except Exception:  # the peer is gone or stuck; the close that follows is all it gets
        pass


async def _serve_connection(ws: WebSocket, session: Session, table: SessionTable, drain: _Drain) -> None:
    """Read requests until the socket goes or the client sends ``close``; one reply each."""
    send = ws.send_text
    message = await _first_message(ws, table.config.first_frame_timeout_s)
    if message is None:
        return
    while True:
        if message["type"] == "websocket.disconnect":
            return
        drain.busy += 1  # until the reply is sent, so a drain lets it reach the client
        try:
            reply = await _answer(message.get("text"), session, table, drain)
            # The frame and what it parsed to (a 16 MiB frame can make 100 MiB of objects) must
            # not stay alive while the connection waits for the next one.
            del message
            if reply is None:  # the client's `close`
                if not created_over_mcp(session):  # that one ends by openenv/session/close
                    table.destroy(session)
                await _close_quietly(ws, CloseCode.NORMAL)
                return
            try:
                await send(reply)
            except Exception:  # any send failure means the peer is gone; the caller detaches
                return
        finally:
            drain.busy -= 1
        message = await ws.receive()


async def _answer(text: str | None, session: Session, table: SessionTable, drain: _Drain) -> str | None:
    """The encoded reply to one frame (`text` None: a binary frame), or None for ``close``."""
    errors = table.metrics.errors
    if text is None:
        errors[ErrorCode.INVALID_JSON.value] += 1
        return error_frame(ErrorCode.INVALID_JSON, _BINARY_FRAME)
    try:
        request = decode_request(text, max_bytes=table.config.max_frame_bytes)
    except FrameError as exc:
        errors[exc.code.value] += 1
        return error_frame(exc.code, exc.message, **exc.details)
    if request.type == "close":
        return None
    if drain.draining:
        errors[ErrorCode.SHUTTING_DOWN.value] += 1
        return encode(FrameError(ErrorCode.SHUTTING_DOWN, _SHUTTING_DOWN).to_reply(request.id))
    return await session.handle(request)


async def _first_message(ws: WebSocket, timeout: float | None) -> Any:
    """The client's first message, or None when none came within `timeout` (the socket is then
    closed with 1008): an accepted socket holds a slot and an env, it must use them."""
    if timeout is None:
        return await ws.receive()
    try:
        return await asyncio.wait_for(ws.receive(), timeout)
    except TimeoutError:
        await _close_quietly(ws, CloseCode.POLICY_VIOLATION, f"no request within {timeout} s")
        return None


async def _refuse(ws: WebSocket, frame: str, code: int) -> None:
    try:
        await ws.send_text(frame)
    except Exception:  # the peer left before hearing why; nothing to do
        return
    await _close_quietly(ws, code)


async def _close_quietly(ws: Any, code: int, reason: str | None = None) -> None:
    try:
        await ws.close(code=code, reason=reason)
    except Exception:  # already closed by the peer
        pass


async def _close_superseded(ws: Any) -> None:
    await _close_quietly(ws, CloseCode.SUPERSEDED, "superseded by a resumed connection")


async def _reap_forever(table: SessionTable) -> None:
    limit = table.config.idle_timeout_s or 1.0
    while True:
        await asyncio.sleep(min(limit / 2, 5.0))
        table.reap_idle(time.monotonic())


async def _stateless(table: SessionTable, what: str, data: dict[str, Any]) -> Any:
    """One call on a throw-away env, with the WebSocket path's checks and deadlines; it holds
    a slot of ``max_concurrent_envs`` while it runs (503 CAPACITY_REACHED when none is free)."""
    try:
        return await table.stateless(what, data)
    except FrameError as exc:
        if what == "step" and exc.code in (ErrorCode.EXECUTION_ERROR, ErrorCode.NOT_RESET, ErrorCode.EPISODE_DONE):
            # Almost always an env that needs a reset first: say what HTTP /step is, beside the
            # env's own exception (same code and status as OpenEnv's).
            exc = FrameError(
                ErrorCode.EXECUTION_ERROR,
                f"{exc.message} -- HTTP /step is stateless, as in OpenEnv: it runs one action on a fresh"
                " environment that was never reset, so an earlier POST /reset does not carry over; play"
                " episodes over the /ws WebSocket (EnvClient, or any OpenEnv client)",
                **exc.details,
            )
        return _http_error(table, exc)


def _http_error(table: SessionTable, exc: FrameError) -> JSONResponse:
    table.metrics.errors[exc.code.value] += 1
    if exc.code is ErrorCode.VALIDATION_ERROR and "errors" in exc.details:
        return JSONResponse({"detail": exc.details["errors"]}, status_code=422)
    status = _HTTP_STATUS.get(exc.code, 500)
    return JSONResponse({"detail": {"message": exc.message, "code": exc.code.value, **exc.details}}, status_code=status)
