"""Sessions and the session table: one environment instance per session, capacity, deadlines,
resume and exactly-once request ids.

Lifecycle of a session
----------------------
* Created when a socket is accepted (OpenEnv semantics), holding one slot of
  ``max_concurrent_envs`` until it is destroyed. A socket that sends no frame within
  ``first_frame_timeout_s`` is closed. A stateless HTTP call holds a slot while it runs.
* When every slot is taken, a new connection takes the slot of the session that has awaited
  its resume longest (no socket, no call running), rather than being refused; a session opened
  without a socket (an MCP ``openenv/session/create``) is one of those too.
* Destroyed (slot freed at once; the env closed on its lane once the running call, if any,
  has returned) on a ``close`` request, on disconnect, on server shutdown, or, for a session
  that did the ``session`` handshake, when its socket has been gone for ``resume_window_s``.
* Episode phases: ``FRESH`` (no reset yet: ``step`` → NOT_RESET), ``RUNNING``, ``DONE``
  (``step`` → EPISODE_DONE until the next reset), ``TIMED_OUT``.

Layers above the sessions
-------------------------
This module knows no protocol built on top of it by name. A layer above (MCP:
`envsdk.server.mcp`) plugs into the table: ``request_handlers`` (more request types),
``step_extension`` (step actions it answers, e.g. tool calls, through `Session.call_env` or
`Session.step_by`) and ``before_env_close`` (awaited before an env is closed).

Every env call, one way
-----------------------
Each call into env code (factory, reset, step, state, close, and any other call, e.g. an MCP
tool: through `Session.run_call` from outside a request, `Session.call_env` inside one) is
serialised with the session's other calls, runs on the session's lane
thread when it is a plain function (on the loop when it is a coroutine function, or when the
env opted into ``INLINE_SYNC``; see `envsdk.server.executors`) and has a deadline: the config's
``<kind>_timeout_s``, else the env class's attribute of that name, else `DEFAULT_DEADLINES_S`.
A `BaseException` raised by env code (``SystemExit`` included) is an EXECUTION_ERROR reply.

After a deadline passes
-----------------------
The reply is ``TIMEOUT`` and the episode is over. A coroutine is cancelled; a thread cannot
be, so its lane is written off: the thread finishes the call, then closes the env (on that
same thread, after the call returned), then exits. The next ``step``/``state`` gets
NOT_RESET, and the next ``reset`` builds a fresh instance on a fresh lane. The session keeps
its slot. Written-off threads still running are capped (``max_abandoned_threads``).

Request ids: encode, record, send
---------------------------------
A request with an ``id`` runs as a task owned by the session, not by the connection, so a
dropped socket does not cancel it. Its reply is encoded first (a reply that cannot be encoded
becomes an EXECUTION_ERROR frame), then recorded, then sent: a repeat of the id is answered
from the record (or waits for the running call) and is never applied twice. The id is bound
to a hash of its request, so the same id with a different request gets ID_REUSED. The record
keeps the last ``replay_window`` replies and at most ``replay_window_bytes`` of them, the
latest reply always.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import hashlib
import inspect
import logging
import secrets
import sys
import threading
import time
import traceback
import typing
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pydantic import BaseModel

from envsdk.env import Environment, overrides_async
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.protocol import (
    ErrorCode,
    FrameError,
    code_for_peer,
    SessionInfo,
    dumps,
    encode,
    encode_observation,
    error_reply,
    session_reply,
    state_reply,
    MAX_REPORTED_ERRORS,
    extra_key_error,
    shorten_input,
    validate_model,
)
from envsdk.rewards.parts import clear_parts, non_finite, record_parts
from envsdk.server.config import DEFAULT_DEADLINES_S, ServerConfig
from envsdk.server.executors import (
    EnvAborted,
    Executors,
    Lane,
    LaneCall,
    LaneLimit,
    LoopStalls,
    OwnLoop,
    is_async_callable,
)
from envsdk.server.metrics import Metrics

__all__ = ["EnvSpec", "Session", "SessionTable", "Phase", "Connection", "StepExtension", "observation_parts", "request_digest"]

logger = logging.getLogger("envsdk.server")


class Connection(Protocol):
    """What the table needs of a socket: a way to close it (Starlette's WebSocket fits)."""

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class StepExtension(Protocol):
    """Step actions a layer above the sessions answers itself (tool calls, `envsdk.server.mcp`)."""

    def claims(self, data: dict[str, Any]) -> bool:
        """Whether a step's `data` is one of its actions (asked before the env's action type)."""
        ...

    async def step(self, session: Session, data: dict[str, Any], rid: str | None) -> str:
        """The encoded reply; runs inside `session`'s request (env calls by `Session.call_env`
        or `Session.step_by`), never before a reset that a deadline made necessary."""
        ...


@dataclass(frozen=True)
class EnvSpec:
    """What the server serves: how to build an env, and its wire types."""

    factory: Callable[[], Environment[Any, Any, Any]]
    action_type: type[BaseModel]
    observation_type: type[BaseModel]
    state_type: type[BaseModel]
    name: str
    description: str
    version: str


class Phase(enum.Enum):
    FRESH = "fresh"
    RUNNING = "running"
    DONE = "done"
    TIMED_OUT = "timed_out"


def observation_parts(obs: Any) -> tuple[dict[str, Any], Any, bool, dict[str, Any] | None]:
    """Split an observation into (body without reward/done, reward, done, metadata)."""
    body = obs.model_dump() if isinstance(obs, BaseModel) else dict(obs)
    reward = body.pop("reward", None)
    done = bool(body.pop("done", False))
    metadata = body.get("metadata")
    return body, reward, done, metadata if isinstance(metadata, dict) else None


class _Plan:
    """How calls of one kind on one env class run: on the loop as a coroutine, inline, or on
    the lane; their deadline; and, for lane calls, how long they have been taking."""

    __slots__ = ("is_async", "inline", "deadline_s", "typical_s")

    def __init__(self, is_async: bool, inline: bool, deadline_s: float) -> None:
        self.is_async = is_async
        self.inline = inline
        self.deadline_s = deadline_s
        self.typical_s = 0.0  # moving average of the calls' durations on their lanes

    def observe(self, elapsed_s: float) -> None:
        self.typical_s += (elapsed_s - self.typical_s) * 0.125


class _DeadlinePassed(Exception):
    pass


class _Interrupted(Exception):
    pass


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_DeadlinePassed())


