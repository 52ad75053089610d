"""`create_textarena_app`: any TextArena game as a FastAPI app, for embedding or serving."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI

from envsdk.server import create_app
from servers.textarena.environment import (
    DEFAULT_ENV_ID,
    GAME_LANE_WAIT_S,
    MAX_PLAYERS,
    TextArenaEnvironment,
    check_env_id,
    check_int,
)
from servers.textarena.errors import TextArenaOptionError
from servers.textarena.models import (
    TextArenaAction,
    TextArenaObservation,
    TextArenaState,
)
from servers.textarena.nltk_data import game_unavailable
from servers.textarena.pool import DEFAULT_TASK_TIMEOUT_S, GamePool

__all__ = ["create_textarena_app", "env_kwargs_from_environ", "parse_kwarg"]

KWARG_PREFIX = "TEXTARENA_KW_"


def parse_kwarg(text: str) -> Any:
    """A ``TEXTARENA_KW_*`` value: ``true``/``false`` (any case), an int, a float, else the
    string itself (OpenEnv passes every value as a string, which makes ``false`` true)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def env_kwargs_from_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Game kwargs from ``TEXTARENA_KW_<NAME>=value`` variables (name lower-cased, as OpenEnv
    reads them)."""
    env = os.environ if environ is None else environ
    return {
        key[len(KWARG_PREFIX):].lower(): parse_kwarg(value)
        for key, value in env.items()
        if key.startswith(KWARG_PREFIX)
    }


def create_textarena_app(
    env_id: str = DEFAULT_ENV_ID,
    *,
    num_players: int = 1,
    max_turns: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    game_pool: GamePool | None = None,
    game_workers: int | None = None,
    max_move_chars: int | None = None,
    generation_timeout_s: float = DEFAULT_TASK_TIMEOUT_S,
    max_queued_generations: int | None = None,
    **server_options: Any,
) -> FastAPI:
    """An envsdk app serving TextArena game `env_id` on ``/ws`` (and HTTP).

    `num_players`, `max_turns` and `env_kwargs` mean what OpenEnv's ``TEXTARENA_NUM_PLAYERS``,
    ``TEXTARENA_MAX_TURNS`` and ``TEXTARENA_KW_*`` mean; `server_options` are
    `envsdk.server.ServerConfig` fields (``max_concurrent_envs=64``, ...). The game is built
    once here: an unknown id, kwargs the game refuses or NLTK data that is not installed raise
    `TextArenaOptionError` with one line saying why, before anything is served (so does a game
    whose module or constructor fails here: a package, a data file or an API key it needs).
    `max_move_chars` caps every game's moves (default: each game's own cap). Seeded resets
    run in `game_pool`, whose worker processes are started here; without one the app makes its
    own (`game_workers` processes, default min(4, CPUs); `generation_timeout_s` per game,
    `max_queued_generations` waiting, default 64 per worker) and stops it when the app shuts
    down.
    The workers are ``spawn``ed, so a script that builds this app must keep its top level under
    ``if __name__ == "__main__":``.
    """
    check_env_id(env_id)
    check_int("num_players", num_players, minimum=1, maximum=MAX_PLAYERS)
    if max_move_chars is not None:
        check_int("max_move_chars", max_move_chars, minimum=1)
    if max_turns is not None:
        check_int("max_turns", max_turns, minimum=1)
    kwargs = dict(env_kwargs or {})
    try:
        reason = game_unavailable(env_id, **kwargs)
    except TypeError as exc:  # a kwarg the game's constructor does not take
        raise TextArenaOptionError(f"{env_id} refused its kwargs {kwargs}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the game's own code fails here: a package, a data file, an API key
        why = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever the game raised
        raise TextArenaOptionError(f"{env_id} is unavailable here: {why[:512]}") from None
    if reason is not None:
        raise TextArenaOptionError(reason)
    pool = game_pool or GamePool(
        workers=game_workers, task_timeout_s=generation_timeout_s, max_queued=max_queued_generations
    )
    pool.warm()

    def make_env() -> TextArenaEnvironment:
        return TextArenaEnvironment(
            env_id, num_players=num_players, max_turns=max_turns, env_kwargs=kwargs, game_pool=pool,
            max_move_chars=max_move_chars,
        )

    server_options.setdefault("env_name", "TextArenaEnvironment")
    if "ENVSDK_LANE_WAIT_S" not in os.environ:
        server_options.setdefault("lane_wait_s", GAME_LANE_WAIT_S)
    app = create_app(
        make_env, TextArenaAction, TextArenaObservation, state_type=TextArenaState, **server_options
    )
    if game_pool is None:
        _stop_with_app(app, pool)
    return app


def _stop_with_app(app: FastAPI, pool: GamePool) -> None:
    """Shut `pool` down when `app`'s lifespan ends (uvicorn ends a SIGTERMed process by the
    signal itself, so ``atexit`` would not run and the workers would be orphaned)."""
    serve_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(owner: Any) -> AsyncIterator[Any]:
        try:
            async with serve_lifespan(owner) as state:
                yield state
        finally:
            pool.shutdown()

    app.router.lifespan_context = lifespan
