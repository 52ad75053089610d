"""`ServerConfig`: every knob of an envsdk server, in one value object."""

from __future__ import annotations

import argparse
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["ServerConfig", "DEFAULT_MAX_FRAME_BYTES"]

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024


def _default_max_concurrent_envs() -> int:
    raw = os.environ.get("MAX_CONCURRENT_ENVS")
    if raw is None or raw.strip() == "":
        return 64
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"MAX_CONCURRENT_ENVS must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"MAX_CONCURRENT_ENVS must be a positive integer, got {raw!r}")
    return value


def _default_web() -> bool:
    raw = os.environ.get("ENVSDK_WEB", "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"ENVSDK_WEB must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")


def _default_token() -> SecretStr | None:
    raw = os.environ.get("ENVSDK_TOKEN", "")
    return SecretStr(raw) if raw else None


def _default_executor_workers() -> int:
    return min(32, (os.cpu_count() or 1) + 4)


class ServerConfig(BaseModel):
    """How a server built by `create_app` behaves. Immutable; build a new one to change it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent_envs: int = Field(
        default_factory=_default_max_concurrent_envs,
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
        description="Deadline of one step; None = the environment class's `step_timeout_s`.",
    )
    reset_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one reset; None = the environment class's `reset_timeout_s`.",
    )
    max_frame_bytes: int = Field(
        default=DEFAULT_MAX_FRAME_BYTES,
        ge=64,
        description="Largest request frame answered normally; larger ones get FRAME_TOO_LARGE.",
    )
    executor_workers: int = Field(
        default_factory=_default_executor_workers,
        ge=1,
        description="Threads of the one shared pool that runs synchronous env methods.",
    )
    process_workers: int = Field(
        default=0,
        ge=0,
        description="Processes of the pool behind `run_in_process`; 0 = no process pool "
        "(run_in_process then uses the thread pool).",
    )
    inline_sync: bool | None = Field(
        default=None,
        description="Run synchronous env methods (factory, reset, step, close) directly on the "
        "event loop instead of the thread pool, saving a thread hop (tens of µs) per call. Only "
        "for envs whose calls return in microseconds: while one runs, every session waits. A "
        "call under a deadline still runs in the thread pool, where the deadline can be kept. "
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
    capacity_retry_after_s: float = Field(
        default=1.0, ge=0, description="`retry_after_s` hint sent with CAPACITY_REACHED."
    )
    token: SecretStr | None = Field(
        default_factory=_default_token,
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
        "in flight may take to finish before every session is closed.",
    )
    web: bool = Field(
        default_factory=_default_web,
        description="Serve the web page at /web (see `envsdk.web`). Default: on, unless the "
        "ENVSDK_WEB environment variable is 0/false/no/off.",
    )


def _document_fields(model: type[BaseModel]) -> None:
    # `help(ServerConfig)` shows the docstring, not pydantic's field descriptions: list them there.
    lines = [f"    {name}: {info.description}" for name, info in model.model_fields.items() if info.description]
    model.__doc__ = f"{model.__doc__}\n\nFields:\n\n" + "\n".join(lines)


_document_fields(ServerConfig)


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
