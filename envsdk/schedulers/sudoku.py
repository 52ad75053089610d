"""`SudokuScheduler`: TextArena Sudoku over OpenEnv, with a five-part shaped reward and hints.

Per step, with the reply's move ``[r c n]`` (fallback: its first three integers):

* ``empty_cell``: +1 if the target cell was empty on the last known board, else −1;
* ``valid_move``: +1.0 if the env accepted the move and it is new; −0.5 if the env rejected it
  (its text warns "please resubmit" / "avoid penalties"); 0 otherwise;
* ``repetition``: with n = times this exact move was tried before, −min(2**n, 10) if n > 0;
* ``progress``: (filled now − filled initially) / (81 − filled initially), best so far;
* ``correct``: the env's reward for this step (1 when solved; the fraction on a loss).

total = mean(empty_cell) + mean(valid_move) + mean(repetition) + progress + correct over the
steps so far; an unparseable reply costs −1 (``format_penalty``) and ends the episode without
being sent. A perfect game totals 4.0. The move is read from the reply after any reasoning
(``<think>…</think>``): a move the model weighs while it thinks is never played. A reply cut
by the length limit is, under the default ``cut_replies="penalty"``, a reply with no move: −1.

Each user message shows the board and, as the ``hints`` option says (`HINT_LEVELS`; a row's
``env_config["hints"]`` wins for its episode):

* ``"none"``: nothing more (a rejected move is still named in the next message's header);
* ``"rejected"`` (the default): the moves the environment rejected so far, "MOVES REJECTED (do
  not repeat)" — the episode's own history, which gives away nothing of the solution;
* ``"all"`` (what ms-swift's Sudoku scheduler always shows): also hints computed from the board
  (candidates per empty cell, drawn from the 10 empty cells with the fewest candidates): the
  GUARANTEED MOVES (single-candidate cells, up to 5) and Other options (2–3 candidates, up to 5).
  A single-candidate cell's move is a move of the solution: copying them earns ``valid_move``
  and ``progress`` without solving anything, so the reward is easier to earn than the task.

Observations: with an envsdk Sudoku server the scheduler asks for ``observation_form=
"compact"`` and reads the structured ``board``, ``initial_filled`` and ``last_move`` fields;
it also asks for ``rubric="shaped"`` (``server_rewards``) and then takes each step's five
components from the observation's ``metadata["reward_components"]``, which the server computes
with this module's own code (equal to the last bit); without them it computes them itself;
with a plain OpenEnv TextArena server it reads the cumulative transcript, taking only the text
added since the previous observation (``content[last_len:]``). Both give the same rewards.

To adapt it to another Sudoku-like server, subclass and override `parse_move` (the move in a
reply), `parse_action` (the action dict sent for a reply) and/or `format_observation` (the
user message for an observation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain, compress
from math import fsum
from operator import itemgetter, ne
from typing import Any, Literal, NamedTuple

from envsdk.errors import ServerError
from envsdk.games import sudoku as game
from envsdk.games.sudoku import Board
from envsdk.reasoning import split_reasoning
from envsdk.rewards.parts import (
    REWARD_COMPONENTS,
    REWARD_PARTS,
    all_finite_floats,
    components_from,
)
from envsdk.schedulers.base import FORMAT_PENALTY, StepRecord, Trajectory, TurnResult
from envsdk.schedulers.openenv import OpenEnvScheduler, RemoteEpisode
from envsdk.types import StepResult

__all__ = [
    "SudokuScheduler",
    "SudokuHints",
    "SudokuReward",
    "SudokuEpisode",
    "Move",
    "sudoku_hints",
    "move_components",
    "SUDOKU_COMPONENTS",
    "SUDOKU_SYSTEM_MESSAGE",
    "TOTAL_REWARD_IS",
    "HINT_LEVELS",
    "DEFAULT_HINTS",
    "check_hints",
]

Move = tuple[int, int, int]

#: The five shaped components, by name, as steps and ``rollout_infos`` report them.
SUDOKU_COMPONENTS: tuple[str, ...] = ("empty_cell", "valid_move", "repetition", "progress", "correct")
Verdict = Literal["valid", "invalid", "bad_format"]

SUDOKU_SYSTEM_MESSAGE = (
    "You are playing Sudoku. Fill the empty cells ('.') so that every row, every column and "
    "every 3x3 box contains the digits 1-9 exactly once. Do not overwrite filled cells. "
    "Reply with exactly one move in the format [row column number], for example [5 3 7]; "
    "rows and columns are numbered 1 to 9."
)

#: What a Sudoku trajectory's ``total_reward`` is, written into every record (``infos``): the
#: shaped total, not the sum of the environment's ``step_rewards`` (1.0 for a solved game).
TOTAL_REWARD_IS = (
    "shaped: mean(empty_cell) + mean(valid_move) + mean(repetition) + progress + correct"
    " + format_penalty (4.0 for a perfect game); step_rewards are the environment's own rewards"
)

#: The five components of a parts mapping, in `SUDOKU_COMPONENTS`' order (KeyError: one is missing).
_SUDOKU_PARTS = itemgetter(*SUDOKU_COMPONENTS)

_WARNING_RE = re.compile(r"please resubmit|avoid penalties", re.IGNORECASE)

#: What the user messages add to the board (see the module doc), least first.
HINT_LEVELS: tuple[str, ...] = ("none", "rejected", "all")
#: The hints given unless asked otherwise: the moves rejected so far, nothing of the solution.
DEFAULT_HINTS = "rejected"


def check_hints(value: Any) -> str:
    """`value` when it is one of `HINT_LEVELS`, else `ValueError` naming them."""
    if value not in HINT_LEVELS:
        raise ValueError(f"Sudoku hints {value!r}: expected one of {', '.join(map(repr, HINT_LEVELS))}")
    return str(value)


# ---------------------------------------------------------------- hints


@dataclass(frozen=True)
class SudokuHints:
    """Hints for one board: moves not to repeat (the scheduler gives those the environment
    rejected), single-candidate moves, and 2–3-candidate cells.

    Rows and columns are 1-based, as on the wire.
    """

    tried: tuple[Move, ...]
    guaranteed: tuple[Move, ...]
    options: tuple[tuple[int, int, tuple[int, ...]], ...]

    def render(self, level: str = "all") -> str:
        """The hints as the user message shows them at hint `level` (`HINT_LEVELS`)."""
        lines = []
        if self.tried and level != "none":
            lines.append("MOVES REJECTED (do not repeat): " + ", ".join(map(_fmt_move, self.tried)))
        if level != "all":
            return "\n".join(lines)
        if self.guaranteed:
            lines.append("GUARANTEED MOVES (only one option): " + ", ".join(map(_fmt_move, self.guaranteed)))
        if self.options:
            lines.append(
                "Other options: "
                + " | ".join(f"({r},{c})->{','.join(str(d) for d in digits)}" for r, c, digits in self.options)
            )
        return "\n".join(lines)


class _MoveText(dict[Move, str]):
    """Every on-board move's text, made once: moves are rendered for every hint and record each
    turn, looked up in C. Any other move (a reply may say ``[12 0 5]``) is drawn when asked and
    not kept, so no reply grows the table."""

    def __missing__(self, move: Move) -> str:
        return f"[{move[0]} {move[1]} {move[2]}]"


_MOVE_TEXT = _MoveText({(r, c, n): f"[{r} {c} {n}]" for r in range(1, 10) for c in range(1, 10) for n in range(1, 10)})
#: A move's text, ``[r c n]``.
_fmt_move = _MOVE_TEXT.__getitem__


def sudoku_hints(
    board: Board,
    tried: Iterable[Move] = (),
    *,
    pool: int = 10,
    max_guaranteed: int = 5,
    max_options: int = 5,
) -> SudokuHints:
    """Hints drawn from the `pool` empty cells with the fewest candidates (ties: row, column).

    ``tried`` lists the moves not to repeat (the scheduler passes those the environment
    rejected), in the order first tried; repeats are listed once.
    """
    # One int per cell, ordered as (candidate count, row, column) and carrying the cell's mask in
    # its low bits: ints sort in C, and only the `pool` cells kept are taken apart again.
    ranked = sorted([_COUNT[allowed] << 18 | r << 14 | c << 10 | allowed for r, c, allowed in game.empty_cells(board)])
    guaranteed: list[Move] = []
    options: list[tuple[int, int, tuple[int, ...]]] = []
    for key in ranked[:pool]:
        n, r, c, digits = key >> 18, (key >> 14 & 15) + 1, (key >> 10 & 15) + 1, game.digits_of(key & 1023)
        if n == 1:
            guaranteed.append((r, c, digits[0]))
        elif 2 <= n <= 3:
            options.append((r, c, digits))
    return SudokuHints(
        tried=tuple(dict.fromkeys(tried)), guaranteed=tuple(guaranteed[:max_guaranteed]), options=tuple(options[:max_options])
    )


# How many digits each `empty_cells` mask allows (masks use bits 1-9, so below 1024).
_COUNT = tuple(bin(mask).count("1") for mask in range(1 << 10))


# ---------------------------------------------------------------- reward


def move_components(board_before: Board, move: Move, times_tried_before: int, verdict: Verdict | None) -> dict[str, float]:
    """The per-step ``empty_cell``, ``valid_move`` and ``repetition`` values of one move.

    ``verdict`` is what the environment said: ``"valid"`` (accepted), ``"invalid"`` /
    ``"bad_format"`` (rejected with a warning) or None (no verdict seen).
    """
    r, c, _ = move
    on_board = 1 <= r <= 9 and 1 <= c <= 9
    empty = on_board and board_before[r - 1][c - 1] == 0
    if verdict == "valid" and times_tried_before == 0:
        valid = 1.0
    elif verdict in ("invalid", "bad_format"):
        valid = -0.5
    else:
        valid = 0.0
    repetition = -float(min(2**times_tried_before, 10)) if times_tried_before > 0 else 0.0
    return {"empty_cell": 1.0 if empty else -1.0, "valid_move": valid, "repetition": repetition}


@dataclass
class SudokuReward:
    """The five components accumulated over an episode, and their total."""

    empty_cell: list[float] = field(default_factory=list)
    valid_move: list[float] = field(default_factory=list)
    repetition: list[float] = field(default_factory=list)
    progress: float = 0.0
    correct: float = 0.0
    format_penalty: float = 0.0

    @property
    def total(self) -> float:
        return (
            _mean(self.empty_cell)
            + _mean(self.valid_move)
            + _mean(self.repetition)
            + self.progress
            + self.correct
            + self.format_penalty
        )

    def summary(self) -> dict[str, float]:
        """Episode-level values: means of the per-step parts, progress, correct, total."""
        # `_mean` written out: this runs every step.
        empty_cell = fsum(self.empty_cell) / len(self.empty_cell) if self.empty_cell else 0.0
        valid_move = fsum(self.valid_move) / len(self.valid_move) if self.valid_move else 0.0
        repetition = fsum(self.repetition) / len(self.repetition) if self.repetition else 0.0
        return {
            "empty_cell": empty_cell,
            "valid_move": valid_move,
            "repetition": repetition,
            "progress": self.progress,
            "correct": self.correct,
            "format_penalty": self.format_penalty,
            # `total`'s sum, in its order, from the means just taken (each turn asks for both).
            "total_reward": empty_cell + valid_move + repetition + self.progress + self.correct + self.format_penalty,
        }


def _mean(values: list[float]) -> float:
    """`statistics.fmean`'s value (an exact sum over the count; 0 for none) without its checks:
    it runs several times a turn."""
    return fsum(values) / len(values) if values else 0.0


# ---------------------------------------------------------------- episode state


@dataclass
class SudokuEpisode:
    """What the scheduler knows of one game between turns."""

    board: Board
    initial_filled: int
    structured: bool
    transcript_len: int = 0
    tried: dict[Move, int] = field(default_factory=dict)
    #: The moves the environment rejected, in the order first rejected (the hints list them).
    rejected: dict[Move, None] = field(default_factory=dict)
    reward: SudokuReward = field(default_factory=SudokuReward)
    steps: int = 0
    last_move: Move | None = None
    last_verdict: Verdict | None = None
    last_reason: str | None = None
    #: What the user messages show beside the board (`HINT_LEVELS`).
    hints: str = DEFAULT_HINTS
    #: Filled cells on `board`, counted once a step (a count over the 81 cells is not free).
    filled: int = field(init=False)
    #: `reward.summary()` as of the last step, taken once a step.
    summary: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.filled = game.count_filled(self.board)
        self.summary = self.reward.summary()

    @property
    def cells_filled(self) -> int:
        """Cells filled since the start of the game."""
        return self.filled - self.initial_filled

    def score(
        self,
        move: Move,
        verdict: Verdict | None,
        board_after: Board,
        reward: float,
        reason: str | None = None,
        *,
        filled: int | None = None,
        owned: bool = False,
    ) -> dict[str, float]:
        """Score one played move and advance the episode: the step's five components and total.

        ``board_after`` is the board the environment shows after the move, ``reward`` the
        environment's reward for the step (``correct``). The one place the reward is computed:
        the scheduler, the web page and the Sudoku server's rubric all call it. ``filled`` and
        ``owned``: as for `record`.
        """
        parts = move_components(self.board, move, self.tried.get(move, 0), verdict)
        open_cells = 81 - self.initial_filled
        if filled is None:
            filled = game.count_filled(board_after)
        progress = max(self.reward.progress, (filled - self.initial_filled) / open_cells if open_cells else 1.0)
        parts["progress"], parts["correct"] = progress, float(reward)
        return self.record(move, verdict, board_after, parts, reason, filled=filled, owned=owned)

    def record(
        self,
        move: Move,
        verdict: Verdict | None,
        board_after: Board,
        parts: dict[str, float],
        reason: str | None = None,
        *,
        filled: int | None = None,
        owned: bool = False,
    ) -> dict[str, float]:
        """Advance the episode by one move whose five components are already known (`score`'s,
        or the server's ``reward_components``); return them with the total so far. ``filled``:
        the filled cells of `board_after`, when the caller has counted them. The episode keeps a
        copy of `board_after`, or, ``owned``, the board itself: the caller hands it over and
        changes it no more (the scheduler's own reading of the observation)."""
        self.tried[move] = self.tried.get(move, 0) + 1
        if verdict == "invalid" or verdict == "bad_format":
            self.rejected[move] = None
        reward = self.reward
        reward.empty_cell.append(parts["empty_cell"])
        reward.valid_move.append(parts["valid_move"])
        reward.repetition.append(parts["repetition"])
        reward.progress = parts["progress"]
        reward.correct = parts["correct"]
        self.board = board_after if owned else list(map(list, board_after))
        self.filled = game.count_filled(board_after) if filled is None else filled
        self.steps += 1
        self.last_move, self.last_verdict, self.last_reason = move, verdict, reason
        summary = self.summary = reward.summary()
        return {
            "empty_cell": parts["empty_cell"],
            "valid_move": parts["valid_move"],
            "repetition": parts["repetition"],
            "progress": reward.progress,
            "correct": reward.correct,
            "total": summary["total_reward"],
        }


class _Reading(NamedTuple):
    board: Board | None
    verdict: Verdict | None
    reason: str | None
    transcript_len: int
    #: The filled cells of `board`, when the reading counted them.
    filled: int | None = None


def _transcript(obs: dict[str, Any]) -> str:
    messages = obs.get("messages")
    if isinstance(messages, list) and messages:
        return "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = obs.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def _structured_board(value: Any) -> Board | None:
    """A copy of a 9×9 ``board`` field as ints (None or "" for an empty cell: 0); None when
    `value` is not 9 lists of 9. Every step reads one, so the usual case (plain lists of plain
    ints, as JSON gives them) is checked and copied in C."""
    if not isinstance(value, list) or len(value) != 9:
        return None
    if set(map(type, value)) == _ONLY_LIST and set(map(len, value)) == _NINE:
        if set(map(type, chain.from_iterable(value))) == _ONLY_INT:
            return list(map(list, value))
    elif not all(isinstance(row, list) and len(row) == 9 for row in value):
        return None
    try:  # a server's cells are ints: converted in C
        return [list(map(int, row)) for row in value]
    except (TypeError, ValueError):  # None or "" for an empty cell
        return [[int(v or 0) for v in row] for row in value]


_ONLY_LIST = {list}
_NINE = {9}
_ONLY_INT = {int}


def _next_board(value: Any, known: Board, filled: int) -> tuple[Board, int] | None:
    """`_structured_board(value)` and its filled cells, for the board that follows `known` (the
    board read last step: ints, not changed since) with `filled` filled cells. A move changes one
    row at most, and checking each cell's type costs far more than comparing it: a row equal to
    its row in `known` is that row (shared, not copied), and only the others are checked and
    counted. None when a row is not 9 plain ints (`_structured_board` then reads it)."""
    if type(value) is not list or len(value) != 9:
        return None
    board = list(known)
    for index in compress(range(9), map(ne, value, known)):  # the rows that differ, found in C
        row, was = value[index], known[index]
        if type(row) is not list or len(row) != 9 or set(map(type, row)) != _ONLY_INT:
            return None
        board[index] = row.copy()
        filled += was.count(0) - row.count(0)
    return board, filled


def _initial_filled(value: Any, board: Board) -> int:
    if isinstance(value, bool) or value is None:
        return game.count_filled(board)
    if isinstance(value, int):
        return value
    if isinstance(value, list):  # a 9x9 mask or the initial board
        return sum(1 for row in value for v in (row if isinstance(row, list) else [row]) if v)
    return game.count_filled(board)


def _with_hints(board: Board, hints: str) -> str:
    """A user message's body: the board, then the hints when there are any."""
    text = f"Current Sudoku board ('.' = empty):\n{game.render_board(board)}"
    return f"{text}\n\n{hints}" if hints else text


# ---------------------------------------------------------------- scheduler


class SudokuScheduler(OpenEnvScheduler):
    """Plays TextArena Sudoku on a remote server with shaped rewards and hints (see module doc).

    ``observation_form``: what to ask an envsdk server for (``"compact"``: only new text and
    structured fields); None sends nothing and reads whatever the server sends.
    ``server_rewards``: ask an envsdk server for its shaped-reward rubric and use its parts
    (step info ``reward_source`` says whose were used); False always computes them here.
    ``hints``: what the user messages show beside the board (`HINT_LEVELS`, see the module doc;
    default ``"rejected"``); a row's ``env_config["hints"]`` wins for its episode. Each record's
    ``infos["hints"]`` says which level its episode was given.
    """

    #: A reply with no move costs it (and so does a reply cut under ``cut_replies="penalty"``).
    format_penalty: float = FORMAT_PENALTY

    def __init__(
        self,
        *,
        observation_form: str | None = "compact",
        server_rewards: bool = True,
        hints: str = DEFAULT_HINTS,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("system_message", SUDOKU_SYSTEM_MESSAGE)
        kwargs.setdefault("max_turns", 100)
        super().__init__(**kwargs)
        self.observation_form = observation_form
        self.server_rewards = server_rewards
        self.hints = check_hints(hints)
        self._parse_action_overridden = type(self).parse_action is not SudokuScheduler.parse_action

    # ------------------------------------------------------------ overridable

    def parse_move(self, text: str) -> Move | None:
        """The move in a reply: ``[r c n]``, else its first three integers; None if neither.
        Read after any reasoning block (`envsdk.reasoning.split_reasoning`), so a completion
        given whole (a caller other than the run loop) plays its answer, not its thinking."""
        return game.parse_move(split_reasoning(text)[1])

    def parse_action(self, text: str) -> dict[str, Any]:
        """The action for a reply: its move, normalised to ``{"message": "[r c n]"}``."""
        move = self.parse_move(text)
        if move is None:
            raise ValueError(f"no move [row column number] in reply {text[:80]!r}")
        return {"message": _fmt_move(move)}

    def format_observation(
        self, obs: dict[str, Any], episode: SudokuEpisode | None = None, *, previous: dict[str, Any] | None = None
    ) -> str:
        """The user message: on the first turn the board and hints; later ``Step k. Progress:
        m cells filled.``, a note on a rejected move, the board and hints. Without `episode`
        the board is read from `obs` (an observation without a board: the default rendering)."""
        if episode is None:
            board = _structured_board(obs.get("board")) or game.parse_board(_transcript(obs))
            if board is None:
                return super().format_observation(obs, previous=previous)
            return _with_hints(board, sudoku_hints(board).render(self.hints))
        hints = "" if episode.hints == "none" else sudoku_hints(episode.board, episode.rejected).render(episode.hints)
        body = _with_hints(episode.board, hints)
        if episode.steps == 0:
            return body
        header = f"Step {episode.steps}. Progress: {episode.cells_filled} cells filled."
        if episode.last_verdict in ("invalid", "bad_format") and episode.last_move is not None:
            note = f"Your move {_fmt_move(episode.last_move)} was rejected"
            reason = (episode.last_reason or "").rstrip(". ")
            header += f"\n{note}: {reason}." if reason else f"\n{note}."
        return f"{header}\n{body}"

    # ------------------------------------------------------------ reading observations

    def _read(
        self, obs: dict[str, Any], previous_len: int, known: Board | None = None, known_filled: int = 0
    ) -> _Reading:
        """What `obs` says: its board, the verdict on the last move and why. `known`: the board
        read last step and its filled cells, for a server that sends the board as a field."""
        value = obs.get("board")
        following = _next_board(value, known, known_filled) if known is not None else None
        board, filled = following if following is not None else (_structured_board(value), None)
        if board is not None:
            last_move = obs.get("last_move")
            last: dict[str, Any] = last_move if isinstance(last_move, dict) else {}
            said = last.get("verdict")
            verdict: Verdict | None = said if said in ("valid", "invalid", "bad_format") else None
            reason = last.get("reason")
            # The transcript's length only matters to a server that sends no board.
            return _Reading(board, verdict, str(reason) if reason else None, previous_len, filled)
        text = _transcript(obs)
        # Cumulative transcript: only what was added since the previous observation is news.
        new_text = text[previous_len:] if len(text) >= previous_len else text
        warned = _WARNING_RE.search(new_text)
        reason = None
        if warned:
            found = re.search(r"Reason:\s*(.*?)(?:\s*Please resubmit|$)", new_text, re.IGNORECASE | re.DOTALL)
            reason = found.group(1).strip() if found else None
        return _Reading(game.parse_board(new_text), "invalid" if warned else None, reason, len(text))

    # ------------------------------------------------------------ hooks

    def sudoku(self, trajectory: Trajectory) -> SudokuEpisode:
        return self._game(self.episode(trajectory), trajectory)

    @staticmethod
    def _game(episode: RemoteEpisode, trajectory: Trajectory) -> SudokuEpisode:
        state = episode.game
        if not isinstance(state, SudokuEpisode):
            raise RuntimeError(f"trajectory {trajectory.uuid} has no Sudoku game (not started)")
        return state

    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        episode = await self.open_session(trajectory)
        kwargs = self.reset_arguments(trajectory)
        # Options only an envsdk Sudoku server knows, least needed last (dropped first).
        asked: list[str] = []
        if getattr(episode.session, "server_kind", None) == "envsdk":
            if self.observation_form and "observation_form" not in kwargs:
                kwargs["observation_form"] = self.observation_form
                asked.append("observation_form")
            if self.server_rewards and "rubric" not in kwargs:
                kwargs["rubric"] = "shaped"
                asked.append("rubric")
        while True:
            try:
                await self.reset_session(trajectory, **kwargs)
                break
            except ServerError as exc:
                # An envsdk server whose Sudoku env lacks an option refuses the keyword.
                if not (asked and exc.code == "VALIDATION_ERROR"):
                    raise
                kwargs.pop(asked.pop())
        obs = episode.observation
        reading = self._read(obs, 0)
        board = reading.board or game.parse_board(_transcript(obs))
        if board is None:
            raise ValueError(
                f"the first observation from {episode.base_url} has no Sudoku board (neither a"
                " `board` field nor R1..R9 rows in its text); is this a Sudoku server?"
            )
        structured = _structured_board(obs.get("board")) is not None
        state = SudokuEpisode(
            board=board,
            initial_filled=_initial_filled(obs.get("initial_filled"), board) if structured else game.count_filled(board),
            structured=structured,
            transcript_len=reading.transcript_len,
            hints=check_hints(trajectory.env_config.get("hints", self.hints)),
        )
        episode.game = state
        trajectory.reset_info["observation_form"] = "structured" if structured else "text"
        trajectory.reset_info["observation_form_requested"] = kwargs.get("observation_form")
        trajectory.messages = self.first_messages(trajectory, self.format_observation(obs, state))

    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        episode = self.episode(trajectory)
        state = self._game(episode, trajectory)
        move = self.parse_move(response_text)
        if move is None:
            state.reward.format_penalty = self.format_penalty
            state.summary = state.reward.summary()
            trajectory.reason = f"unparseable reply (no [row column number]): {response_text[:80]!r}"
            return self._finish_turn(trajectory, state, done=True, extra={"unparseable_reply": True})
        # The move just read is the action, unless a subclass says otherwise (no second parse).
        action = self.parse_action(response_text) if self._parse_action_overridden else {"message": _fmt_move(move)}
        result, duration = await self.env_step(trajectory, action)
        obs = episode.observation
        reading = self._read(obs, state.transcript_len, state.board if state.structured else None, state.filled)
        board_before = state.board
        board_after = reading.board or board_before
        verdict = reading.verdict if state.structured else self._text_verdict(reading, board_before, board_after, move, result)
        server_parts = self._server_parts(result) if self.server_rewards else None
        if server_parts is not None:
            components = state.record(
                move, verdict, board_after, server_parts, reading.reason, filled=reading.filled, owned=True
            )
        else:
            components = state.score(
                move, verdict, board_after, float(result.reward or 0.0), reading.reason, filled=reading.filled, owned=True
            )
        state.transcript_len = reading.transcript_len
        info = self.step_info(result)
        info["verdict"] = verdict
        info["reward_source"] = "server" if server_parts is not None else "scheduler"
        if obs.get("end_reason"):
            info["end_reason"] = obs["end_reason"]
        if reading.reason:
            info["verdict_reason"] = reading.reason
        # Positional (turn, action, observation, reward, done, info, components, duration_s):
        # half the time of the keyword call, once a step.
        trajectory.steps.append(
            StepRecord(turn, action, obs, float(result.reward or 0.0), bool(result.done), info, components, duration)
        )
        if result.done:
            trajectory.reason = self._end_reason(state, info)
        return self._finish_turn(trajectory, state, done=bool(result.done))

    def _server_parts(self, result: StepResult[Any]) -> dict[str, float] | None:
        """The server's five components for this step, when it sent all five."""
        metadata = result.metadata
        sent = metadata.get(REWARD_COMPONENTS) if metadata else None
        if type(sent) is dict and len(sent) == len(SUDOKU_COMPONENTS):
            # The usual case, checked in C: the five, finite floats (`components_from`'s check).
            try:
                values = _SUDOKU_PARTS(sent)
            except KeyError:
                pass
            else:
                if all_finite_floats(values):
                    return dict(zip(SUDOKU_COMPONENTS, values))
        parts = components_from(metadata)
        if parts is None:
            return None
        try:
            values = _SUDOKU_PARTS(parts)
        except KeyError:
            return None
        if None in values:
            return None
        return dict(zip(SUDOKU_COMPONENTS, values))

    def _text_verdict(
        self, reading: _Reading, before: Board, after: Board, move: Move, result: StepResult[Any]
    ) -> Verdict | None:
        if reading.verdict is not None:
            return reading.verdict
        r, c, n = move
        if 1 <= r <= 9 and 1 <= c <= 9 and before[r - 1][c - 1] == 0 and after[r - 1][c - 1] == n:
            return "valid"
        # TextArena prints no warning for the move that ends a lost game: the only way a step
        # ends the game unsolved is a rejected move.
        if result.done and float(result.reward or 0.0) < 1.0:
            return "invalid"
        return None

    def _end_reason(self, state: SudokuEpisode, info: dict[str, Any]) -> str:
        if state.reward.correct >= 1.0:
            return "solved"
        env_reason = info.get("end_reason") or info.get("reason") or info.get("verdict_reason")
        move = _fmt_move(state.last_move) if state.last_move else "?"
        text = f"game lost: invalid move {move} after the error allowance was used up"
        return f"{text} ({env_reason})" if env_reason else text

    def _finish_turn(
        self, trajectory: Trajectory, state: SudokuEpisode, *, done: bool, extra: dict[str, Any] | None = None
    ) -> TurnResult:
        trajectory.total_reward = state.summary["total_reward"]
        return self.turn_result(trajectory, done, extra)

    def apply_format_penalty(self, trajectory: Trajectory, penalty: float) -> None:
        """A cut reply under the ``penalty`` rule costs what a reply with no move does: the
        shaped total's ``format_penalty`` part."""
        state = self.sudoku(trajectory)
        state.reward.format_penalty = penalty
        state.summary = state.reward.summary()
        trajectory.rollout_infos.update(self.episode_infos(trajectory))

    def episode_infos(self, trajectory: Trajectory) -> dict[str, Any]:
        """The episode's rollout infos as of its last step: the five parts, the shaped total,
        the step rewards, the cells filled and the moves tried."""
        state = self.sudoku(trajectory)
        summary = state.summary
        trajectory.total_reward = summary["total_reward"]
        return {
            **summary,
            REWARD_PARTS: dict(zip(SUDOKU_COMPONENTS, map(summary.__getitem__, SUDOKU_COMPONENTS))),
            "total_reward_is": TOTAL_REWARD_IS,
            "step_rewards": trajectory.step_rewards,
            "cells_filled": state.cells_filled,
            "moves_tried": list(map(_fmt_move, state.tried)),
            "hints": state.hints,
        }

    async def step(self, trajectory: Trajectory, turn_result: TurnResult, turn: int) -> None:
        episode = self.episode(trajectory)
        trajectory.messages.append(
            {"role": "user", "content": self.format_observation(episode.observation, self._game(episode, trajectory))}
        )

    def is_success(self, trajectory: Trajectory) -> bool:
        """Solved: the env's reward for the last step was 1."""
        return trajectory.status == "done" and float(trajectory.rollout_infos.get("correct", 0.0)) >= 1.0
