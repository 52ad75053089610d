"""Sessions and the session table: one environment instance per session, capacity, deadlines,
resume and exactly-once request ids.

Lifecycle of a session
----------------------
* Created when a socket is accepted (OpenEnv semantics), holding one slot of
  ``max_concurrent_envs`` until it is destroyed.
* Destroyed (env closed in the background, slot freed at once) on a ``close`` request, on
  disconnect, on server shutdown, or, for a session that did the ``session`` handshake, when
  its socket has been gone for ``resume_window_s``.
* Episode phases: ``FRESH`` (no reset yet: ``step`` → NOT_RESET), ``RUNNING``, ``DONE``
  (``step`` → EPISODE_DONE until the next reset), ``TIMED_OUT``.

After a deadline passes
-----------------------
The reply is ``TIMEOUT`` and the episode is over: the env instance is discarded (a coroutine
is cancelled; a thread cannot be, so the instance is closed in the background once its call
returns), the next ``step``/``state`` gets NOT_RESET, and the next ``reset`` builds a fresh
instance from the factory. The session keeps its slot.

Request ids
-----------
Each env call of a request with an ``id`` runs as a task owned by the session, not by the
connection, so a dropped socket does not cancel it. Its encoded reply is remembered for the
last ``replay_window`` ids: a repeated id is answered from that record (or waits for the still
running call) and is never applied twice.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pydantic import BaseModel, ValidationError

from envsdk.env import Environment
from envsdk.protocol import (
    ErrorCode,
    FrameError,
    SessionInfo,
    encode,
    encode_observation,
    error_reply,
    session_reply,
    state_reply,
    validation_errors,
    validation_message,
)
from envsdk.server.config import ServerConfig
from envsdk.server.executors import Executors, is_async_callable
from envsdk.server.metrics import Metrics

__all__ = ["EnvSpec", "Session", "SessionTable", "Phase", "Connection", "observation_parts"]

logger = logging.getLogger("envsdk.server")

_ENV_CLOSE_TIMEOUT_S = 30.0


class Connection(Protocol):
    """What the table needs of a socket: a way to close it (Starlette's WebSocket fits)."""

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


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


def _retrieve(fut: asyncio.Future[Any]) -> None:
    # Marks an abandoned call's exception as seen, so asyncio does not log it at GC time.
    if not fut.cancelled():
        fut.exception()


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
        self._inline: dict[tuple[Any, str], bool] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False

    @property
    def active(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------ env instances

    async def create_env(self) -> Environment[Any, Any, Any]:
        """Build one env instance (in the thread pool, or on the loop for an inline env, see
        `runs_inline`); FACTORY_ERROR when the factory raises."""
        factory = self.spec.factory
        try:
            env: Environment[Any, Any, Any]
            if self.runs_inline(factory, "__init__", factory):
                env = factory()
            else:
                env = await self.executors.start(factory)
            return env
        except Exception as exc:
            logger.warning("environment factory %r failed: %r", self.spec.name, exc)
            raise FrameError(
                ErrorCode.FACTORY_ERROR,
                f"Environment factory '{self.spec.name}' failed to create instance: {exc}",
                factory_name=self.spec.name,
            ) from None

    def close_env_soon(self, env: Any, after: asyncio.Future[Any] | None = None) -> None:
        """Close `env` in the background, once `after` (a call still running on it) is done."""
        self._spawn(self._close_env(env, after))

    async def _close_env(self, env: Any, after: asyncio.Future[Any] | None) -> None:
        if after is not None:
            await asyncio.wait({after})
        try:
            if self.runs_inline(type(env), "close", env.close):
                result = env.close()
            else:
                result = await asyncio.wait_for(self.executors.start(env.close), _ENV_CLOSE_TIMEOUT_S)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, _ENV_CLOSE_TIMEOUT_S)
        except Exception as exc:
            logger.warning("closing %s raised %r", type(env).__name__, exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def reset_kwargs(self, env: Any, data: dict[str, Any]) -> dict[str, Any]:
        """`data` checked against ``type(env).reset``'s signature (see `unknown_reset_kwargs`)."""
        env_type = type(env)
        if env_type not in self._reset_params:
            params = inspect.signature(env.reset).parameters.values()
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
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"Unknown reset argument(s) {sorted(unknown)} for {env_type.__name__}.reset; "
            f"accepted: {sorted(accepted)}",
            errors=[
                {"type": "extra_forbidden", "loc": ["data", key], "msg": "Extra inputs are not permitted", "input": data[key]}
                for key in unknown
            ],
        )

    def runs_inline(self, owner: Any, method: str, fn: Callable[..., Any]) -> bool:
        """Whether `fn` (``owner``'s `method`) runs directly on the loop: a sync callable of
        an env that opted in (``ServerConfig.inline_sync``, else ``owner.INLINE_SYNC``)."""
        key = (owner, method)
        inline = self._inline.get(key)
        if inline is None:
            wanted = self.config.inline_sync
            if wanted is None:
                wanted = bool(getattr(owner, "INLINE_SYNC", False))
            inline = self._inline[key] = wanted and not is_async_callable(fn)
        return inline

    def deadline(self, env: Any, which: str) -> float | None:
        configured = getattr(self.config, which)
        return configured if configured is not None else getattr(type(env), which, None)

    async def call(
        self, env: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None,
        on_abandon: Callable[[asyncio.Future[Any]], None],
    ) -> Any:
        """Run ``env.<method>(*args, **kwargs)`` under a deadline.

        Raises FrameError: TIMEOUT past the deadline (after calling `on_abandon` with the still
        running call), EXECUTION_ERROR when the method raises. A sync method of an inline env
        (see `runs_inline`) without a deadline is called right here, on the loop.
        """
        fn = getattr(env, method)
        try:
            if timeout is None and self.runs_inline(type(env), method, fn):
                result = fn(*args, **kwargs)
            else:
                fut = self.executors.start(fn, *args, **kwargs)
                if timeout is None:
                    result = await fut
                else:
                    try:
                        result = await asyncio.wait_for(asyncio.shield(fut), timeout)
                    except TimeoutError:
                        if fut.done():  # the env itself raised TimeoutError
                            raise
                        fut.cancel()  # cancels a coroutine; a running thread just finishes
                        fut.add_done_callback(_retrieve)
                        on_abandon(fut)
                        logger.warning(
                            "%s.%s passed its deadline of %ss", type(env).__name__, method, timeout
                        )
                        raise FrameError(
                            ErrorCode.TIMEOUT,
                            f"{method} did not finish within its deadline of {timeout}s; the episode "
                            "is over, reset to start a new one",
                            timeout_s=timeout,
                        ) from None
            if inspect.isawaitable(result):  # a sync method that returned an awaitable
                result = await result
            return result
        except FrameError:
            raise
        except Exception as exc:
            raise _execution_error(env, method, exc) from None

    # ------------------------------------------------------------ sessions

    async def open(self, connection: Connection) -> Session:
        """A new session with a fresh env for `connection`; FrameError when refused."""
        if self._closing:
            raise FrameError(ErrorCode.SHUTTING_DOWN, "Server is shutting down")
        n, cap = len(self._sessions), self.config.max_concurrent_envs
        if n >= cap:
            raise FrameError(
                ErrorCode.CAPACITY_REACHED,
                f"Server at capacity: {n}/{cap} sessions active. Cannot accept new connections.",
                active_sessions=n,
                max_sessions=cap,
                retry_after_s=self.config.capacity_retry_after_s,
            )
        session = Session(self, connection)
        # The slot is taken before the factory runs, so concurrent opens cannot overshoot.
        self._sessions[session.id] = session
        try:
            session.env = await self.create_env()
        except BaseException:
            del self._sessions[session.id]
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
        """Re-attach `session` to a resuming connection; return the connection it replaces."""
        previous = session.connection
        session.connection = connection
        session.resumed = True
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

    def _expire(self, session: Session) -> None:
        session._expiry = None
        if session.connection is None:
            logger.debug("session %s: resume window passed", session.id)
            self.destroy(session)

    def destroy(self, session: Session) -> None:
        """Free the slot now; close the env in the background once its running call is done."""
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.id, None)
        self.metrics.sessions_closed += 1
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        env, session.env = session.env, None
        if env is not None:
            self._spawn(session.close_env_after_calls(env))
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
                self._spawn(_close_quietly(connection, 1001, "idle timeout"))

    async def close_all(self) -> None:
        """Server shutdown: refuse new sessions, destroy every session, wait for env closes."""
        self._closing = True
        for session in list(self._sessions.values()):
            connection = session.connection
            self.destroy(session)
            if connection is not None:
                self._spawn(_close_quietly(connection, 1001, "server shutting down"))
        if self._background:
            await asyncio.wait(set(self._background), timeout=_ENV_CLOSE_TIMEOUT_S)


