"""TextArena Sudoku behind an envsdk server, wire-compatible with OpenEnv's TextArena server.

``create_sudoku_app(env_id)`` builds the app; ``python -m servers.sudoku`` (or
``start_sudoku_server.py``) serves it. See README.md for the observation forms.
"""

from servers.sudoku.app import create_sudoku_app
from servers.sudoku.environment import (
    SUDOKU_ENV_IDS,
    BoardPool,
    SudokuEnvironment,
    SudokuOptionError,
    check_env_id,
)
from servers.sudoku.models import LastMove, SudokuAction, SudokuObservation, SudokuState

__all__ = [
    "create_sudoku_app",
    "SUDOKU_ENV_IDS",
    "BoardPool",
    "SudokuEnvironment",
    "SudokuOptionError",
    "check_env_id",
    "LastMove",
    "SudokuAction",
    "SudokuObservation",
    "SudokuState",
]
