"""The value types an environment speaks: Action, Observation, State, and the client's StepResult.

They mirror OpenEnv's shapes field for field so that schemas and frames match: an action
forbids unknown fields but always allows `metadata`; an observation carries `done`, `reward`
and `metadata`, of which `done` and `reward` are lifted to the top of the wire frame; a state
carries `episode_id` and `step_count` and allows anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Action", "Observation", "State", "StepResult", "ObsT"]


class Action(BaseModel):
    """Base class of an environment's action. Subclasses add the action's fields."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Additional metadata for the action"
    )


class Observation(BaseModel):
    """Base class of an environment's observation. Subclasses add the observation's fields."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    done: bool = Field(default=False, description="Whether the episode has terminated")
    reward: bool | int | float | None = Field(
        default=None, description="Reward signal from the last action"
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Additional metadata for the observation"
    )


class State(BaseModel):
    """An environment's internal state, separate from what the agent observes."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(default=None, description="Unique identifier for the current episode")
    step_count: int = Field(default=0, ge=0, description="Number of steps taken in the current episode")


ObsT = TypeVar("ObsT")


@dataclass
class StepResult(Generic[ObsT]):
    """What a client gets back from `reset` and `step`.

    `observation` is the observation body without `reward` and `done` (a dict, or the typed
    observation when the client was given an observation type); `metadata` is the frame's
    top-level metadata when the server sent one.
    """

    observation: ObsT
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