def _get_state(env: Any) -> Any:
    return env.state


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _guarded(awaitable: Awaitable[Any]) -> Any:
    """Await env code; a SystemExit/KeyboardInterrupt it raises must not escape the task (it
    would stop the event loop), so it becomes `EnvAborted`."""
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise EnvAborted(exc) from None


class _BuildTicket:
    """A factory call on a lane. If its deadline passes, whichever side comes second (the
    factory returning, or the loop writing the lane off) closes the env it built."""

    def __init__(self, lane: Lane | None = None) -> None:
        self.lock = threading.Lock()
        self.env: Any = None
        self.timed_out = False
        self.lane = lane

    def build(self, factory: Callable[[], Any]) -> Any:
        env = factory()
        if self.lane is not None and getattr(type(env), "THREAD_BOUND", False):
            # Set on the lane's thread before the call counts as returned, so the lane cannot
            # park in between (a factory function does not say what it builds).
            self.lane.keeps_thread = True
        with self.lock:
            if not self.timed_out:
                self.env = env
                return env
        _close_sync(env)
        return None

    def give_up(self) -> Any:
        """Mark the build timed out; the env if the factory already returned (to close)."""
        with self.lock:
            self.timed_out = True
            env, self.env = self.env, None
        return env


def _close_sync(env: Any) -> None:
    """Close `env` on the calling (lane) thread, logging what it raises."""
    try:
        result = env.close()
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:  # an un-awaited coroutine: nobody runs it on a lane
                close()
    except BaseException as exc:
        logger.warning("closing %s raised %r", type(env).__name__, exc)


#: Env closes run at once at most (`SessionTable.close_slots`).
_CONCURRENT_CLOSES = 64


