"""Wire models of the TextArena server: OpenEnv's ``textarena_env`` shapes, field for field.

`TextArenaAction` is ``{"message": str}`` (extra fields forbidden, ``metadata`` allowed).
`TextArenaObservation` has OpenEnv's ``prompt``, ``messages``, ``current_player_id``,
``legal_players`` and ``info``; `TextArenaState` has OpenEnv's ``env_id``, ``num_players``,
``max_turns``, ``turn``, ``last_reward``, ``last_info`` and ``raw_state``, plus the episode's
seed and options, so an episode can be replayed. Clients written for OpenEnv's TextArena server
read these unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from envsdk.types import Action, Observation, State

__all__ = [
    "ObservationForm",
    "OpponentName",
    "TextArenaMessage",
    "TextArenaAction",
    "TextArenaObservation",
    "TextArenaState",
]

ObservationForm = Literal["cumulative", "compact"]
OpponentName = Literal["random", "scripted"]


class TextArenaMessage(BaseModel):
    """One message of the game transcript, as OpenEnv's TextArena server sends it."""

    sender_id: int = Field(description="-1 for the game, else the player id")
    content: str
    category: str = Field(
        description="TextArena's observation type name (PROMPT, GAME_BOARD, PLAYER_ACTION, "
        "GAME_ADMIN, ...) or MESSAGE for text already merged by a TextArena wrapper"
    )


class TextArenaAction(Action):
    """A model reply, given to the game as its action text."""

    message: str


class TextArenaObservation(Observation):
    """What the agent sees after reset and after each step (see servers/textarena/README.md)."""

    prompt: str = Field(default="", description="The game's instructions (see README for each form)")
    messages: list[TextArenaMessage] = Field(default_factory=list)
    current_player_id: int = Field(default=0, description="Whose turn it is now")
    legal_players: list[int] = Field(default_factory=list, description="The game's player ids")
    info: dict[str, Any] = Field(default_factory=dict, description="TextArena's step info")


class TextArenaState(State):
    """A session's state: OpenEnv's TextArenaState fields plus the seed and episode options."""

    env_id: str = ""
    num_players: int = 1
    max_turns: int | None = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: dict[str, Any] = Field(default_factory=dict)
    raw_state: dict[str, Any] = Field(
        default_factory=dict,
        description="The TextArena game's state: turn, game_state, logs, rewards, done, "
        "role_mapping, game_info, step_info (as OpenEnv sends it)",
    )
    seed: int | None = Field(default=None, description="The seed of this episode")
    done: bool = False
    observation_form: ObservationForm = "cumulative"
    opponent: OpponentName | None = Field(
        default=None, description="The built-in opponent playing the other players, if any"
    )
    agent_player_id: int | None = Field(
        default=None, description="The player the agent plays when an opponent plays the others"
    )
