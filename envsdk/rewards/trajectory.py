"""Rubrics that score a whole episode at its end, with per-step credit assignment.

OpenEnv 0.10's semantics (``openenv.core.rubrics.trajectory``): each call records the
``(action, observation)`` pair and returns `intermediate_reward` until the observation says
``done``, then ``score_trajectory(trajectory)``; ``compute_step_rewards()`` spreads the final
score over the steps. `ExponentialDiscountingTrajectoryRubric` gives step t of T the credit
``gamma ** (T - 1 - t) * final`` (gamma 0.5 over 3 steps: 0.25, 0.5, 1.0 of the final score).
``reset()`` (called by the environment on reset) forgets the episode.

The trajectory lives in memory for the whole episode: keep observations small (no tensors).
"""

from __future__ import annotations

import abc
from typing import Any

from envsdk.rewards.base import Rubric

__all__ = ["TrajectoryRubric", "ExponentialDiscountingTrajectoryRubric"]


class TrajectoryRubric(Rubric):
    """Scores an episode once it is done; subclasses implement `score_trajectory` and
    `compute_step_rewards`."""

    def __init__(self, intermediate_reward: float = 0.0) -> None:
        super().__init__()
        self.intermediate_reward = intermediate_reward
        self._trajectory: list[tuple[Any, Any]] = []

    def forward(self, action: Any, observation: Any) -> float:
        self._trajectory.append((action, observation))
        if getattr(observation, "done", False):
            return self.score_trajectory(self._trajectory)
        return self.intermediate_reward

    @abc.abstractmethod
    def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
        """The episode's score from its ``(action, observation)`` pairs (called at ``done``)."""

    @abc.abstractmethod
    def compute_step_rewards(self) -> list[float]:
        """One reward per recorded step: how the episode's score is credited to its steps."""

    def reset(self) -> None:
        self._trajectory = []

    @property
    def trajectory(self) -> list[tuple[Any, Any]]:
        """A copy of the recorded ``(action, observation)`` pairs."""
        return list(self._trajectory)

    def state_dict(self) -> dict[str, Any]:
        """The configuration (not the recorded steps)."""
        return {"intermediate_reward": self.intermediate_reward}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "intermediate_reward" in state:
            self.intermediate_reward = state["intermediate_reward"]


class ExponentialDiscountingTrajectoryRubric(TrajectoryRubric):
    """Credits step t of T with ``gamma ** (T - 1 - t)`` times the episode's score.

    gamma 1.0 credits every step equally, 0.0 only the last. `ValueError` outside [0, 1].
    """

    def __init__(self, gamma: float = 0.99, intermediate_reward: float = 0.0) -> None:
        super().__init__(intermediate_reward=intermediate_reward)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.gamma = gamma

    def compute_step_rewards(self) -> list[float]:
        if not self._trajectory:
            return []
        final = self.score_trajectory(self._trajectory)
        steps = len(self._trajectory)
        return [final * (self.gamma ** (steps - 1 - t)) for t in range(steps)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gamma": self.gamma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "gamma" in state:
            self.gamma = state["gamma"]
