"""`ServerConfig`: every knob of an envsdk server, in one value object."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from envsdk.protocol import validation_errors, validation_message

__all__ = [
    "ServerConfig", "DEFAULT_MAX_FRAME_BYTES", "DEFAULT_DEADLINES_S", "ServerEnvironmentError", "ENVIRONMENT_VARIABLES",
    "positive_int", "port_number", "LOG_LEVELS", "add_log_level_argument", "config_error",
]

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

DEFAULT_DEADLINES_S: dict[str, float] = {
    "factory": 60.0,
    "reset": 60.0,
    "step": 60.0,
    "state": 10.0,
    "close": 5.0,
}
"""Deadline of each env call when neither the config nor the env class sets one. 60 s for
building, resetting and stepping is OpenEnv's client message timeout (a reply later than that
reaches nobody); `state` is a read and `close` a release, so theirs are short."""


DEFAULT_LANE_IDLE_S = 5.0
"""Idle seconds after which a session's lane thread exits (`ServerConfig.lane_idle_s`)."""


class ServerEnvironmentError(ValueError):
    """An environment variable that sets a server option holds a value it cannot take."""


class _FromEnv:
    """A field's default factory: ``read(variable, *args)``, the value environment variable
    `variable` sets, or the default when it is unset. The variable is named here alone: the
    reader's refusals and `ENVIRONMENT_VARIABLES` take it from `variable`."""

    def __init__(self, variable: str, read: Callable[..., Any], *args: Any) -> None:
        self.variable = variable
        self._read = read
        self._args = args

    def __call__(self) -> Any:
        return self._read(self.variable, *self._args)


def _env_count(name: str, default: int) -> int:
    """The positive integer in environment variable `name`, else `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ServerEnvironmentError(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ServerEnvironmentError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _env_switch(name: str) -> bool:
    """Environment variable `name` as a switch that is on unless set off."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ServerEnvironmentError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")


def _env_secret(name: str) -> SecretStr | None:
    raw = os.environ.get(name, "")
    return SecretStr(raw) if raw else None


def _env_mode(name: str) -> Literal["simulation", "production"]:
    raw = os.environ.get(name, "").strip().lower() or "simulation"
    if raw not in ("simulation", "production"):
        raise ServerEnvironmentError(f"{name} must be 'simulation' or 'production', got {raw!r}")
    return "production" if raw == "production" else "simulation"


def _env_number(name: str, default: float | None, kind: type[float] | type[int] = float) -> float | None:
    """The number in environment variable `name`, else `default`; "none" or "off" means None."""
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("none", "off"):
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ServerEnvironmentError(f"{name} must be a number (or 'none'), got {raw!r}") from None


def _env_bound(name: str, default: float, kind: type[float | int] = float) -> float:
    """`_env_number` for an option that cannot be None: "none" reads as 0, which the field's
    bound then refuses (or takes, where 0 is allowed)."""
    return kind(_env_number(name, default, kind) or 0)


def _env_hosts(name: str) -> tuple[str, ...] | None:
    raw = os.environ.get(name, "").strip()
    return tuple(h.strip() for h in raw.split(",") if h.strip()) if raw else None


