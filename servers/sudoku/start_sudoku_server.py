"""Serve TextArena Sudoku over OpenEnv's protocol: ``python -m servers.sudoku --help``.

Every flag has an environment variable of the same meaning (the flag wins).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

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
from servers.sudoku.environment import SUDOKU_ENV_IDS, SudokuOptionError, check_env_id
from servers.textarena.pool import worker_count

__all__ = ["build_parser", "main"]


def _env_id(text: str) -> str:
    try:
        return check_env_id(text)
    except SudokuOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults come from the environment variables named in each help."""
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m servers.sudoku",
        description="TextArena Sudoku environment server (OpenEnv-compatible WebSocket /ws).",
    )
    parser.add_argument(
        "--env-id",
        type=_env_id,
        default=env.get("TEXTARENA_ENV_ID", "Sudoku-v0"),
        help="env var TEXTARENA_ENV_ID (default Sudoku-v0). The TextArena Sudoku variant served "
        "unless a reset asks for another; one of: " + ", ".join(SUDOKU_ENV_IDS),
    )
    parser.add_argument(
        "--max-concurrent-envs",
        type=positive_int,
        default=env.get("MAX_CONCURRENT_ENVS", "64"),
        help="env var MAX_CONCURRENT_ENVS (default 64). Most sessions at once; must be >= "
        "num_generations x prompts rolled out concurrently, or trainers get CAPACITY_REACHED.",
    )
    parser.add_argument(
        "--board-workers",
        type=worker_count,
        default=env.get("SUDOKU_BOARD_WORKERS") or None,
        help="env var SUDOKU_BOARD_WORKERS (default min(4, CPUs), at most 64). Processes generating boards.",
    )
    parser.add_argument(
        "--host",
        default=env.get("HOST", "127.0.0.1"),
        help="env var HOST (default 127.0.0.1; use 0.0.0.0 to listen on every interface).",
    )
    parser.add_argument(
        "--port", type=port_number, default=env.get("PORT", "8000"),
        help="env var PORT (default 8000).",
    )
    add_log_level_argument(parser, "uvicorn's log level")
    add_access_arguments(parser)
    add_replica_arguments(parser, ports="ports --port .. --port+N-1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, then serve until interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replicas > 1 or args.replicas_file:
        return _serve_replicas(args, list(argv) if argv is not None else sys.argv[1:])
    options: dict[str, Any] = {"max_concurrent_envs": args.max_concurrent_envs, **access_options(args)}
    # The server options ENVSDK_* variables set, checked before any board worker starts.
    refused = config_error(**options)
    if refused is not None:
        parser.error(refused)
    # Imported late so that --help and a bad env id answer without loading the server.
    from servers.sudoku.app import create_sudoku_app
    from servers.sudoku.environment import BoardPool

    # A SIGTERM from here on stops the board workers too (`finally`), once they have started.
    sigterm = SigtermDuringStartUp.install()
    pool = BoardPool(workers=args.board_workers)
    try:
        app = create_sudoku_app(args.env_id, board_pool=pool, **options)
        return sigterm.serve(app, args)
    finally:
        pool.shutdown()


def _serve_replicas(args: argparse.Namespace, argv: list[str]) -> int:
    from envsdk.server.replicas import serve_replicas, without_options

    # Every other flag goes to the replicas unchanged; each gets its own port.
    forwarded = without_options(argv)

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "servers.sudoku", *forwarded, "--host", args.host, "--port", str(port)]

    return serve_replicas(
        command, args.replicas, host=args.host, first_port=args.port, replicas_file=args.replicas_file
    )


if __name__ == "__main__":
    sys.exit(main())
