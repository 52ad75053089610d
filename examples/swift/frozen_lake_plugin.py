"""ms-swift plugin: envsdk's FrozenLake as an ms-swift GYM environment.

Load it with ``--external_plugins examples/swift/frozen_lake_plugin.py``; it registers
``frozen_lake`` in ms-swift's ``swift.rollout.envs``, for ms-swift's own ``gym_scheduler``::

    swift rollout ... --external_plugins examples/swift/frozen_lake_plugin.py \\
        --multi_turn_scheduler gym_scheduler --gym_env frozen_lake --max_turns 10

The game is envsdk's `FrozenLakeEnv` (seeded solvable maps, ``<action>up|down|left|right
</action>`` replies, reward 1 at the goal); `EnvsdkEnvAdapter` serves any envsdk local `Env`
class through ms-swift's `Env` interface. Row ``env_config``: ``name`` (``frozen_lake``),
``size`` (4), ``p`` (0.8, probability of safe ice), ``seed`` (one map per seed, so a GRPO group
of the same row shares a map).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from swift.infer_engine.protocol import RolloutInferRequest
from swift.rollout import Env, envs

from envsdk.env import Env as EnvsdkEnv
from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv

__all__ = ["EnvsdkEnvAdapter", "FrozenLakeSwiftEnv"]


def _without_nones(config: Any) -> dict[str, Any]:
    # A `datasets` column of dicts gives every row every key seen in any row, None where it had
    # none; dropping the Nones restores "key absent: use the default".
    return {k: v for k, v in config.items() if v is not None} if isinstance(config, dict) else {}


class EnvsdkEnvAdapter(Env):
    """An envsdk local `Env` (class attribute `envsdk_env_class`) behind ms-swift's `Env`.

    ms-swift resets with its `RolloutInferRequest`; the envsdk env gets an envsdk
    `RolloutRequest` with the same messages, ``data_dict`` and uuid (``env_config`` cleaned of
    None values). ``step`` and ``close`` are passed through; `inner` is the envsdk env.
    """

    envsdk_env_class: ClassVar[type[EnvsdkEnv]]

    def __init__(self, env_config: dict[str, Any] | None) -> None:
        config = _without_nones(env_config)
        super().__init__(config)
        self.inner: EnvsdkEnv = self.envsdk_env_class(config)

    async def reset(self, config: RolloutInferRequest) -> tuple[str, dict[str, Any], str]:
        data_dict = dict(config.data_dict or {})
        data_dict["env_config"] = _without_nones(data_dict.get("env_config"))
        request = RolloutRequest(
            messages=[dict(m) for m in config.messages], data_dict=data_dict, uuid=config.uuid or uuid.uuid4().hex
        )
        observation, info, system_message = await self.inner.reset(request)
        return observation, info, system_message or ""

    async def step(self, action: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        return await self.inner.step(action)

    async def close(self) -> None:
        await self.inner.close()


class FrozenLakeSwiftEnv(EnvsdkEnvAdapter):
    """envsdk's `FrozenLakeEnv` in ms-swift's GYM registry."""

    envsdk_env_class = FrozenLakeEnv


envs["frozen_lake"] = FrozenLakeSwiftEnv
