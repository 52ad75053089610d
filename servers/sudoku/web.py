"""The Sudoku panel of the web page: the board, the hints and the reward components, computed
by the scheduler's own code. It plugs into envsdk's generic page through
`SudokuEnvironment.web_panel` (`SUDOKU_PANEL`): routes ``POST /web/api/sudoku/hints`` and
``POST /web/api/sudoku/reward``, and the script ``static/sudoku_panel.js`` that draws them.

The page holds the episode it plays (the reset board and, per step, the message sent and the
structured observation that came back); these functions turn that into what `SudokuScheduler`
would compute for the same game — `sudoku_hints` for the hints, `move_components` and
`SudokuReward` for the five components, `SudokuScheduler.format_observation` for the user
message the model would read — so nothing is re-implemented in JavaScript.

Differences from a scheduled episode, by design of a hand-played page: the page sends the
typed message as is (the scheduler would normalise a parsable reply to ``[r c n]``), and an
unparsable message is still sent to the env; the components stop at the first one, as the
scheduler's would (it charges ``format_penalty`` −1 and ends the episode there), and the reply
says so in ``note``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field, field_validator

from envsdk.games import sudoku as game
from envsdk.games.sudoku import Board
from envsdk.schedulers.sudoku import (
    SudokuEpisode,
    SudokuScheduler,
    sudoku_hints,
)
from envsdk.web import WebPanel

__all__ = [
    "SudokuHintsRequest",
    "SudokuOption",
    "SudokuHintsReply",
    "SudokuPlayedStep",
    "SudokuRewardRequest",
    "SudokuRewardReply",
    "sudoku_hints_reply",
    "sudoku_reward_reply",
    "SUDOKU_PANEL",
]

Verdict = Literal["valid", "invalid", "bad_format"]


def _check_board(board: list[list[int]]) -> list[list[int]]:
    if len(board) != 9 or any(len(row) != 9 for row in board):
        raise ValueError("a board is 9 rows of 9 integers (0 = empty)")
    if any(not 0 <= v <= 9 for row in board for v in row):
        raise ValueError("board cells are integers 0..9 (0 = empty)")
    return board


class SudokuHintsRequest(BaseModel):
    """``POST /web/api/sudoku/hints``: the board now and the moves not to repeat (the page, as the
    scheduler, sends those the game rejected)."""

    board: list[list[int]] = Field(description="9×9, rows top to bottom, 0 = empty")
    tried: list[tuple[int, int, int]] = Field(
        default_factory=list, description="Distinct [row, col, digit] moves tried (1-based), first-tried order"
    )

    _board = field_validator("board")(_check_board)


class SudokuOption(BaseModel):
    row: int
    col: int
    digits: list[int]


class SudokuHintsReply(BaseModel):
    tried: list[tuple[int, int, int]]
    guaranteed: list[tuple[int, int, int]] = Field(description="Single-candidate moves [row, col, digit]")
    options: list[SudokuOption] = Field(description="Cells with two or three candidates")
    text: str = Field(description="The hints as the scheduler writes them into the user message")


def sudoku_hints_reply(request: SudokuHintsRequest) -> SudokuHintsReply:
    """`sudoku_hints` of the request's board and tried moves, as structure and as text."""
    hints = sudoku_hints(request.board, request.tried)
    return SudokuHintsReply(
        tried=list(hints.tried),
        guaranteed=list(hints.guaranteed),
        options=[SudokuOption(row=r, col=c, digits=list(d)) for r, c, d in hints.options],
        text=hints.render(),
    )


class SudokuPlayedStep(BaseModel):
    """One step played in the page: what was sent, and the observation's structured answer."""

    message: str = Field(description="The action's text as sent")
    board: list[list[int]] = Field(description="The observation's board after the step")
    verdict: Verdict | None = Field(default=None, description="The observation's last_move.verdict")
    reason: str | None = Field(default=None, description="The observation's last_move.reason")
    reward: float = 0.0

    _board = field_validator("board")(_check_board)


class SudokuRewardRequest(BaseModel):
    """``POST /web/api/sudoku/reward``: the reset board and every step played since."""

    initial_board: list[list[int]]
    initial_filled: int | None = Field(default=None, description="Default: the filled cells of initial_board")
    steps: list[SudokuPlayedStep] = Field(default_factory=list)

    _board = field_validator("initial_board")(_check_board)


class SudokuRewardReply(BaseModel):
    components: dict[str, float] = Field(
        description="Episode values: empty_cell, valid_move, repetition (means), progress, "
        "correct, format_penalty and total_reward (`SudokuReward.summary`)"
    )
    per_step: list[dict[str, float]] = Field(
        description="Each scored step's empty_cell, valid_move, repetition, and progress, correct, "
        "total so far (the scheduler's StepRecord.components)"
    )
    tried: list[tuple[int, int, int]] = Field(description="Distinct moves tried, first-tried order")
    rejected: list[tuple[int, int, int]] = Field(
        default_factory=list, description="Distinct moves the game rejected, first-rejected order (what the hints list)"
    )
    model_view: str = Field(description="The next user message the scheduler would send the model")
    note: str | None = Field(default=None, description="Why scoring stopped early, if it did")


def sudoku_reward_reply(request: SudokuRewardRequest) -> SudokuRewardReply:
    """Replay the page's steps through the scheduler's reward code (see the module docstring)."""
    initial: Board = [row[:] for row in request.initial_board]
    filled0 = request.initial_filled if request.initial_filled is not None else game.count_filled(initial)
    episode = SudokuEpisode(board=initial, initial_filled=filled0, structured=True)
    reward = episode.reward
    per_step: list[dict[str, float]] = []
    note: str | None = None
    for index, played in enumerate(request.steps, start=1):
        move = game.parse_move(played.message)
        if move is None:
            reward.format_penalty = -1.0
            note = (
                f"step {index} ({played.message[:40]!r}) has no [row column number]: the scheduler "
                "charges format_penalty -1 and ends the episode there, so later steps are not scored"
            )
            break
        per_step.append(episode.score(move, played.verdict, played.board, played.reward, played.reason))
    return SudokuRewardReply(
        components=reward.summary(),
        per_step=per_step,
        tried=list(episode.tried),
        rejected=list(episode.rejected),
        model_view=SudokuScheduler().format_observation({}, episode),
        note=note,
    )


_router = APIRouter()


@_router.post("/hints")
async def _hints(body: SudokuHintsRequest) -> SudokuHintsReply:
    return sudoku_hints_reply(body)


@_router.post("/reward")
async def _reward(body: SudokuRewardRequest) -> SudokuRewardReply:
    return sudoku_reward_reply(body)


#: The Sudoku server's addition to the web page.
SUDOKU_PANEL = WebPanel(
    name="sudoku",
    router=_router,
    script=Path(__file__).parent / "static" / "sudoku_panel.js",
    action_placeholder="[row column digit]",
)
