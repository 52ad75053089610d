"""FrozenLake's optional shaped rubric: its parts per step, on the wire, and per episode."""

from __future__ import annotations

from typing import Any

import pytest

from envsdk.adapters import env_app
from envsdk.client import EnvClient
from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import DIRECTIONS, FrozenLakeEnv, FrozenLakeGame, FrozenLakeRubric, shortest_path
from envsdk.rewards import part_names
from envsdk.schedulers import GYMScheduler
from envsdk.testing import running_server

pytestmark = pytest.mark.timeout(120)

SEED = 5


def _reply(direction: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": f"<action>{direction}</action>"}]


def _route(seed: int) -> list[str]:
    game = FrozenLakeGame.generate(seed=seed)
    path = shortest_path(game.grid, game.start, game.goal)
    assert path
    return path


async def _env(seed: int = SEED, **config: Any) -> FrozenLakeEnv:
    env = FrozenLakeEnv({"seed": seed, **config})
    await env.reset(RolloutRequest())
    return env


async def test_the_shortest_route_earns_all_the_progress_and_the_goal() -> None:
    env = await _env(rubric="shaped")
    route = _route(SEED)
    steps = [await env.step(_reply(d)) for d in route]
    parts = [info["reward_components"] for _, _, _, info in steps]
    assert list(parts[0]) == part_names(FrozenLakeRubric()) == ["goal", "progress", "format"]
    assert sum(p["progress"] for p in parts) == pytest.approx(1.0)
    assert all(p["progress"] == pytest.approx(1 / len(route)) for p in parts)
    assert [p["goal"] for p in parts] == [0.0] * (len(route) - 1) + [1.0]
    assert all(p["format"] == 1.0 for p in parts)
    # The 0/1 reward is untouched.
    assert [r for _, r, _, _ in steps] == [0.0] * (len(route) - 1) + [1.0]


async def test_a_hole_gives_back_the_progress_and_sloppy_replies_cost_format() -> None:
    for seed in range(200):
        game = FrozenLakeGame.generate(seed=seed)
        route = shortest_path(game.grid, game.start, game.goal)
        assert route
        # A first step of the route, then a step into a neighbouring hole.
        r, c = game.start[0] + DIRECTIONS[route[0]][0], game.start[1] + DIRECTIONS[route[0]][1]
        holes = [
            d for d, (dr, dc) in DIRECTIONS.items()
            if 0 <= r + dr < game.size and 0 <= c + dc < game.size and game.grid[r + dr][c + dc] == "H"
        ]
        if len(route) > 2 and holes:
            break
    else:
        pytest.fail("no map with a hole beside the route in 200 seeds")
    env = await _env(seed, rubric="shaped")
    _, _, _, first = await env.step(_reply(route[0]))
    _, _, _, junk = await env.step([{"role": "assistant", "content": "no idea"}])
    _, reward, done, fell = await env.step([{"role": "assistant", "content": f"I go {holes[0]}"}])
    assert first["reward_components"]["progress"] > 0
    assert junk["reward_components"] == {"goal": 0.0, "progress": 0.0, "format": 0.0}
    assert (reward, done) == (0.0, True)
    assert fell["reward_components"]["format"] == 0.5
    assert first["reward_components"]["progress"] + fell["reward_components"]["progress"] == pytest.approx(0.0)


async def test_without_the_option_there_is_no_rubric_and_a_bad_value_is_refused() -> None:
    env = await _env()
    _, _, _, info = await env.step(_reply(_route(SEED)[0]))
    assert "reward_components" not in info
    with pytest.raises(ValueError, match="rubric must be one of"):
        FrozenLakeEnv({"rubric": "fancy"})


async def test_parts_travel_on_the_wire_and_into_the_episode_record() -> None:
    route = _route(SEED)
    with running_server(env_app("frozen_lake")) as url:
        async with EnvClient(url) as client:
            await client.reset(env_config={"seed": SEED, "rubric": "shaped"})
            result = await client.step({"messages": _reply(route[0])})
    assert result.metadata["reward_components"] == result.observation["info"]["reward_components"]
    assert result.metadata["reward_components"]["progress"] == pytest.approx(1 / len(route))

    class Oracle:
        async def act(self, messages: list[dict[str, Any]]) -> str:
            turn = sum(1 for m in messages if m["role"] == "assistant")
            return f"<action>{route[turn]}</action>"

    [traj] = await GYMScheduler("frozen_lake").run(
        [RolloutRequest(data_dict={"env_config": {"seed": SEED, "rubric": "shaped"}})], Oracle()
    )
    assert traj.total_reward == 1.0
    assert traj.rollout_infos["reward_parts"] == pytest.approx({"goal": 1.0, "progress": 1.0, "format": len(route)})
    assert [s.components["progress"] for s in traj.steps] == pytest.approx([1 / len(route)] * len(route))
