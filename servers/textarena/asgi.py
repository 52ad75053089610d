"""``uvicorn servers.textarena.asgi:app``: the app configured from the environment alone, as
OpenEnv's ``uvicorn textarena_env.server.app:app`` is (TEXTARENA_ENV_ID, TEXTARENA_NUM_PLAYERS,
TEXTARENA_MAX_TURNS, TEXTARENA_KW_*, MAX_CONCURRENT_ENVS, TEXTARENA_GAME_WORKERS,
TEXTARENA_MAX_MOVE_CHARS, TEXTARENA_GENERATION_TIMEOUT_S, TEXTARENA_MAX_QUEUED_GENERATIONS; defaults
as in `servers.textarena.start_textarena_server`)."""

from __future__ import annotations

import os

from servers.textarena.app import create_textarena_app, env_kwargs_from_environ
from servers.textarena.environment import DEFAULT_ENV_ID
from servers.textarena.pool import DEFAULT_TASK_TIMEOUT_S

__all__ = ["app"]

_max_turns = os.environ.get("TEXTARENA_MAX_TURNS")
_workers = os.environ.get("TEXTARENA_GAME_WORKERS")
_move_chars = os.environ.get("TEXTARENA_MAX_MOVE_CHARS")
_queued = os.environ.get("TEXTARENA_MAX_QUEUED_GENERATIONS")
app = create_textarena_app(
    os.environ.get("TEXTARENA_ENV_ID", DEFAULT_ENV_ID),
    num_players=int(os.environ.get("TEXTARENA_NUM_PLAYERS", "1")),
    max_turns=int(_max_turns) if _max_turns else None,
    env_kwargs=env_kwargs_from_environ(),
    game_workers=int(_workers) if _workers else None,
    max_move_chars=int(_move_chars) if _move_chars else None,
    generation_timeout_s=float(os.environ.get("TEXTARENA_GENERATION_TIMEOUT_S") or DEFAULT_TASK_TIMEOUT_S),
    max_queued_generations=int(_queued) if _queued else None,
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
)