class ServerConfig(BaseModel):
    """How a server built by `create_app` behaves. Immutable; build a new one to change it."""

    # Defaults read from environment variables are checked against the same bounds as given values.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    max_concurrent_envs: int = Field(
        default_factory=_FromEnv("MAX_CONCURRENT_ENVS", _env_count, 64),
        ge=1,
        description="Most sessions (env instances) alive at once, connected or awaiting resume. "
        "Default: the MAX_CONCURRENT_ENVS environment variable, else 64.",
    )
    resume_window_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a session that did the `session` handshake outlives its socket.",
    )
    step_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one step; None = the environment class's `step_timeout_s`, "
        "else 60 s. Every env call has a deadline (see `DEFAULT_DEADLINES_S`).",
    )
    reset_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one reset; None = the environment class's `reset_timeout_s`, else 60 s.",
    )
    factory_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of building one env instance (the factory call); None = the "
        "factory's `factory_timeout_s` attribute, else 60 s.",
    )
    state_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one read of `env.state`; None = the environment class's "
        "`state_timeout_s`, else 10 s.",
    )
    close_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one `env.close()`; None = the environment class's "
        "`close_timeout_s`, else 5 s. Shutdown waits this long at most for env closes.",
    )
    max_abandoned_threads: int = Field(
        default=64,
        ge=1,
        description="Most lane threads written off by a deadline that may still be running their "
        "call; past it, a call that needs a new lane (a new session, or a reset after a "
        "TIMEOUT) gets CAPACITY_REACHED until one returns.",
    )
    lane_wait_s: float = Field(
        default_factory=_FromEnv("ENVSDK_LANE_WAIT_S", _env_bound, 0.001),
        ge=0,
        le=0.1,
        description="How long the event loop waits, GIL released, for a synchronous env call it "
        "handed to the session's lane thread before it goes on serving others (the call then "
        "completes under its deadline as usual). Only calls of a kind (env class and method) "
        "whose recent calls ran under a tenth of this are waited for: waiting saves the cost "
        "of waking the loop up again, which dominates for calls of microseconds. 0: never wait. "
        "Default: ENVSDK_LANE_WAIT_S, else 0.001.",
    )
    lane_idle_s: float | None = Field(
        default_factory=_FromEnv("ENVSDK_LANE_IDLE_S", _env_number, DEFAULT_LANE_IDLE_S),
        gt=0,
        description="How long a session's lane thread stays with no call to run before it exits "
        "(after this to twice this); the session's next sync call starts a new one, in order "
        "behind nothing. An idle session then holds no thread. An env class with "
        "`THREAD_BOUND = True` (its instances hold thread-bound resources) keeps one thread per "
        "session for the session's whole life; `REQUIRES_SINGLE_THREAD_EXECUTOR` envs share one "
        "that never exits. None: every lane keeps its thread. Default: ENVSDK_LANE_IDLE_S, else "
        f"{DEFAULT_LANE_IDLE_S:g}.",
    )
    loop_stall_s: float | None = Field(
        default=0.1,
        gt=0,
        description="An `async def` env method (or tool) that holds the event loop longer than this "
        "between two awaits blocks every session: each such stretch is counted in /metrics "
        "(`envsdk_loop_stalls_total`, by env class and method) and logged (the first one, then at "
        "most one line a minute per method). None: not measured.",
    )
    max_frame_bytes: int = Field(
        default=DEFAULT_MAX_FRAME_BYTES,
        ge=64,
        description="Largest request frame answered normally; larger ones get FRAME_TOO_LARGE.",
    )
    process_workers: int = Field(
        default=0,
        ge=0,
        description="Processes of the pool behind `run_in_process`; 0 = no process pool "
        "(run_in_process then uses a one-off thread).",
    )
    inline_sync: bool | None = Field(
        default=None,
        description="Run synchronous env methods (factory, reset, step, state, close) directly on "
        "the event loop instead of the session's lane thread, saving a thread hop per call. Only "
        "for envs whose calls return in microseconds: while one runs, every session waits, and "
        "the built-in default deadlines do not apply. A call whose deadline is set explicitly "
        "(config or env class) still runs on the lane, where the deadline can be kept. "
        "None: the env class's `INLINE_SYNC` attribute (default False).",
    )
    idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Close a session that received no request for this long, even with a live "
        "socket. None (default): a session with a live socket is never reaped.",
    )
    unknown_reset_kwargs: Literal["error", "drop"] = Field(
        default="error",
        description="Reset keys the env's `reset` does not accept: 'error' answers "
        "VALIDATION_ERROR, 'drop' ignores them as OpenEnv does.",
    )
    env_name: str | None = Field(
        default=None, description="Name reported by /metadata; default: the env class name."
    )
    replay_window: int = Field(
        default=16,
        ge=1,
        description="How many answered request ids each session remembers for replay.",
    )
    replay_window_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=0,
        description="How many bytes of encoded replies each session remembers for replay; the "
        "oldest are forgotten first. The latest reply is always kept, whatever its size, so "
        "that a retry of the request in flight is never applied twice.",
    )
    capacity_retry_after_s: float = Field(
        default=1.0, ge=0, description="`retry_after_s` hint sent with CAPACITY_REACHED."
    )
    token: SecretStr | None = Field(
        default_factory=_FromEnv("ENVSDK_TOKEN", _env_secret),
        description="Bearer token every route but /health requires (`Authorization: Bearer "
        "<token>` or `?token=<token>`). Default: the ENVSDK_TOKEN environment variable, else "
        "None (no authentication). See `envsdk.server.auth`.",
    )
    allowed_origins: tuple[str, ...] = Field(
        default=(),
        description="Browser origins (`scheme://host[:port]`) allowed to connect; '*' allows "
        "any. Requests without an Origin header (non-browser clients) and same-origin requests "
        "are always allowed.",
    )
    drain_timeout_s: float = Field(
        default=20.0,
        ge=0,
        description="Graceful shutdown (SIGTERM under `envsdk.server.serve`): how long requests "
        "in flight may take to finish before every session is closed. The process then waits at "
        "most the close deadline for envs to close, so it exits within drain_timeout_s + "
        "close_timeout_s whatever env code is doing.",
    )
    mode: Literal["simulation", "production"] = Field(
        default_factory=_FromEnv("OPENENV_MODE", _env_mode),
        description="OpenEnv's server mode: 'production' drops the HTTP /reset, /step and /state "
        "routes (episodes run over /ws, tools over /mcp). Default: OPENENV_MODE, else 'simulation'.",
    )
    web: bool = Field(
        default_factory=_FromEnv("ENVSDK_WEB", _env_switch),
        description="Serve the web page at /web (see `envsdk.web`). Default: on, unless the "
        "ENVSDK_WEB environment variable is 0/false/no/off.",
    )
    # Hardening for untrusted networks: what one client may cost (see README, "Security").
    allowed_hosts: tuple[str, ...] | None = Field(
        default_factory=_FromEnv("ENVSDK_ALLOWED_HOSTS", _env_hosts),
        description="Host header values served (names, optionally with '*.' wildcard prefix; "
        "'*' = any). None (default): a connection that arrives on a loopback address must name "
        "localhost, 127.0.0.1 or ::1 (DNS rebinding), any other is served. Default: the "
        "comma-separated ENVSDK_ALLOWED_HOSTS environment variable, else None.",
    )
    max_body_bytes: int = Field(
        default_factory=_FromEnv("ENVSDK_MAX_BODY_BYTES", _env_bound, 1024 * 1024, int),
        ge=64,
        description="Largest HTTP request body (POST /reset, /step …); larger ones get 413 "
        "before they are read. Default: ENVSDK_MAX_BODY_BYTES, else 1 MiB.",
    )
    handshake_timeout_s: float = Field(
        default_factory=_FromEnv("ENVSDK_HANDSHAKE_TIMEOUT_S", _env_bound, 10.0),
        gt=0,
        description="A connection whose HTTP request head (a WebSocket upgrade included) is not "
        "complete this long after it opened is closed (slowloris). Applied by "
        "`envsdk.server.serve`. Default: ENVSDK_HANDSHAKE_TIMEOUT_S, else 10.",
    )
    first_frame_timeout_s: float | None = Field(
        default_factory=_FromEnv("ENVSDK_FIRST_FRAME_TIMEOUT_S", _env_number, 10.0),
        gt=0,
        description="A WebSocket that sends no frame this long after it is accepted is closed "
        "(1008) and its slot freed. None: wait forever. Default: ENVSDK_FIRST_FRAME_TIMEOUT_S, "
        "else 10.",
    )
    ws_ping_interval_s: float | None = Field(
        default_factory=_FromEnv("ENVSDK_WS_PING_INTERVAL_S", _env_number, 20.0),
        gt=0,
        description="Keepalive ping period of every WebSocket (uvicorn's ws_ping_interval). "
        "Default: ENVSDK_WS_PING_INTERVAL_S, else 20.",
    )
    ws_ping_timeout_s: float = Field(
        default_factory=_FromEnv("ENVSDK_WS_PING_TIMEOUT_S", _env_bound, 20.0),
        gt=0,
        description="A peer that leaves a keepalive ping unanswered, or reads nothing while "
        "replies for it pile up past 64 KiB, for this long is disconnected at once (its send "
        "buffer dropped) and its slot freed. Default: ENVSDK_WS_PING_TIMEOUT_S, else 20.",
    )


