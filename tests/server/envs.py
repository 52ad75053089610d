"""Tiny environments for the server tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from envsdk.env import Environment
from envsdk.testing import EchoAction, EchoObservation
from envsdk.types import Action, Observation, State


class StrictResetEnvironment(Environment[EchoAction, EchoObservation, State]):
    """reset() takes `difficulty` and nothing else beyond seed/episode_id (no **kwargs)."""

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, difficulty: str = "easy") -> EchoObservation:  # type: ignore[override]
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=difficulty)

    def step(self, action: EchoAction) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return self._state


class AsyncSleepyEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Async env: "sleep:<s>" awaits asyncio.sleep; records whether a step was cancelled."""

    cancelled_steps = 0

    def __init__(self) -> None:
        self._state = State()

    async def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready")

    async def step(self, action: EchoAction) -> EchoObservation:
        if action.message.startswith("sleep:"):
            try:
                await asyncio.sleep(float(action.message.split(":", 1)[1]))
            except asyncio.CancelledError:
                type(self).cancelled_steps += 1
                raise
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return self._state


class FailingFactoryError(RuntimeError):
    pass


def failing_factory() -> Environment[Any, Any, Any]:
    raise FailingFactoryError("no env for you")


class CountingEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Counts close() calls across instances."""

    closed = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        type(self).closed += 1


class RewardingEnvironment(Environment[EchoAction, EchoObservation, State]):
    """The step's reward is the message read as a float ("nan", "inf", "0.5")."""

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, reward=float(action.message))

    @property
    def state(self) -> State:
        return self._state


class MissingKeyEnvironment(Environment[EchoAction, EchoObservation, State]):
    """A bug in env code: "missing" looks up a key that is not there; "long" raises with a
    100,000-character message."""

    def __init__(self) -> None:
        self._state = State()
        self._table: dict[str, int] = {}

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        if action.message == "long":
            raise ValueError("x" * 100_000)
        return EchoObservation(echoed_message=str(self._table["missing_key"]))

    @property
    def state(self) -> State:
        return self._state


class GuessEnv(Environment[EchoAction, EchoObservation, State]):
    """Shaped like the README's env: its state exists only once reset has run."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, done=action.message == "42")

    @property
    def state(self) -> State:
        return self._state


class BlockingAsyncEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Declared ``async def`` but blocks: "block:<s>" sleeps with time.sleep on the event loop;
    "await:<s>" awaits asyncio.sleep (well behaved)."""

    def __init__(self) -> None:
        self._state = State()

    async def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready")

    async def step(self, action: EchoAction) -> EchoObservation:
        how, _, seconds = action.message.partition(":")
        if how == "block":
            time.sleep(float(seconds))
        elif how == "await":
            await asyncio.sleep(float(seconds))
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return self._state


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    text: str = ""


class NumberGuessEnv(Environment[GuessAction, GuessObservation, State]):
    """A typed action (``guess: int``); the observation repeats it. Done after three guesses."""

    INLINE_SYNC = True

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or "e")
        return GuessObservation(text="Guess a number from 1 to 9.")

    def step(self, action: GuessAction) -> GuessObservation:
        self._state.step_count += 1
        return GuessObservation(text=f"you said {action.guess}", done=self._state.step_count >= 3, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
