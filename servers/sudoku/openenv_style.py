"""OpenEnv's TextArena server, restricted to Sudoku, built on openenv's own ``create_app``.

The reference point for compatibility tests and benchmarks: it serves the game exactly the way
``envs/textarena_env`` of huggingface/OpenEnv does (one TextArena game per session, reused
across resets with the wrappers' history cleared; the whole transcript in ``prompt``/``messages``
and again in ``metadata.raw_messages``; seeds honoured under a process-wide lock around
TextArena's global RNG; steps after ``done`` still applied), on the real ``openenv`` package.
It is not meant for training; use `servers.sudoku.create_sudoku_app`.
"""

from __future__ import annotations

import random
import threading
from typing import Any
from uuid import uuid4

import textarena as ta
from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from servers.sudoku.environment import check_env_id, convert_messages
from servers.sudoku.models import TextArenaMessage

__all__ = [
    "OpenEnvTextArenaAction",
    "OpenEnvTextArenaObservation",
    "OpenEnvTextArenaState",
    "OpenEnvStyleSudokuEnvironment",
    "create_openenv_style_app",
]

# As in OpenEnv: TextArena seeds and draws from the process-global RNG.
_RNG_LOCK = threading.Lock()


class OpenEnvTextArenaAction(Action):
    """Action issued by the agent for TextArena games."""

    message: str


class OpenEnvTextArenaObservation(Observation):
    """Observation returned from any TextArena game."""

    prompt: str
    messages: list[TextArenaMessage] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: list[int] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)


class OpenEnvTextArenaState(State):
    """Structured state snapshot for the server."""

    env_id: str
    num_players: int
    max_turns: int | None = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: dict[str, Any] = Field(default_factory=dict)
    raw_state: dict[str, Any] = Field(default_factory=dict)


class OpenEnvStyleSudokuEnvironment(Environment):  # type: ignore[type-arg]
    """OpenEnv's ``TextArenaEnvironment`` behaviour for a Sudoku variant (no reward providers:
    OpenEnv has none for Sudoku)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str = "Sudoku-v0") -> None:
        super().__init__()
        self.env_id = check_env_id(env_id)
        self._ta_env = ta.make(env_id=self.env_id)
        self._state = OpenEnvTextArenaState(env_id=self.env_id, num_players=1)
        self._reset_ta_env()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> OpenEnvTextArenaObservation:
        env: Any = self._ta_env
        while hasattr(env, "env"):
            if hasattr(env, "full_observations"):
                env.full_observations = {}
            env = env.env
        self._reset_ta_env(seed)
        self._state.episode_id = episode_id if episode_id is not None else str(uuid4())
        self._state.step_count = 0
        self._state.turn = 0
        self._state.last_reward = 0.0
        self._state.last_info = {}
        self._state.raw_state = self._snapshot_state()
        observation = self._build_observation()
        observation.reward = 0.0
        observation.done = False
        return observation

    def step(  # type: ignore[override]
        self, action: OpenEnvTextArenaAction, timeout_s: float | None = None, **kwargs: Any
    ) -> OpenEnvTextArenaObservation:
        with _RNG_LOCK:
            done, info = self._ta_env.step(action.message)
        self._state.step_count += 1
        self._state.turn = getattr(self._ta_env.state, "turn", self._state.turn + 1)
        self._state.last_info = info or {}
        observation = self._build_observation()
        observation.done = done
        rewards = getattr(self._ta_env.state, "rewards", None)
        reward = float(rewards[0]) if isinstance(rewards, dict) and 0 in rewards else 0.0
        observation.reward = reward
        self._state.last_reward = reward
        self._state.raw_state = self._snapshot_state()
        return observation

    @property
    def state(self) -> OpenEnvTextArenaState:
        return self._state

    def _reset_ta_env(self, seed: int | None = None) -> None:
        with _RNG_LOCK:
            if seed is None:
                self._ta_env.reset(num_players=1)
                return
            rng_state = random.getstate()
            try:
                self._ta_env.reset(num_players=1, seed=seed)
            finally:
                random.setstate(rng_state)

    def _build_observation(self) -> OpenEnvTextArenaObservation:
        player_id, messages = self._ta_env.get_observation()
        ta_messages = convert_messages(messages)
        prompt_lines = [m.content for m in ta_messages if m.category == "PROMPT"]
        if not prompt_lines:
            turn = getattr(self._ta_env.state, "turn", 0)
            prompt_lines = [ta_messages[0].content] if turn == 0 and ta_messages else [self.env_id]
        role_mapping = getattr(self._ta_env.state, "role_mapping", {}) or {}
        return OpenEnvTextArenaObservation(
            prompt="\n".join(prompt_lines).strip(),
            messages=ta_messages,
            current_player_id=player_id,
            legal_players=sorted(p for p in role_mapping if isinstance(p, int) and p >= 0),
            info=dict(getattr(self._ta_env.state, "step_info", {})),
            metadata={
                "env_id": self.env_id,
                "turn": getattr(self._ta_env.state, "turn", 0),
                "raw_messages": [m.model_dump() for m in ta_messages],
            },
        )

    def _snapshot_state(self) -> dict[str, Any]:
        state = self._ta_env.state
        return {
            "turn": getattr(state, "turn", 0),
            "game_state": getattr(state, "game_state", {}),
            "logs": list(getattr(state, "logs", [])),
            "rewards": getattr(state, "rewards", None),
            "done": getattr(state, "done", False),
            "role_mapping": getattr(state, "role_mapping", {}),
            "game_info": getattr(state, "game_info", {}),
            "step_info": getattr(state, "step_info", {}),
        }


def create_openenv_style_app(env_id: str = "Sudoku-v0", max_concurrent_envs: int = 8) -> FastAPI:
    """openenv's ``create_app`` serving `OpenEnvStyleSudokuEnvironment` (OpenEnv's default
    capacity for TextArena is 8 sessions)."""
    check_env_id(env_id)
    return create_app(
        lambda: OpenEnvStyleSudokuEnvironment(env_id),
        OpenEnvTextArenaAction,
        OpenEnvTextArenaObservation,
        env_name="TextArenaEnvironment",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=OpenEnvTextArenaState,
    )