def _document_fields(model: type[BaseModel]) -> None:
    # `help(ServerConfig)` shows the docstring, not pydantic's field descriptions: list them there.
    lines = [f"    {name}: {info.description}" for name, info in model.model_fields.items() if info.description]
    model.__doc__ = f"{model.__doc__}\n\nFields:\n\n" + "\n".join(lines)


_document_fields(ServerConfig)

#: The options a `ServerConfig` reads from an environment variable when not given, by field.
ENVIRONMENT_VARIABLES = {
    name: info.default_factory.variable
    for name, info in ServerConfig.model_fields.items()
    if isinstance(info.default_factory, _FromEnv)
}


def config_error(**options: Any) -> str | None:
    """None if ``ServerConfig(**options)`` can be built, else one line saying why: the
    environment variable that holds a value its option cannot take (``ENVSDK_WEB='maybe'``,
    ``ENVSDK_LANE_WAIT_S=-1``), or the option given. A server's command checks this before it
    starts anything, so that a bad value is a usage error rather than a traceback from deep in
    `create_app`."""
    try:
        ServerConfig(**options)
    except ServerEnvironmentError as exc:
        return str(exc)
    except ValidationError as exc:
        errors = validation_errors(exc)
        for error in errors:
            field = str(error["loc"][0]) if error.get("loc") else "option"
            variable = ENVIRONMENT_VARIABLES.get(field) if field not in options else None
            raw = os.environ.get(variable) if variable else None
            error["loc"] = [f"{variable}={raw!r}" if variable and raw is not None else f"{field}={error.get('input')!r}"]
        return validation_message("invalid server option", errors)
    return None


