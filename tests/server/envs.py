"""Tiny environments for the server tests."""

from __future__ import annotations

import asyncio
from typing import Any

from envsdk.env import Environment
from envsdk.testing import EchoAction, EchoObservation
from envsdk.types import State


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
