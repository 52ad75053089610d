"""The Sudoku scheduler's five-part shaped reward as a rubric the server computes per session.

Asked for with the reset option ``rubric="shaped"``. Each step's observation then carries
``metadata["reward_components"]`` with ``empty_cell``, ``valid_move``, ``repetition`` (this
move's values), ``progress`` (best share of the open cells filled so far) and ``correct`` (the
game's reward for this step) — the values `SudokuScheduler` computes client-side, by the same
code (`SudokuEpisode.score`), from the same facts (the structured board, the verdict on the
move, the reward), so the two agree to the last bit. The step's reward stays the game's; the
rubric's own score is the shaped total.

A message without a ``[row column number]`` scores a format penalty of −1 in the total (the
scheduler ends the episode on such a reply instead of sending it); its three per-move parts
are then None (not evaluated).
"""

from __future__ import annotations

from typing import Any

from envsdk.games.sudoku import parse_move
from envsdk.rewards import Rubric
from envsdk.schedulers.sudoku import SUDOKU_COMPONENTS, SudokuEpisode
from servers.sudoku.models import SudokuAction, SudokuObservation

__all__ = ["SudokuRubric", "SUDOKU_RUBRICS"]

#: The values of the ``rubric`` reset option.
SUDOKU_RUBRICS: tuple[str, ...] = ("shaped",)


class _Component(Rubric):
    """One named part: reads the value its parent computed for the current step."""

    def __init__(self, values: dict[str, float], name: str) -> None:
        super().__init__()
        self._values = values
        self._name = name

    def forward(self, action: Any, observation: Any) -> float:
        return self._values[self._name]


class SudokuRubric(Rubric):
    """The five shaped components of one game (see the module doc). Call `begin` with the
    reset observation; each call scores one step and returns the shaped total so far."""

    def __init__(self) -> None:
        super().__init__()
        self._step: dict[str, float] = {}
        self._episode: SudokuEpisode | None = None
        self.empty_cell = _Component(self._step, "empty_cell")
        self.valid_move = _Component(self._step, "valid_move")
        self.repetition = _Component(self._step, "repetition")
        self.progress = _Component(self._step, "progress")
        self.correct = _Component(self._step, "correct")

    def begin(self, first: SudokuObservation) -> None:
        """Start scoring the game whose reset observation is `first`."""
        board = [row[:] for row in first.board]
        self._episode = SudokuEpisode(board=board, initial_filled=first.initial_filled, structured=True)

    def reset(self) -> None:
        self._episode = None
        self._step.clear()

    def forward(self, action: SudokuAction, observation: SudokuObservation) -> float:
        episode = self._episode
        if episode is None:
            raise RuntimeError("SudokuRubric scored a step before begin(reset observation)")
        self._step.clear()
        move = parse_move(action.message)
        reward = float(observation.reward or 0.0)
        if move is None:
            episode.reward.format_penalty = -1.0
            episode.reward.correct = reward
            self._step.update(progress=episode.reward.progress, correct=reward)
            self.progress(action, observation)
            self.correct(action, observation)
            return episode.reward.total
        last = observation.last_move
        parts = episode.score(move, last.verdict, observation.board, reward, last.reason)
        self._step.update({name: parts[name] for name in SUDOKU_COMPONENTS})
        for _, part in self.named_children():
            part(action, observation)
        return parts["total"]
