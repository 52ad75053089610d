"""Wire models of the Sudoku server: the TextArena server's models plus structured Sudoku fields.

`SudokuAction` is OpenEnv's ``TextArenaAction`` (``{"message": str}``, extra fields forbidden,
``metadata`` allowed). `SudokuObservation` is a `TextArenaObservation` (every field of
OpenEnv's: ``prompt``, ``messages``, ``current_player_id``, ``legal_players``, ``info``) so
clients written for OpenEnv's TextArena server read it unchanged, and adds the board and the
verdict on the last move as data, so that no client has to parse text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from servers.textarena.models import (
    ObservationForm,
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)

__all__ = [
    "MAX_MOVE_CHARS",
    "ObservationForm",
    "MoveVerdict",
    "TextArenaMessage",
    "LastMove",
    "SudokuAction",
    "SudokuObservation",
    "SudokuState",
]

MoveVerdict = Literal["valid", "invalid", "bad_format"]


class LastMove(BaseModel):
    """The game's verdict on the last step; all None right after reset."""

    move: list[int] | None = Field(
        default=None, description="[row, column, digit] as read by the game (1-based), or None"
    )
    verdict: MoveVerdict | None = Field(
        default=None,
        description="valid: the digit was placed; invalid: refused by the rules; "
        "bad_format: no '[r c n]' found",
    )
    reason: str | None = Field(default=None, description="The game's reason for a refusal")


MAX_MOVE_CHARS = 8192
"""Longest move message the server takes: the cumulative observation repeats every message of
the episode, so an unbounded one would let a client inflate every later reply."""


class SudokuAction(TextArenaAction):
    """A model reply; the game reads the first ``[row column digit]`` in it (1-based)."""

    message: str = Field(max_length=MAX_MOVE_CHARS)


class SudokuObservation(TextArenaObservation):
    """What the agent sees after reset and after each step (see servers/sudoku/README.md)."""

    # Structured fields (envsdk): the same facts the text carries, as data.
    board: list[list[int]] = Field(
        default_factory=list, description="9×9 board now, rows top to bottom, 0 = empty"
    )
    initial_filled: int = Field(default=0, description="How many cells were filled at reset")
    last_move: LastMove = Field(default_factory=LastMove)
    invalid_moves_left: int = Field(
        default=0,
        description="Further consecutive invalid moves the game forgives; the next one beyond "
        "this ends the game. 0 once the game is over.",
    )
    step: int = Field(default=0, description="Steps taken this episode (valid or not)")
    turn: int = Field(default=0, description="The game's turn counter (valid moves only)")
    end_reason: str | None = Field(default=None, description="Why the game ended, once done")


class SudokuState(TextArenaState):
    """A Sudoku session's state: OpenEnv's TextArenaState fields (``raw_state`` included), the
    seed, the board and the episode's options."""

    env_id: str = "Sudoku-v0"
    board: list[list[int]] = Field(default_factory=list)
    initial_filled: int = 0
    error_allowance: int = 1