def _execution_error(env: Any, method: str, exc: Exception) -> FrameError:
    logger.warning("%s.%s raised %s: %s", type(env).__name__, method, type(exc).__name__, exc)
    logger.debug("traceback of %s.%s", type(env).__name__, method, exc_info=exc)
    return FrameError(ErrorCode.EXECUTION_ERROR, str(exc) or type(exc).__name__)


async def _close_quietly(connection: Connection, code: int, reason: str) -> None:
    try:
        await connection.close(code=code, reason=reason)
    except Exception:  # the peer is already gone; nothing left to tell it
        pass


class Session:
    """One client session: an env instance, its episode phase, and its replay record."""

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
        self._replies: OrderedDict[str, str] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[str]] = {}
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def handle(self, request: Any) -> str:
        """Apply one decoded request (not ``close``) and return its encoded reply."""
        self.last_active = time.monotonic()
        rid = request.id
        if rid is None:
            async with self._lock:
                return await self._apply(request, None)
        cached = self._replies.get(rid)
        if cached is not None:
            return cached
        fut = self._inflight.get(rid)
        if fut is None:
            fut = asyncio.ensure_future(self._apply_recorded(request))
            self._inflight[rid] = fut
        # shield: the call belongs to the session; a dropped connection must not cancel it.
        return await asyncio.shield(fut)

    async def _apply_recorded(self, request: Any) -> str:
        try:
            async with self._lock:
                reply = await self._apply(request, request.id)
            self._replies[request.id] = reply
            if len(self._replies) > self.table.config.replay_window:
                self._replies.popitem(last=False)
            return reply
        finally:
            del self._inflight[request.id]

    async def _apply(self, request: Any, rid: str | None) -> str:
        try:
            kind = request.type
            if kind == "step":
                return await self._step(request.data, rid)
            if kind == "reset":
                return await self._reset(request.data, rid)
            if kind == "state":
                return await self._state(rid)
            return self._session_info(rid)
        except FrameError as exc:
            self.table.metrics.errors[exc.code.value] += 1
            return encode(exc.to_reply(rid))

    def _not_reset(self) -> FrameError:
        if self.phase is Phase.TIMED_OUT:
            return FrameError(
                ErrorCode.NOT_RESET, "the previous call timed out; reset to start a new episode"
            )
        return FrameError(ErrorCode.NOT_RESET, "No episode is running: send reset first")

    def _abandon(self, fut: asyncio.Future[Any]) -> None:
        env, self.env = self.env, None
        self.phase = Phase.TIMED_OUT
        if env is not None:
            self.table.close_env_soon(env, after=fut)

    async def _step(self, data: dict[str, Any], rid: str | None) -> str:
        env = self.env
        if env is None or self.phase is Phase.FRESH:
            raise self._not_reset()
        if self.phase is Phase.DONE:
            raise FrameError(
                ErrorCode.EPISODE_DONE, "The episode is over (done=true): send reset to start a new one"
            )
        table = self.table
        try:
            action = table.spec.action_type.model_validate(data)
        except ValidationError as exc:
            errors = validation_errors(exc)
            raise FrameError(
                ErrorCode.VALIDATION_ERROR, validation_message("Invalid action", errors), errors=errors
            ) from None
        started = time.perf_counter()
        obs = await table.call(
            env, "step", (action,), {}, table.deadline(env, "step_timeout_s"), self._abandon
        )
        table.metrics.observe_step(time.perf_counter() - started)
        body, reward, done, metadata = observation_parts(obs)
        self.phase = Phase.DONE if done else Phase.RUNNING
        return encode_observation(body, reward, done, metadata=metadata, request_id=rid)

    async def _reset(self, data: dict[str, Any], rid: str | None) -> str:
        table = self.table
        if self.env is None:
            self.env = await table.create_env()
        env = self.env
        kwargs = table.reset_kwargs(env, data)
        obs = await table.call(
            env, "reset", (), kwargs, table.deadline(env, "reset_timeout_s"), self._abandon
        )
        table.metrics.resets += 1
        body, reward, done, metadata = observation_parts(obs)
        self.phase = Phase.DONE if done else Phase.RUNNING
        return encode_observation(body, reward, done, metadata=metadata, request_id=rid)

    async def _read_state(self) -> dict[str, Any]:
        try:
            state = self.env.state
            if inspect.isawaitable(state):
                state = await state
        except Exception as exc:
            logger.warning("%s.state raised %s: %s", type(self.env).__name__, type(exc).__name__, exc)
            raise FrameError(ErrorCode.EXECUTION_ERROR, str(exc) or type(exc).__name__) from None
        return state.model_dump() if isinstance(state, BaseModel) else dict(state)

    async def _state(self, rid: str | None) -> str:
        # Unlike step, state before the first reset is allowed (OpenEnv answers it).
        if self.env is None:
            raise self._not_reset()
        return encode(state_reply(await self._read_state(), request_id=rid))

    def _session_info(self, rid: str | None) -> str:
        self.resumable = True
        episode_id, step_count = None, 0
        if self.env is not None:
            try:
                state = self.env.state
                episode_id = getattr(state, "episode_id", None)
                step_count = int(getattr(state, "step_count", 0) or 0)
            except Exception:  # a state that cannot be read now is reported as unknown
                pass
        info = SessionInfo(
            session_id=self.id,
            resume_token=self.resume_token,
            resumed=self.resumed,
            resume_window_s=self.table.config.resume_window_s,
            max_frame_bytes=self.table.config.max_frame_bytes,
            episode_id=episode_id,
            step_count=step_count,
            done=self.phase is Phase.DONE,
        )
        return encode(session_reply(info, request_id=rid))

    async def close_env_after_calls(self, env: Any) -> None:
        """Close `env` once no request of this session is running on it."""
        async with self._lock:
            pass
        await self.table._close_env(env, None)


def error_frame(code: ErrorCode, message: str, **details: Any) -> str:
    """An encoded error frame (for replies sent outside a session)."""
    return encode(error_reply(code, message, **details))
