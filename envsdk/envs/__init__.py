"""Built-in local environments (ms-swift-style `Env` classes).

They are registered in `envsdk.registry.envs` by name without importing this package:
``envs["frozen_lake"]`` loads `FrozenLakeEnv` on first use.
"""

from __future__ import annotations

from envsdk.envs.frozen_lake import FrozenLakeEnv, FrozenLakeGame, shortest_path

__all__ = ["FrozenLakeEnv", "FrozenLakeGame", "shortest_path"]
