"""Tool environments whose episode ends when the agent submits, as a Harbor task's does: the
work is judged at ``submit``, and the state says when the episode is over (``done``) and how it
went (``reward``, ``success``). Used by the scheduler's and TRL's tests of how an episode ends."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import Field

from envsdk.env import Environment
from envsdk.tools import tool
from envsdk.types import Action, Observation, State

__all__ = ["INSTRUCTION", "AnswerEnvironment", "SubmitEnvironment", "create_answer_app", "create_submit_app"]

#: What the model reads at reset: the observation's only text (it has no ``prompt``).
INSTRUCTION = "Write the word 'right' with the note tool, then submit."


class SubmitAction(Action):
    """A plain step: unused (the tools do the work)."""

    word: str = ""


class SubmitObservation(Observation):
    text: str = ""


class SubmitState(State):
    notes: list[str] = Field(default_factory=list)
    submits: int = Field(default=0, description="How many times submit was called (at most one ran)")
    done: bool = Field(default=False, description="Whether the episode has ended (submitted)")
    reward: float = Field(default=0.0, description="1.0 once submitted with the note 'right', else 0.0")
    success: bool | None = Field(default=None, description="Whether the submitted work is right; None before")


class SubmitEnvironment(Environment[SubmitAction, SubmitObservation, SubmitState]):
    """Tools ``note(word)`` and ``submit()``; the episode ends at ``submit``, which judges the
    notes (reward 1.0 when one is ``right``); any call after it is refused."""

    INLINE_SYNC = True  # a few list operations per call

    def __init__(self) -> None:
        self._state = SubmitState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> SubmitObservation:
        self._state = SubmitState(episode_id=episode_id or uuid.uuid4().hex)
        return SubmitObservation(text=INSTRUCTION, metadata={"seed": seed})

    def step(self, action: SubmitAction) -> SubmitObservation:
        return SubmitObservation(text=self.note(action.word))

    @property
    def state(self) -> SubmitState:
        return self._state

    @tool
    def note(self, word: str) -> str:
        """Write a word down.

        Args:
            word: The word.

        Returns:
            What was written.
        """
        self._open()
        self._state.notes.append(word)
        self._state.step_count += 1
        return f"noted {word}"

    @tool
    def submit(self) -> str:
        """Say the work is done: it is judged, and the episode ends.

        Returns:
            The reward.
        """
        return self._judge()

    def _judge(self) -> str:
        self._open()
        state = self._state
        state.submits += 1
        state.done = True
        state.success = "right" in state.notes
        state.reward = float(state.success)
        return f"[episode over: submitted; reward {state.reward:g}]"

    def _open(self) -> None:
        if self._state.done:
            raise ValueError("the episode is over (submitted)")


class AnswerEnvironment(SubmitEnvironment):
    """The same, but ``submit`` takes an answer: a tool the scheduler cannot call for the agent."""

    @tool
    def submit(self, answer: str) -> str:  # type: ignore[override]
        """Submit the answer: it is judged, and the episode ends.

        Args:
            answer: The answer.

        Returns:
            The reward.
        """
        self._open()
        self._state.notes.append(answer)
        return self._judge()


def create_submit_app(**config: Any) -> Any:
    """`SubmitEnvironment` served by envsdk (`ServerConfig` fields as keyword arguments)."""
    from envsdk.server import create_app

    return create_app(SubmitEnvironment, SubmitAction, SubmitObservation, state_type=SubmitState, **config)


def create_answer_app(**config: Any) -> Any:
    """`AnswerEnvironment` served by envsdk."""
    from envsdk.server import create_app

    return create_app(AnswerEnvironment, SubmitAction, SubmitObservation, state_type=SubmitState, **config)
