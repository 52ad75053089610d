"""Serve any TextArena game over OpenEnv's protocol: ``python -m servers.textarena --help``.

Configured like OpenEnv's TextArena server: every flag has an environment variable of the same
meaning (``TEXTARENA_ENV_ID``, ``TEXTARENA_NUM_PLAYERS``, ``TEXTARENA_MAX_TURNS``,
``MAX_CONCURRENT_ENVS``, ...; the flag wins), and each ``TEXTARENA_KW_<NAME>=value`` becomes the
game's keyword argument ``name``. ``uvicorn servers.textarena.asgi:app`` serves the same app
from the environment variables alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from envsdk.server.config import (
    access_options,
    add_access_arguments,
    add_log_level_argument,
    config_error,
    port_number,
    positive_int,
)
from envsdk.server.launch import SigtermDuringStartUp
from envsdk.server.replicas import add_replica_arguments
from servers.textarena.environment import DEFAULT_ENV_ID, check_env_id
from servers.textarena.errors import TextArenaOptionError
from servers.textarena.pool import worker_count

__all__ = ["build_parser", "main", "positive_float"]


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _env_id(text: str) -> str:
    try:
        return check_env_id(text)
    except TextArenaOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults come from the environment variables named in each help."""
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m servers.textarena",
        description="Any TextArena game as an environment server (OpenEnv-compatible WebSocket /ws).",
    )
    parser.add_argument(
        "--env-id", type=_env_id, default=env.get("TEXTARENA_ENV_ID", DEFAULT_ENV_ID),
        help=f"env var TEXTARENA_ENV_ID (default {DEFAULT_ENV_ID}, which runs offline; OpenEnv's "
        "default, Wordle-v0, needs NLTK data). The game served unless a reset asks for another.",
    )
    parser.add_argument(
        "--num-players", type=positive_int, default=env.get("TEXTARENA_NUM_PLAYERS", "1"),
        help="env var TEXTARENA_NUM_PLAYERS (default 1; 2 for two-player games).",
    )
    parser.add_argument(
        "--max-turns", type=positive_int, default=env.get("TEXTARENA_MAX_TURNS") or None,
        help="env var TEXTARENA_MAX_TURNS (default none). Reported in the state, as OpenEnv "
        "does; a game's own turn limit is its kwarg (TEXTARENA_KW_max_turns).",
    )
    parser.add_argument(
        "--max-concurrent-envs", type=positive_int, default=env.get("MAX_CONCURRENT_ENVS", "64"),
        help="env var MAX_CONCURRENT_ENVS (default 64). Most sessions at once.",
    )
    parser.add_argument(
        "--game-workers", type=worker_count, default=env.get("TEXTARENA_GAME_WORKERS") or None,
        help="env var TEXTARENA_GAME_WORKERS (default min(4, CPUs), at most 64). Processes generating games.",
    )
    parser.add_argument(
        "--max-move-chars", type=positive_int, default=env.get("TEXTARENA_MAX_MOVE_CHARS") or None,
        help="env var TEXTARENA_MAX_MOVE_CHARS (default: each game's own cap, 4096 characters, "
        "ConnectFour 512, LinesOfAction 1024, Bandit and ColonelBlotto 2048). Longer moves are refused with VALIDATION_ERROR.",
    )
    parser.add_argument(
        "--generation-timeout-s", type=positive_float, default=env.get("TEXTARENA_GENERATION_TIMEOUT_S", "30"),
        help="env var TEXTARENA_GENERATION_TIMEOUT_S (default 30). Seconds one game generation may "
        "take; its worker is then killed and replaced and the reset answered TIMEOUT.",
    )
    parser.add_argument(
        "--max-queued-generations", type=positive_int,
        default=env.get("TEXTARENA_MAX_QUEUED_GENERATIONS") or None,
        help="env var TEXTARENA_MAX_QUEUED_GENERATIONS (default 64 per game worker). Resets waiting "
        "for a worker past this are refused with CAPACITY_REACHED.",
    )
    parser.add_argument(
        "--host", default=env.get("HOST", "127.0.0.1"),
        help="env var HOST (default 127.0.0.1; use 0.0.0.0 to listen on every interface).",
    )
    parser.add_argument("--port", type=port_number, default=env.get("PORT", "8000"), help="env var PORT (default 8000).")
    add_log_level_argument(parser, "uvicorn's log level")
    add_access_arguments(parser)
    add_replica_arguments(parser, ports="ports --port .. --port+N-1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, then serve until interrupted. A game that cannot run here (NLTK
    data not installed, kwargs it refuses) exits with status 2 and one line saying why."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replicas > 1 or args.replicas_file:
        return _serve_replicas(args, list(argv) if argv is not None else sys.argv[1:])
    server_options = {"max_concurrent_envs": args.max_concurrent_envs, **access_options(args)}
    # The server options ENVSDK_* variables set, checked before any game worker starts.
    refused = config_error(**server_options)
    if refused is not None:
        parser.error(refused)
    # Imported late so that --help and a bad env id answer without loading the server.
    from servers.textarena.app import create_textarena_app, env_kwargs_from_environ
    from servers.textarena.pool import GamePool

    sigterm = SigtermDuringStartUp.install()
    pool = GamePool(
        workers=args.game_workers, task_timeout_s=args.generation_timeout_s, max_queued=args.max_queued_generations
    )
    try:
        try:
            app = create_textarena_app(
                args.env_id, num_players=args.num_players, max_turns=args.max_turns,
                env_kwargs=env_kwargs_from_environ(), game_pool=pool, max_move_chars=args.max_move_chars,
                **server_options,
            )
        except TextArenaOptionError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return sigterm.serve(app, args)
    finally:
        pool.shutdown()


def _serve_replicas(args: argparse.Namespace, argv: list[str]) -> int:
    from envsdk.server.replicas import serve_replicas, without_options

    forwarded = without_options(argv)

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "servers.textarena", *forwarded, "--host", args.host, "--port", str(port)]

    return serve_replicas(
        command, args.replicas, host=args.host, first_port=args.port, replicas_file=args.replicas_file
    )


if __name__ == "__main__":
    sys.exit(main())