def _int_from(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_from(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_from(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (seconds, say)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    """argparse type of a server's ``--port``: a TCP port, 0 to 65535 (0: one the OS picks)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


#: The log levels a server takes (uvicorn's; envsdk's own loggers follow them).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_LOG_LEVEL_VARIABLE = "LOG_LEVEL"


class _SetByVariable(str):
    """The value of ``$LOG_LEVEL`` as ``--log-level``'s default: a refusal names the variable."""


#: Names Python's logging takes for a level too (a shell's ``LOG_LEVEL=WARN`` is common).
_LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}


def log_level_name(text: str) -> str:
    """`text` as one of `LOG_LEVELS` (uvicorn's names; logging's ``warn``/``fatal`` too), in
    any case. Raises ValueError naming the levels."""
    level = text.strip().lower() if isinstance(text, str) else text
    level = _LOG_LEVEL_ALIASES.get(level, level)
    if level in LOG_LEVELS:
        return str(level)
    raise ValueError(f"{str(text)!r} is not a log level: use one of {', '.join(LOG_LEVELS)}")


def _log_level(text: str) -> str:
    """argparse type of ``--log-level``: `log_level_name`, its error naming ``$LOG_LEVEL`` when
    the value came from there."""
    try:
        return log_level_name(text)
    except ValueError as exc:
        given = f"{_LOG_LEVEL_VARIABLE}={str(text)!r}" if isinstance(text, _SetByVariable) else repr(text)
        raise argparse.ArgumentTypeError(f"{given} is not a log level: use one of {', '.join(LOG_LEVELS)}") from exc


def add_log_level_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--log-level`` (`LOG_LEVELS`, default ``$LOG_LEVEL``, else info) to a server's command
    line; `what` says what it sets. An unknown level, given or in ``$LOG_LEVEL``, is a usage
    error (exit 2) naming where it came from, not taken for info."""
    parser.add_argument(
        "--log-level", type=_log_level, default=_SetByVariable(os.environ.get(_LOG_LEVEL_VARIABLE) or "info"),
        metavar="LEVEL",
        help=f"{what}: one of {', '.join(LOG_LEVELS)} (default: $LOG_LEVEL, else info)",
    )


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-web`` and ``--token`` to a server's command line (`access_options` reads
    them back as `ServerConfig` fields)."""
    parser.add_argument(
        "--no-web", action="store_true", help="do not serve the web page at /web (same as ENVSDK_WEB=0)"
    )
    parser.add_argument(
        "--token", default=None,
        help="require this bearer token on every route but /health (default: $ENVSDK_TOKEN; "
        "prefer the variable: a command line is visible to other users in `ps`)",
    )


def access_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `ServerConfig` fields that `add_access_arguments`' flags set (none when absent)."""
    options: dict[str, Any] = {}
    if args.no_web:
        options["web"] = False
    if args.token:
        options["token"] = args.token
    return options
