"""The ``frozen_lake`` plugin environment inside ms-swift's own ``gym_scheduler``, played by
envsdk's FrozenLake oracle through ms-swift's server-mode rollout loop."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.rollout import Env, envs, multi_turns

from envsdk.envs.frozen_lake import SYSTEM_MESSAGE, FrozenLakeGame, shortest_path
from envsdk.policies import FrozenLakeOraclePolicy

from .engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)


def _request(**env_config: Any) -> RolloutInferRequest:
    return RolloutInferRequest(
        messages=[{"role": "user", "content": "<placeholder>"}], data_dict={"env_config": env_config}
    )


def _gym_scheduler(engine: ScriptedEngine | None, max_turns: int) -> Any:
    # Built the way `swift rollout --multi_turn_scheduler gym_scheduler --gym_env frozen_lake` builds it.
    return multi_turns["gym_scheduler"](
        infer_engine=engine, max_turns=max_turns, use_gym_env=True, gym_env="frozen_lake"
    )


def test_plugin_registers_frozen_lake_in_ms_swift_envs(frozen_lake_plugin: ModuleType) -> None:
    assert envs["frozen_lake"] is frozen_lake_plugin.FrozenLakeSwiftEnv
    assert issubclass(envs["frozen_lake"], Env)
    env = _gym_scheduler(None, 10)._create_env({"name": "frozen_lake", "seed": 1})
    assert isinstance(env, frozen_lake_plugin.FrozenLakeSwiftEnv)


async def test_gym_scheduler_reaches_the_goal_with_the_oracle(frozen_lake_plugin: ModuleType, tokenizer: Any) -> None:
    engine = ScriptedEngine(FrozenLakeOraclePolicy(), tokenizer)
    scheduler = _gym_scheduler(engine, 10)
    # No `name`: --gym_env applies. `size`/`p` None, as a `datasets` struct column gives them.
    output = await scheduler.run(_request(seed=4, size=None, p=None), RequestConfig(max_tokens=16))

    game = FrozenLakeGame.generate(size=4, p=0.8, seed=4)
    path = shortest_path(game.grid, game.start, game.goal)
    assert path
    infos = output.rollout_infos
    assert infos["gym_done"] and infos["total_reward"] == 1.0
    assert infos["step_rewards"] == [0.0] * (len(path) - 1) + [1.0]
    assert infos["num_turns"] == len(path)
    assert output.messages[0] == {"role": "system", "content": SYSTEM_MESSAGE}
    assert game.render() in output.messages[1]["content"]
    assert output.messages[-1]["content"] == f"<action>{path[-1]}</action>"
    assert scheduler._envs == {}  # closed and released on done


async def test_one_seed_gives_a_grpo_group_one_map(frozen_lake_plugin: ModuleType) -> None:
    scheduler = _gym_scheduler(None, 10)
    group = [_request(name="frozen_lake", seed=11) for _ in range(3)] + [_request(name="frozen_lake", seed=12)]
    await scheduler.on_trajectory_start(group)
    first = [r.messages[-1]["content"] for r in group]
    assert first[0] == first[1] == first[2] != first[3]
    for request in group:
        await scheduler._close_and_remove(request.uuid)
