"""``uvicorn servers.textarena.asgi:app``: the app configured from the environment alone, as
OpenEnv's ``uvicorn textarena_env.server.app:app`` is (TEXTARENA_ENV_ID, TEXTARENA_NUM_PLAYERS,
TEXTARENA_MAX_TURNS, TEXTARENA_KW_*, MAX_CONCURRENT_ENVS, TEXTARENA_GAME_WORKERS; defaults as in
`servers.textarena.start_textarena_server`)."""

from __future__ import annotations

import os

from servers.textarena.app import create_textarena_app, env_kwargs_from_environ

__all__ = ["app"]

_max_turns = os.environ.get("TEXTARENA_MAX_TURNS")
_workers = os.environ.get("TEXTARENA_GAME_WORKERS")
app = create_textarena_app(
    os.environ.get("TEXTARENA_ENV_ID", "Wordle-v0"),
    num_players=int(os.environ.get("TEXTARENA_NUM_PLAYERS", "1")),
    max_turns=int(_max_turns) if _max_turns else None,
    env_kwargs=env_kwargs_from_environ(),
    game_workers=int(_workers) if _workers else None,
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
)
