"""`create_sudoku_app`: the TextArena Sudoku server as a FastAPI app, for embedding or serving."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from envsdk.server import create_app
from servers.sudoku.environment import (
    BoardPool,
    SudokuEnvironment,
    check_env_id,
    default_board_pool,
)
from servers.sudoku.models import SudokuAction, SudokuObservation, SudokuState
from servers.textarena.environment import GAME_LANE_WAIT_S

__all__ = ["BoardPool", "create_sudoku_app"]


def create_sudoku_app(
    env_id: str = "Sudoku-v0", *, board_pool: BoardPool | None = None, **server_options: Any
) -> FastAPI:
    """An envsdk app serving TextArena Sudoku variant `env_id` on ``/ws`` (and HTTP).

    `server_options` are `envsdk.server.ServerConfig` fields (``max_concurrent_envs=64``, …).
    Boards come from `board_pool` (default: the process-wide pool), whose worker processes are
    started here so the first resets do not wait for them. Raises `SudokuOptionError` for an
    `env_id` that is not a Sudoku variant. Boards are generated in ``spawn``ed processes: a
    script that builds this app must keep its top level under ``if __name__ == "__main__":``.
    """
    check_env_id(env_id)
    pool = board_pool or default_board_pool()
    pool.warm()

    def make_env() -> SudokuEnvironment:
        return SudokuEnvironment(env_id, board_pool=pool)

    server_options.setdefault("env_name", "SudokuEnvironment")
    if "ENVSDK_LANE_WAIT_S" not in os.environ:  # see GAME_LANE_WAIT_S
        server_options.setdefault("lane_wait_s", GAME_LANE_WAIT_S)
    return create_app(
        make_env, SudokuAction, SudokuObservation, state_type=SudokuState, **server_options
    )