class SessionTable:
    """Every live session of one app, capped at ``config.max_concurrent_envs``.

    All methods run on the server's event loop.
    """

    def __init__(
        self, spec: EnvSpec, config: ServerConfig, executors: Executors, metrics: Metrics
    ) -> None:
        self.spec = spec
        self.config = config
        self.executors = executors
        self.metrics = metrics
        self._sessions: dict[str, Session] = {}
        self._reset_params: dict[type, frozenset[str] | None] = {}
        self._plans: dict[tuple[str, Any, Any], _Plan] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.stateless_calls = 0  # stateless HTTP calls running, each holding a slot
        # What a layer above the sessions adds to each (`envsdk.server.mcp` adds MCP): request
        # types it answers, step actions it answers, and work done before an env is closed.
        self.request_handlers: dict[str, Callable[[Session, Any], Awaitable[str]]] = {}
        self.step_extension: StepExtension | None = None
        self.before_env_close: list[Callable[[Any], Awaitable[None]]] = []
        self.stalls = LoopStalls(config.loop_stall_s)
        self._close_slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    @property
    def active(self) -> int:
        """Slots taken: sessions, plus stateless HTTP calls running (`take_slot`)."""
        return len(self._sessions) + self.stateless_calls

    def take_slot(self) -> None:
        """Check that one more slot is free, making room by destroying the session that has
        awaited its resume longest if need be; FrameError (CAPACITY_REACHED, SHUTTING_DOWN)
        when none is. A live connection comes before a session nobody is connected to, so
        sessions left behind after a handshake cannot hold the server's slots."""
        if self._closing:
            raise FrameError(ErrorCode.SHUTTING_DOWN, "Server is shutting down")
        n, cap = self.active, self.config.max_concurrent_envs
        if n < cap:
            return
        # Any session with no socket qualifies, one opened without a socket by a layer above (an
        # MCP ``openenv/session/create``) too: the one unused longest goes first.
        detached = [s for s in self._sessions.values() if s.connection is None and not s.busy]
        if detached:
            oldest = min(detached, key=lambda s: s.last_active)
            logger.info("session %s awaiting resume gives its slot to a new connection", oldest.id)
            self.destroy(oldest)
            return
        raise FrameError(
            ErrorCode.CAPACITY_REACHED,
            f"Server at capacity: {n}/{cap} sessions active. Cannot accept new connections.",
            active_sessions=n,
            max_sessions=cap,
            retry_after_s=self.config.capacity_retry_after_s,
        )

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    # ------------------------------------------------------------ how calls run

    def deadline(self, kind: str, owner: Any) -> tuple[float, bool]:
        """The deadline of a `kind` call on `owner` (an env class, or the factory) and whether
        it was set explicitly: ``config.<kind>_timeout_s``, else ``owner.<kind>_timeout_s``,
        else `DEFAULT_DEADLINES_S`. A kind it does not list (e.g. "tool") takes
        ``owner.<kind>_timeout_s`` if set, else the step's deadline."""
        attribute = f"{kind}_timeout_s"
        if kind not in DEFAULT_DEADLINES_S:
            declared = getattr(owner, attribute, None)
            return (float(declared), True) if declared is not None else self.deadline("step", owner)
        configured = getattr(self.config, attribute, None)
        if configured is not None:
            return float(configured), True
        declared = getattr(owner, attribute, None)
        if declared is not None:
            return float(declared), True
        return DEFAULT_DEADLINES_S.get(kind, DEFAULT_DEADLINES_S["step"]), False

    def announced_deadlines(self, env: Any) -> dict[str, float]:
        """How long the env calls of each request type of a session with `env` (None: not built
        yet) may run: what the session handshake tells a client (`SessionInfo.deadlines_s`), so
        that it waits for a call the server allows. A reset may build the env first; a step or an
        MCP request may be a tool call (its own deadline, or the step's)."""
        owner = type(env) if env is not None else _env_class(self.spec.factory)
        factory = self.spec.factory
        calls = max(self.deadline("step", owner)[0], self.deadline("tool", owner)[0])
        return {
            "reset": self.deadline("factory", factory)[0] + self.deadline("reset", owner)[0],
            "step": calls,
            "mcp": calls,
            "state": self.deadline("state", owner)[0],
        }

    def plan(self, kind: str, owner: Any, fn: Callable[..., Any]) -> _Plan:
        """How a `kind` call of `fn` on `owner` runs (cached per env class and method, or per
        function's code, so that a kind's record of its durations lasts)."""
        func = getattr(fn, "__func__", None)
        if func is None:
            func = getattr(fn, "__code__", None) if inspect.isfunction(fn) else fn if inspect.isclass(fn) else None
        key = (kind, owner, func)
        plan = self._plans.get(key) if func is not None else None
        if plan is None:
            deadline_s, explicit = self.deadline(kind, owner)
            is_async = is_async_callable(fn)
            wanted = self.config.inline_sync
            if wanted is None:
                wanted = bool(getattr(owner, "INLINE_SYNC", False))
            plan = _Plan(is_async, wanted and not is_async and not explicit, deadline_s)
            if func is not None:
                self._plans[key] = plan
        return plan

    def reset_kwargs(self, env: Any, data: dict[str, Any]) -> dict[str, Any]:
        """`data` checked against the signature of ``type(env).reset`` (of ``reset_async`` where
        that is the one served, see `Session.served`; see `unknown_reset_kwargs`)."""
        env_type = type(env)
        if env_type not in self._reset_params:
            reset = env.reset_async if overrides_async(env_type, "reset") else env.reset
            params = inspect.signature(reset).parameters.values()
            self._reset_params[env_type] = (
                None
                if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
                else frozenset(
                    p.name
                    for p in params
                    if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                )
            )
        accepted = self._reset_params[env_type]
        if accepted is None:
            return data
        unknown = [key for key in data if key not in accepted]
        if not unknown:
            return data
        if self.config.unknown_reset_kwargs == "drop":
            return {k: v for k, v in data.items() if k in accepted}
        shown = unknown[:MAX_REPORTED_ERRORS]
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"Unknown reset argument(s) {[shorten_input(k) for k in sorted(shown)]}"
            f"{f' and {len(unknown) - len(shown)} more' if len(unknown) > len(shown) else ''} for "
            f"{env_type.__name__}.reset; accepted: {sorted(accepted)}",
            errors=[extra_key_error(key, data[key], ("data",)) for key in shown],
            **({"errors_omitted": len(unknown) - len(shown)} if len(unknown) > len(shown) else {}),
        )

    def close_slots(self) -> asyncio.Semaphore:
        """What a session's env close takes first: `_CONCURRENT_CLOSES` at a time (of this
        loop). Thousands of sessions ending at once (a server shutting down, a batch of
        episodes done) would otherwise start as many lane threads at once, for envs whose
        lanes parked, every one of them then waiting for the GIL while its close's deadline
        runs."""
        loop = asyncio.get_running_loop()
        if self._close_slots is None or self._close_slots[0] is not loop:
            self._close_slots = (loop, asyncio.Semaphore(_CONCURRENT_CLOSES))
        return self._close_slots[1]

    def spawn(self, coro: Any) -> None:
        """Run `coro` in the background; shutdown waits for it (bounded)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ sessions

    async def open(self, connection: Connection | None) -> Session:
        """A new session with a fresh env for `connection`; FrameError when refused."""
        self.take_slot()
        cap = self.config.max_concurrent_envs
        session = Session(self, connection)
        # The slot is taken before the factory runs, so concurrent opens cannot overshoot.
        self._sessions[session.id] = session
        try:
            session.env = await session._build_env()
        except BaseException:
            del self._sessions[session.id]
            session.discard()
            raise
        self.metrics.sessions_opened += 1
        logger.debug("session %s opened (%d/%d)", session.id, len(self._sessions), cap)
        return session

    def find(self, session_id: str | None, resume_token: str | None) -> Session | None:
        """The resumable session with this id and token, else None (constant-time token check)."""
        session = self._sessions.get(session_id or "")
        if session is None or not session.resumable or resume_token is None:
            return None
        if not secrets.compare_digest(session.resume_token.encode(), resume_token.encode()):
            return None
        return session

    def attach(self, session: Session, connection: Connection) -> Connection | None:
        """Re-attach `session` to a resuming connection, with a new resume token; return the
        connection it replaces."""
        previous = session.connection
        session.connection = connection
        session.resumed = True
        # A token resumes once: whoever saw it (a log, a proxy) cannot replay it. The client
        # reads the new one from its next handshake reply.
        session.resume_token = secrets.token_urlsafe(32)
        session.last_active = time.monotonic()
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        return previous

    def detach(self, session: Session, connection: Connection) -> None:
        """`connection` is gone: keep a resumable session for the window, destroy any other."""
        if session.connection is not connection or session.closed:
            return  # superseded by a resume, or already destroyed
        session.connection = None
        if session.resumable and not self._closing:
            loop = asyncio.get_running_loop()
            session._expiry = loop.call_later(self.config.resume_window_s, self._expire, session)
        else:
            self.destroy(session)

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, if any (no credential checked: callers check theirs)."""
        return self._sessions.get(session_id)

    def keep(self, session: Session) -> None:
        """(Re)start the resume window of a resumable session that has no socket."""
        if session.connection is not None or session.closed or not session.resumable:
            return
        if session._expiry is not None:
            session._expiry.cancel()
        session._expiry = asyncio.get_running_loop().call_later(self.config.resume_window_s, self._expire, session)

    def _expire(self, session: Session) -> None:
        session._expiry = None
        if session.connection is None:
            logger.debug("session %s: resume window passed", session.id)
            self.destroy(session)

    def destroy(self, session: Session) -> None:
        """Free the slot now; close the env on its lane once its running call has returned."""
        if session.closed:
            return
        self._sessions.pop(session.id, None)
        self.metrics.sessions_closed += 1
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        session.discard()
        logger.debug("session %s closed (%d active)", session.id, len(self._sessions))

    def reap_idle(self, now: float) -> None:
        """Close connected sessions idle past ``idle_timeout_s`` (never one that is mid-call)."""
        limit = self.config.idle_timeout_s
        if limit is None:
            return
        for session in list(self._sessions.values()):
            if session.connection is not None and not session.busy and now - session.last_active > limit:
                connection = session.connection
                self.destroy(session)
                self.spawn(_close_quietly(connection, 1001, "idle timeout"))

    def reopen(self) -> None:
        """Take sessions again after `close_all`: the app is served again (a new lifespan)."""
        self._closing = False

    async def close_all(self) -> None:
        """Server shutdown: refuse new sessions, end every call still running (its caller
        hears SHUTTING_DOWN; a thread still in env code is written off), destroy every
        session, and wait up to the close deadline for the envs to close."""
        if self._closing:
            return
        self._closing = True
        for session in list(self._sessions.values()):
            connection = session.connection
            session.interrupt()
            self.destroy(session)
            if connection is not None:
                self.spawn(_close_quietly(connection, 1001, "server shutting down"))
        # Envs close on their lanes, after the calls running there: wait for that, but no
        # longer than the close deadline, so that the process exits whatever env code does.
        wait_s, _ = self.deadline("close", None)
        give_up_at = time.monotonic() + wait_s
        if self._background:
            await asyncio.wait(set(self._background), timeout=wait_s)
        await self.executors.wait_threads(max(0.0, give_up_at - time.monotonic()))

    @contextlib.asynccontextmanager
    async def throwaway(self) -> AsyncIterator[Session]:
        """A session with no socket and a freshly built env, for one stateless call (OpenEnv's
        HTTP routes, ``/mcp`` without a session): it holds a slot of ``max_concurrent_envs``
        while it runs (`take_slot`'s FrameError when none is free) and is discarded after."""
        self.take_slot()
        self.stateless_calls += 1
        session = Session(self, None)
        try:
            session.env = await session._build_env()
            yield session
        finally:
            self.stateless_calls -= 1
            session.discard()

    async def stateless(self, what: str, data: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's stateless HTTP call: `what` ("reset", "step" or "state") on a `throwaway`
        session's env, with the same checks and deadlines as on ``/ws``. Returns the reply's
        JSON body; raises FrameError."""
        async with self.throwaway() as session:
            env = session.env
            if what == "state":
                return await session._read_state()
            if what == "reset":
                reset, args = session.served(env, "reset")
                obs = await session.call_env("reset", reset, args, kwargs=self.reset_kwargs(env, data))
                self.metrics.resets += 1
            else:
                action = validate_model(self.spec.action_type, data)
                obs = await session._env_step(env, action)
            body, reward, done, metadata = observation_parts(obs)
            _refuse_non_finite(type(env).__name__, what, reward, metadata)
            return {"observation": body, "reward": reward, "done": done, "metadata": metadata or None}


#: Codes an env may answer with by raising `FrameError` from its code (any other is EXECUTION_ERROR).
_ENV_JUDGED = frozenset({ErrorCode.VALIDATION_ERROR, ErrorCode.CAPACITY_REACHED, ErrorCode.TIMEOUT})
#: Codes of an env's own `NotResetError` / `EpisodeDoneError` the server answers with as they are.
_EPISODE_NOT_RUNNING = frozenset({ErrorCode.NOT_RESET.value, ErrorCode.EPISODE_DONE.value})


def _execution_error(owner: Any, kind: str, exc: BaseException) -> FrameError:
    name = getattr(owner, "__name__", type(owner).__name__)
    if isinstance(exc, FrameError) and exc.code in _ENV_JUDGED:
        # The env judged the request itself (a bad option, a service of its own full or past
        # its deadline): the client gets that code, not the server's EXECUTION_ERROR.
        logger.info("%s.%s refused: %s %.256s", name, kind, exc.code.value, exc.message)
        return exc
    if isinstance(exc, (NotResetError, EpisodeDoneError)) and exc.code in _EPISODE_NOT_RUNNING:
        # The env says no episode is running (a game stopped mid-step, a step after its end):
        # the code the server itself answers with for that, not an EXECUTION_ERROR that reads
        # like a bug in the env (a plain OpenEnv peer still gets EXECUTION_ERROR, as ever).
        return FrameError(ErrorCode(exc.code), f"{name}.{kind}: {shorten_input(exc.message)}")
    cause = exc.cause if isinstance(exc, EnvAborted) else exc
    text = str(cause)
    # The env's own words, bounded: an exception may carry client input of any size.
    message = f"{name}.{kind} raised {type(cause).__name__}" + (f": {shorten_input(text)}" if text else "")
    key = (name, kind, type(cause).__name__)
    now = time.monotonic()
    if now - _TRACEBACK_LOGGED.get(key, -_TRACEBACK_EVERY_S) >= _TRACEBACK_EVERY_S:
        # The author needs the traceback once, not on every step that fails the same way.
        if len(_TRACEBACK_LOGGED) >= 1024:
            _TRACEBACK_LOGGED.clear()
        _TRACEBACK_LOGGED[key] = now
        logger.warning("%s\n%s", message, _bounded_traceback(cause))
    else:
        logger.warning("%s", message)
        if logger.isEnabledFor(logging.DEBUG):  # formatting a traceback costs every failing call
            logger.debug("%s\n%s", message, _bounded_traceback(cause))
    return FrameError(ErrorCode.EXECUTION_ERROR, message)


_TRACEBACK_EVERY_S = 60.0
_TRACEBACK_LOGGED: dict[tuple[str, str, str], float] = {}
_TRACEBACK_FRAMES = 16
_TRACEBACK_LINE_CHARS = 1000


def _bounded_traceback(exc: BaseException) -> str:
    """Where `exc` was raised: its innermost `_TRACEBACK_FRAMES` frames, each line cut to
    `_TRACEBACK_LINE_CHARS` characters (the message itself is logged beside, shortened)."""
    lines = traceback.format_tb(exc.__traceback__, limit=-_TRACEBACK_FRAMES)
    body = "".join(line if len(line) <= _TRACEBACK_LINE_CHARS else line[:_TRACEBACK_LINE_CHARS] + "...\n" for line in lines)
    return f"Traceback (most recent call last):\n{body}".rstrip("\n")


def _step_with_parts(step: Callable[[Any], Any], rubric: Any, action: Any) -> Any:
    """`step(action)` with `rubric`'s parts recorded in the observation (see `Session._env_step`)."""
    named = clear_parts(rubric)
    obs = step(action)
    record_parts(obs, named)
    return obs


def _refuse_non_finite(name: str, kind: str, reward: Any, metadata: dict[str, Any] | None) -> None:
    """EXECUTION_ERROR for a non-finite reward or reward part: JSON cannot carry it, and the
    null it would become reads as "no reward" or "not evaluated"."""
    problem = non_finite(reward, metadata)
    if problem is not None:
        logger.warning("%s.%s returned %s", name, kind, problem)
        raise FrameError(
            ErrorCode.EXECUTION_ERROR,
            f"{name}.{kind} returned {problem}: rewards and reward parts must be finite numbers; the {kind} was applied",
        )


async def _close_quietly(connection: Connection, code: int, reason: str) -> None:
    try:
        await connection.close(code=code, reason=reason)
    except Exception:  # the peer is already gone; nothing left to tell it
        pass


def request_digest(kind: str, data: Any) -> bytes:
    """What a request id is bound to: a hash of the request's type and data."""
    return hashlib.blake2b(dumps([kind, data]).encode(), digest_size=16).digest()


class Session:
    """One client session: an env instance, its lane, its episode phase, its replay record."""

    def __init__(self, table: SessionTable, connection: Connection | None) -> None:
        self.table = table
        self.id = secrets.token_urlsafe(12)
        self.resume_token = secrets.token_urlsafe(32)
        self.connection = connection
        self.env: Any = None
        self.phase = Phase.FRESH
        self.resumable = False
        self.resumed = False
        self.closed = False
        self.last_active = time.monotonic()
        self._lock = asyncio.Lock()
        self._lane: Lane | None = None
        #: The loop of `env`'s own its OpenEnv ``reset_async`` / ``step_async`` run on (`served`).
        self._own_loop: OwnLoop | None = None
        self._calls: set[asyncio.Future[Any]] = set()
        self._replies: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._replay_bytes = 0
        self._inflight: dict[str, tuple[bytes, asyncio.Future[str]]] = {}
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    # ------------------------------------------------------------ the public way in

    async def handle(self, request: Any) -> str:
        """Apply one decoded request (not ``close``) and return its encoded reply."""
        self.last_active = time.monotonic()
        rid = request.id
        digest = request_digest(request.type, getattr(request, "data", None)) if rid is not None else b""
        return await self._recorded(rid, digest, lambda: self._apply(request))

    async def run_call(
        self,
        kind: str,
        fn: Callable[..., Any],
        *args: Any,
        reply: Callable[[Any], str],
        request_id: str | None = None,
        request_hash: bytes = b"",
        deadline_s: float | None = None,
        error_reply: Callable[[FrameError], str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Run one env call of this session the way every step runs, and return its reply:
        the entry for env calls made outside a request of this session (inside one, use
        `call_env`; the session's turn is not re-entrant).

        ``fn(*args, **kwargs)`` runs serialised with the session's other calls; on the
        session's lane thread if `fn` is a plain function, on the loop if it is a coroutine
        function (or the env opted into ``INLINE_SYNC``); under `deadline_s` (default: the
        deadline of `kind`, see `SessionTable.deadline`; a kind without its own setting gets
        the step's). ``reply(result)`` encodes the result into the frame to send; it runs on
        the loop. Errors become error frames: TIMEOUT (the episode is over, as for a step),
        EXECUTION_ERROR (`fn` or `reply` raised, SystemExit included), CAPACITY_REACHED (no
        lane can be started: too many written-off threads), SESSION_ERROR (session closed),
        each encoded by ``error_reply(error)`` (default: the protocol's error frame).

        With a `request_id` the call happens at most once: its reply is recorded, a repeat
        with the same `request_hash` (e.g. `request_digest` of the request) gets the recorded
        reply (or waits for the running call), a repeat with another hash gets ID_REUSED; a
        dropped connection does not cancel it. Ids share one record with the session's
        ``/ws`` request ids.
        """

        async def produce() -> str:
            try:
                if self.closed:
                    raise self._closed_error()
                result = await self.call_env(kind, fn, args, kwargs, deadline_s=deadline_s)
                try:
                    return reply(result)
                except Exception as exc:
                    raise FrameError(
                        ErrorCode.EXECUTION_ERROR, f"the reply to {kind} cannot be encoded: {exc}"
                    ) from None
            except FrameError as exc:
                self.table.metrics.errors[exc.code.value] += 1
                return error_reply(exc) if error_reply is not None else encode(exc.to_reply(request_id))

        return await self._recorded(request_id, request_hash, produce, error_reply)

    # ------------------------------------------------------------ record

    async def _recorded(
        self, rid: str | None, digest: bytes, produce: Callable[[], Awaitable[str]],
        error_reply: Callable[[FrameError], str] | None = None,
    ) -> str:
        if rid is None:
            async with self._lock:
                return await produce()
        recorded = self._replies.get(rid)
        if recorded is not None:
            return recorded[1] if recorded[0] == digest else self._id_reused(rid, error_reply)
        pending = self._inflight.get(rid)
        future: asyncio.Future[str]
        if pending is None:
            future = asyncio.ensure_future(self._produce_and_record(rid, digest, produce))
            self._inflight[rid] = (digest, future)
        elif pending[0] != digest:
            return self._id_reused(rid, error_reply)
        else:
            future = pending[1]
        # shield: the call belongs to the session; a dropped connection must not cancel it.
        return await asyncio.shield(future)

    async def _produce_and_record(self, rid: str, digest: bytes, produce: Callable[[], Awaitable[str]]) -> str:
        try:
            async with self._lock:
                reply = await produce()
            self._record(rid, digest, reply)
            return reply
        finally:
            del self._inflight[rid]

    def _record(self, rid: str, digest: bytes, reply: str) -> None:
        replies = self._replies
        replies[rid] = (digest, reply)
        # Memory held, not characters: a non-ASCII reply takes 2-4 bytes per character.
        self._replay_bytes += sys.getsizeof(reply)
        config = self.table.config
        while len(replies) > 1 and (
            len(replies) > config.replay_window or self._replay_bytes > config.replay_window_bytes
        ):
            _, (_, dropped) = replies.popitem(last=False)
            self._replay_bytes -= sys.getsizeof(dropped)

    def _id_reused(self, rid: str, error_reply: Callable[[FrameError], str] | None) -> str:
        self.table.metrics.errors[ErrorCode.ID_REUSED.value] += 1
        error = FrameError(
            ErrorCode.ID_REUSED,
            f"Request id {rid!r} was already used on this session for a different request; "
            "send each new request with a new id (a retry must repeat the request unchanged)",
        )
        return error_reply(error) if error_reply is not None else encode(error.to_reply(rid))

    # ------------------------------------------------------------ env calls

    def _closed_error(self) -> FrameError:
        return FrameError(ErrorCode.SESSION_ERROR, "This session is closed")

    async def call_env(
        self,
        kind: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        env: Any = ...,
        deadline_s: float | None = None,
        on_write_off: Callable[[Lane], None] | None = None,
    ) -> Any:
        """``fn(*args, **kwargs)`` as a `kind` call on `env` (default: the session's env; None
        while building one): on the session's lane (or the loop, see `run_call`), under the
        deadline of `kind` unless `deadline_s` is given, a timed-out call ending the episode.
        Returns `fn`'s result; raises FrameError (TIMEOUT, EXECUTION_ERROR, CAPACITY_REACHED,
        SHUTTING_DOWN).

        For code that already runs inside one of this session's requests (a request type's
        handler: it holds the session's turn and its reply is recorded); from anywhere else
        use `run_call`, which takes the turn and keeps the record around this very call.
        `on_write_off(lane)` runs if the call's lane is written off, before the lane stops
        taking work."""
        if env is ...:
            env = self.env
        owner = type(env) if env is not None else self.table.spec.factory
        plan = self.table.plan(kind, owner, fn)
        seconds = plan.deadline_s if deadline_s is None else deadline_s
        kwargs = kwargs or {}
        task: asyncio.Task[Any] | None = None
        lane: Lane | None = None
        call: LaneCall | None = None
        wait_s = 0.0
        if plan.is_async:
            loop = self.table.executors.loop()
            try:
                task = loop.create_task(_guarded(self.table.stalls.watch(fn(*args, **kwargs), owner, kind)))
            except Exception as exc:
                raise _execution_error(owner, kind, exc) from None
            outer: asyncio.Future[Any] = loop.create_future()
            task.add_done_callback(lambda t: _copy_outcome(t, outer))
        elif plan.inline and deadline_s is None:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                raise _execution_error(owner, kind, exc) from None
            except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
                raise _execution_error(owner, kind, EnvAborted(exc)) from None
            if inspect.isawaitable(result):
                return await self.call_env(kind, _awaited, (result,), env=env, deadline_s=seconds)
            return result
        else:
            lane = self._lane or self._start_lane()
            table = self.table
            # Wait for calls of a kind that has been fast (see `envsdk.server.executors`), not
            # on a lane other sessions queue on, and never longer than `lane_wait_s`.
            wait_s = table.config.lane_wait_s
            if plan.typical_s * 10 >= wait_s or table.executors.is_shared(lane):
                wait_s = 0.0
            try:
                call = lane.call(fn, args, kwargs, wait_s)
            except RuntimeError as exc:  # a parked lane's new thread: "can't start new thread"
                raise _no_thread(table, exc) from None
            if call.settled:
                table.metrics.lane_calls_waited += 1
                plan.observe(call.elapsed or 0.0)
                if call.error is not None:
                    raise _execution_error(owner, kind, call.error) from None
                result = call.result
                if inspect.isawaitable(result):  # a sync method that returned an awaitable
                    return await self.call_env(kind, _awaited, (result,), env=env, deadline_s=seconds)
                return result
            table.metrics.lane_calls_awaited += 1
            if wait_s:
                table.metrics.lane_waits_given_up += 1
            assert call.future is not None
            outer = call.future
        # A call waited for in vain already used `wait_s` of its deadline.
        timer = self.table.executors.loop().call_later(max(seconds - wait_s, 0.0), _expire, outer)
        self._calls.add(outer)
        try:
            result = await outer
        except _DeadlinePassed:
            plan.observe(seconds)
            logger.warning("%s.%s passed its deadline of %ss", getattr(owner, "__name__", owner), kind, seconds)
            if lane is not None and on_write_off is not None:
                on_write_off(lane)
            self._write_off(kind, env, lane, task)
            raise FrameError(
                ErrorCode.TIMEOUT,
                f"{kind} did not finish within its deadline of {seconds}s; the episode is over, "
                "reset to start a new one",
                timeout_s=seconds,
            ) from None
        except _Interrupted:
            if lane is not None and on_write_off is not None:
                on_write_off(lane)
            self._write_off(kind, env, lane, task)
            raise FrameError(ErrorCode.SHUTTING_DOWN, "The server is shutting down") from None
        except asyncio.CancelledError:
            if task is not None:
                task.cancel()
            raise
        except Exception as exc:
            raise _execution_error(owner, kind, exc) from None
        finally:
            timer.cancel()
            self._calls.discard(outer)
            if call is not None and call.elapsed is not None:
                plan.observe(call.elapsed)
        if inspect.isawaitable(result):  # a sync method that returned an awaitable
            return await self.call_env(kind, _awaited, (result,), env=env, deadline_s=seconds)
        return result

    def _start_lane(self) -> Lane:
        table = self.table
        env_class = type(self.env) if self.env is not None else _env_class(table.spec.factory)
        try:
            lane = table.executors.lane(env_class if isinstance(env_class, type) else None)
        except LaneLimit as exc:
            raise FrameError(
                ErrorCode.CAPACITY_REACHED,
                f"Server at capacity: {exc}. Retry later.",
                abandoned_threads=exc.abandoned,
                max_abandoned_threads=exc.limit,
                retry_after_s=table.config.capacity_retry_after_s,
            ) from None
        except RuntimeError as exc:  # "can't start new thread": the OS's thread limit
            raise _no_thread(table, exc) from None
        self._lane = lane
        return lane

    def _write_off(self, kind: str, env: Any, lane: Lane | None, task: asyncio.Task[Any] | None) -> None:
        """A `kind` call on `env` will not be waited for: end the episode of every env it
        blocks and close those envs once the call has returned."""
        table = self.table
        if lane is None:
            assert task is not None
            task.cancel()
            if env is not None and self.env is env:
                own, self._own_loop = self._own_loop, None
                self._discard_env()
                if kind != "close" or own is not None:
                    table.spawn(self._close_after(task, env if kind != "close" else None, own))
            return
        # The call's own coroutine, when it runs on an env's own loop (an `Env` served through
        # its adapter): cancelled, it returns at once and the lane's thread is freed.
        env_loop = getattr(env, "own_loop", None)
        if isinstance(env_loop, OwnLoop):
            env_loop.cancel()
        victims = [self]
        if table.executors.is_shared(lane):
            victims += [s for s in table.sessions() if s is not self and s._lane is lane]
        for session in victims:
            session._lane = None
            own, session._own_loop = session._own_loop, None
            victim_env = session._discard_env() if session.env is not None else None
            if victim_env is not None and not (kind == "close" and victim_env is env):
                lane.post(_close_sync, victim_env)
            if own is not None:  # after the env's close, once the call running on it returned
                own.cancel()  # the call's own coroutine, if it is one: it returns at once
                lane.post(own.close)
        table.executors.abandon(lane)

    def _discard_env(self) -> Any:
        env, self.env = self.env, None
        self.phase = Phase.TIMED_OUT
        if env is not None:
            for hook in self.table.before_env_close:
                self.table.spawn(hook(env))
        return env

    async def _close_after(self, task: asyncio.Task[Any], env: Any, own: OwnLoop | None = None) -> None:
        await asyncio.wait({task})
        await self._close_env(env, own)

    async def _close_env(self, env: Any, own: OwnLoop | None = None) -> None:
        """Close `env` (None: none) under the close deadline (on the lane for a sync close), then
        its own loop (`served`) on the lane; errors logged."""
        closes: list[Callable[[], Any]] = []
        if env is not None:
            for hook in self.table.before_env_close:
                await hook(env)
            closes.append(env.close)
        if own is not None:
            closes.append(own.close)
        for close in closes:
            try:
                await self.call_env("close", close, env=env)
            except FrameError as exc:
                if exc.code not in (ErrorCode.EXECUTION_ERROR, ErrorCode.TIMEOUT):  # those are logged already
                    logger.warning("closing %s: %s", type(env).__name__, exc.message)

    async def _build_env(self) -> Any:
        """A fresh env from the factory, on this session's lane (so it is born on the thread
        that will run it), under the factory deadline. FACTORY_ERROR when it raises."""
        table = self.table
        factory = table.spec.factory
        plan = table.plan("factory", factory, factory)
        ticket = _BuildTicket(None if plan.is_async or plan.inline else self._lane or self._start_lane())

        def close_orphan(lane: Lane) -> None:
            orphan = ticket.give_up()
            if orphan is not None:  # the factory returned just as its deadline passed
                lane.post(_close_sync, orphan)

        try:
            if plan.is_async or plan.inline:
                env = await self.call_env("factory", factory, env=None)
            else:
                env = await self.call_env("factory", ticket.build, (factory,), env=None, on_write_off=close_orphan)
        except FrameError as exc:
            if exc.code is not ErrorCode.EXECUTION_ERROR:
                raise
            raise FrameError(
                ErrorCode.FACTORY_ERROR,
                f"Environment factory '{table.spec.name}' failed to create instance: {exc.message}",
                factory_name=table.spec.name,
            ) from None
        return env

    def interrupt(self) -> None:
        """Server shutdown: every call of this session still running ends now (SHUTTING_DOWN)."""
        for call in list(self._calls):
            if not call.done():
                call.set_exception(_Interrupted())

    def discard(self) -> None:
        """Mark the session closed; close its env on its lane once the running call (bounded
        by its deadline) has returned, then let the lane's thread exit."""
        if self.closed:
            return
        self.closed = True
        self.table.spawn(self._finish())

    async def _finish(self) -> None:
        async with self._lock:
            env, self.env = self.env, None
            own, self._own_loop = self._own_loop, None
            if env is not None or own is not None:
                async with self.table.close_slots():
                    await self._close_env(env, own)
            if self._lane is not None:
                self.table.executors.retire(self._lane)
                self._lane = None

    # ------------------------------------------------------------ requests

    async def _apply(self, request: Any) -> str:
        rid = request.id
        try:
            if self.closed:
                raise self._closed_error()
            kind = request.type
            if kind == "step":
                return await self._step(request.data, rid)
            if kind == "reset":
                return await self._reset(request.data, rid)
            if kind == "state":
                return await self._state(rid)
            handler = self.table.request_handlers.get(kind)
            if handler is not None:
                return await handler(self, request)
            return await self._session_info(rid)
        except FrameError as exc:
            code = code_for_peer(exc.code, self.resumable or rid is not None)
            if code is not exc.code:
                exc = FrameError(code, exc.message, **exc.details)
            self.table.metrics.errors[exc.code.value] += 1
            return encode(exc.to_reply(rid))
        except Exception as exc:  # a server bug must cost this request, not the connection
            logger.error("request %s of session %s failed", request.type, self.id, exc_info=exc)
            self.table.metrics.errors[ErrorCode.EXECUTION_ERROR.value] += 1
            return encode(FrameError(ErrorCode.EXECUTION_ERROR, f"internal error: {exc!r}").to_reply(rid))

    def _not_reset(self) -> FrameError:
        if self.phase is Phase.TIMED_OUT:
            return FrameError(
                ErrorCode.NOT_RESET, "the previous call timed out; reset to start a new episode"
            )
        return FrameError(ErrorCode.NOT_RESET, "No episode is running: send reset first")

    def _observation_frame(self, env: Any, kind: str, obs: Any, rid: str | None) -> str:
        """Encode an observation reply; the episode phase follows the observation even when
        the reply cannot be encoded (the call did happen)."""
        name = type(env).__name__
        try:
            body, reward, done, metadata = observation_parts(obs)
        except Exception as exc:
            raise FrameError(
                ErrorCode.EXECUTION_ERROR, f"{name}.{kind} returned {type(obs).__name__}, not an observation: {exc}"
            ) from None
        self.phase = Phase.DONE if done else Phase.RUNNING
        _refuse_non_finite(name, kind, reward, metadata)
        try:
            return encode_observation(body, reward, done, metadata=metadata, request_id=rid)
        except Exception as exc:
            logger.warning("%s.%s returned an observation that cannot be encoded: %s", name, kind, exc)
            raise FrameError(
                ErrorCode.EXECUTION_ERROR,
                f"{name}.{kind} returned an observation that cannot be encoded as JSON ({exc}); "
                f"the {kind} was applied",
            ) from None

    async def _step(self, data: dict[str, Any], rid: str | None) -> str:
        extension = self.table.step_extension
        if extension is not None and extension.claims(data):
            # Tool calls need no episode (as in OpenEnv), but they need an env: after a deadline
            # wrote it off, NOT_RESET as for any step.
            if self.env is None:
                raise self._not_reset()
            return await extension.step(self, data, rid)
        env = self.env
        if env is None or self.phase is Phase.FRESH:
            raise self._not_reset()
        if self.phase is Phase.DONE:
            raise FrameError(
                ErrorCode.EPISODE_DONE, "The episode is over (done=true): send reset to start a new one"
            )
        table = self.table
        action = validate_model(table.spec.action_type, data)
        started = time.perf_counter()
        obs = await self._env_step(env, action)
        table.metrics.observe_step(time.perf_counter() - started)
        return self._observation_frame(env, "step", obs, rid)

    async def _env_step(self, env: Any, action: Any) -> Any:
        """``env.step(action)`` as a step call; for an env with a rubric (OpenEnv's or
        envsdk's), its named parts scored during the step go into the observation's metadata
        (`envsdk.rewards.parts.record_parts`), on the thread the step runs on."""
        step, args = self.served(env, "step")
        rubric = getattr(env, "rubric", None)
        if rubric is None or not callable(getattr(rubric, "named_rubrics", None)):
            return await self.call_env("step", step, (*args, action))
        if is_async_callable(step):
            named = clear_parts(rubric)
            obs = await self.call_env("step", step, (*args, action))
            record_parts(obs, named)
            return obs
        return await self.call_env("step", _step_with_parts, (functools.partial(step, *args), rubric, action))

    def served(self, env: Any, name: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The call that serves `name` ("reset" or "step") on `env`, as ``(fn, leading args)``:
        ``env.<name>``, or, for an OpenEnv env whose class overrides ``<name>_async`` (which
        OpenEnv 0.10's server then calls instead, `envsdk.env.overrides_async`), that coroutine
        run to completion on `env`'s own loop (`OwnLoop`), a plain call on the session's lane
        like any sync one, never on the server's loop."""
        if not overrides_async(type(env), name):
            return getattr(env, name), ()
        if self._own_loop is None:
            self._own_loop = OwnLoop()
        return self._own_loop.call, (getattr(env, f"{name}_async"),)

    async def step_by(
        self, fn: Callable[[Any], Any], action: Any, rid: str | None, *, deadline_s: float | None = None
    ) -> str:
        """A step of the env made by ``fn(action)`` rather than ``env.step`` (a step extension's
        choice, e.g. OpenEnv's ``step_async`` for a tool action), inside this session's request:
        a ``step`` call under the step deadline (or `deadline_s`), timed like a step, its
        observation the reply, the episode's phase following it."""
        env = self.env
        started = time.perf_counter()
        obs = await self.call_env("step", fn, (action,), deadline_s=deadline_s)
        self.table.metrics.observe_step(time.perf_counter() - started)
        return self._observation_frame(env, "step", obs, rid)

    async def _reset(self, data: dict[str, Any], rid: str | None) -> str:
        table = self.table
        if self.env is None:
            self.env = await self._build_env()
        env = self.env
        kwargs = table.reset_kwargs(env, data)
        reset, args = self.served(env, "reset")
        obs = await self.call_env("reset", reset, args, kwargs=kwargs)
        table.metrics.resets += 1
        return self._observation_frame(env, "reset", obs, rid)

    async def _read_state(self) -> dict[str, Any]:
        """``env.state`` as a dict, read on the lane under the state deadline."""
        env = self.env
        state = await self.call_env("state", _get_state, (env,), env=env)
        try:
            return state.model_dump() if isinstance(state, BaseModel) else dict(state)
        except Exception as exc:
            raise FrameError(
                ErrorCode.EXECUTION_ERROR, f"{type(env).__name__}.state returned {type(state).__name__}: {exc}"
            ) from None

    async def _state(self, rid: str | None) -> str:
        # Unlike step, state before the first reset is allowed (OpenEnv answers it).
        if self.env is None:
            raise self._not_reset()
        state = await self._read_state()
        try:
            return encode(state_reply(state, request_id=rid))
        except Exception as exc:
            raise FrameError(ErrorCode.EXECUTION_ERROR, f"the state cannot be encoded as JSON: {exc}") from None

    async def _session_info(self, rid: str | None) -> str:
        self.resumable = True
        episode_id, step_count = None, 0
        # Before the first reset there is no episode to report, and many envs (the README's
        # among them) have no state to read yet.
        if self.env is not None and self.phase in (Phase.RUNNING, Phase.DONE):
            try:
                state = await self._read_state()
                episode_id = state.get("episode_id")
                step_count = int(state.get("step_count", 0) or 0)
            except (FrameError, TypeError, ValueError):  # a state that cannot be read now is reported as unknown
                pass
        info = SessionInfo(
            session_id=self.id,
            resume_token=self.resume_token,
            resumed=self.resumed,
            resume_window_s=self.table.config.resume_window_s,
            max_frame_bytes=self.table.config.max_frame_bytes,
            episode_id=episode_id if isinstance(episode_id, str) else None,
            step_count=step_count,
            done=self.phase is Phase.DONE,
            deadlines_s=self.table.announced_deadlines(self.env),
        )
        return encode(session_reply(info, request_id=rid))


def _env_class(factory: Any) -> Any:
    """The env class `factory` builds, where it tells (a class, or a function annotated with
    its return class), else the factory itself: whose ``<kind>_timeout_s`` attributes set the
    deadlines of an env not built yet."""
    if isinstance(factory, type):
        return factory
    try:
        built = typing.get_type_hints(factory).get("return")
    except Exception:  # annotations that do not resolve: the factory's own attributes then
        return factory
    return built if isinstance(built, type) else factory


def _no_thread(table: SessionTable, exc: RuntimeError) -> FrameError:
    """CAPACITY_REACHED for a call whose lane could not start a thread (the OS's thread limit)."""
    logger.warning("cannot start a lane thread: %s", exc)
    return FrameError(
        ErrorCode.CAPACITY_REACHED,
        f"Server at capacity: cannot start a thread for this session ({exc}). Retry later.",
        retry_after_s=table.config.capacity_retry_after_s,
    )


def _copy_outcome(task: asyncio.Task[Any], outer: asyncio.Future[Any]) -> None:
    if outer.done():
        if not task.cancelled():
            task.exception()  # seen, so asyncio does not log it at GC time
        return
    if task.cancelled():
        outer.cancel()
    elif task.exception() is not None:
        outer.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        outer.set_result(task.result())


def error_frame(code: ErrorCode, message: str, **details: Any) -> str:
    """An encoded error frame (for replies sent outside a session)."""
    return encode(error_reply(code, message, **details))
