"""An example plugin, written the way a user's plugin is: a file outside the package that
registers environments by name when it is imported.

    envsdk check-env frozen_lake_slippery --external-plugins examples/frozen_lake_plugin.py

registers two environments:

* ``frozen_lake_slippery`` — FrozenLake on ice: with probability ``slip`` (default 0.2) a move
  goes in a random perpendicular direction instead. The slip is drawn from the episode's own
  ``random.Random(seed)``, so a seed still fixes the whole episode.
* ``frozen_lake_8x8`` — the built-in FrozenLake with an 8x8 map unless ``size`` says otherwise.
"""

from __future__ import annotations

import random
from typing import Any

from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv, parse_direction
from envsdk.registry import envs

_PERPENDICULAR = {
    "up": ("left", "right"),
    "down": ("left", "right"),
    "left": ("up", "down"),
    "right": ("up", "down"),
}


class SlipperyFrozenLakeEnv(FrozenLakeEnv):
    """FrozenLake where a move slips sideways with probability ``env_config["slip"]``."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(env_config)
        self.slip = float(self.env_config.get("slip", 0.2))
        self.slip_rng = random.Random()

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        cfg = {**self.env_config, **config.env_config}
        self.slip = float(cfg.get("slip", 0.2))
        # A stream of its own, seeded from the map's seed: the same seed gives the same slips.
        seed = cfg.get("seed")
        self.slip_rng = random.Random(None if seed is None else f"slip-{seed}")
        observation, info, system = await super().reset(config)
        system = f"{system}\nThe ice is slippery: a move may slip sideways ({self.slip:.0%} of the time)."
        return observation, info, system

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        direction = parse_direction(str(messages[-1].get("content", ""))) if messages else None
        if direction is not None and self.game is not None and self.slip_rng.random() < self.slip:
            slipped = self.slip_rng.choice(_PERPENDICULAR[direction])
            messages = [*messages[:-1], {**messages[-1], "content": f"<action>{slipped}</action>"}]
        return await super().step(messages)


class FrozenLake8x8Env(FrozenLakeEnv):
    """The built-in FrozenLake on an 8x8 map by default."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__({"size": 8, **(env_config or {})})


envs["frozen_lake_slippery"] = SlipperyFrozenLakeEnv
envs["frozen_lake_8x8"] = FrozenLake8x8Env
