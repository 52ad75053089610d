"""Where an episode's named reward parts go: the step records, ``rollout_infos``, the rollout
summary, ``completions.jsonl`` and ``envsdk report``, and the TRL reward functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeGame, FrozenLakeRubric, shortest_path
from envsdk.report import load_episodes
from envsdk.rewards import components_from, episode_parts
from envsdk.rewards.parts import non_finite
from envsdk.rollout import summarize
from envsdk.schedulers import GYMScheduler, Trajectory, TrajectoryWriter

pytestmark = pytest.mark.timeout(60)


class _RouteThenJunk:
    """A reply that names no move, then the map's shortest route."""

    def __init__(self, game: FrozenLakeGame) -> None:
        self.route = shortest_path(game.grid, game.start, game.goal) or []

    async def act(self, messages: list[dict[str, Any]]) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return "hmm" if turn == 0 else f"<action>{self.route[turn - 1]}</action>"


SEEDS = range(4)


async def _episodes() -> list[Trajectory]:
    trajectories = []
    for seed in SEEDS:
        [traj] = await GYMScheduler("frozen_lake", max_turns=20).run(
            [RolloutRequest(data_dict={"env_config": {"seed": seed, "rubric": "shaped"}})],
            _RouteThenJunk(FrozenLakeGame.generate(seed=seed)),
        )
        trajectories.append(traj)
    return trajectories


async def test_episode_parts_reach_records_summary_and_report(tmp_path: Path) -> None:
    trajectories = await _episodes()
    for traj in trajectories:
        route = _RouteThenJunk(FrozenLakeGame.generate(seed=traj.seed)).route
        assert traj.status == "done" and traj.total_reward == 1.0
        assert traj.rollout_infos["reward_parts"] == pytest.approx(
            {"goal": 1.0, "progress": 1.0, "format": float(len(route))}  # the junk reply scored 0
        )
        assert traj.steps[0].components == {"goal": 0.0, "progress": 0.0, "format": 0.0}
    summary = summarize(trajectories, elapsed_s=1.0)
    assert {"goal", "progress", "format"} <= set(summary.components)
    assert summary.components["progress"].mean == pytest.approx(1.0)
    path = tmp_path / "completions.jsonl"
    with TrajectoryWriter(path) as writer:
        for traj in trajectories:
            writer.write(traj)
    episodes = load_episodes(path)
    assert [e.components["format"] for e in episodes] == pytest.approx(
        [t.rollout_infos["reward_parts"]["format"] for t in trajectories]
    )


def test_components_field_is_checked() -> None:
    assert components_from({}) is None and components_from({"other": 1}) is None
    assert components_from({"reward_components": {"a": 1, "b": None}}) == {"a": 1.0, "b": None}
    for bad in ({"reward_components": [1]}, {"reward_components": {"a": "x"}}, {"reward_components": {"a": float("nan")}}):
        with pytest.raises(ValueError, match="reward_components"):
            components_from(bad)
    assert episode_parts([{"a": 1.0, "b": None}, {"a": 0.5, "b": None}]) == {"a": 1.5, "b": None}


@pytest.mark.parametrize(
    ("given", "parts"),
    [
        ({"a": 0.5, "b": -1.0}, {"a": 0.5, "b": -1.0}),  # floats only: taken as they are
        ({"a": 1e308, "b": 1e308}, {"a": 1e308, "b": 1e308}),  # finite, though their sum is not
        ({"a": 0.5, "b": 2}, {"a": 0.5, "b": 2.0}),
        ({"a": 0.5, 3: 1.0}, {"a": 0.5, "3": 1.0}),
        ({}, {}),
    ],
)
def test_components_are_floats_under_str_names(given: dict[object, object], parts: dict[str, float]) -> None:
    got = components_from({"reward_components": given})
    assert got == parts and all(type(name) is str and type(v) is float for name, v in (got or {}).items())


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), True, "0.5"])
def test_a_component_that_is_not_a_finite_number_is_refused_beside_good_ones(bad: object) -> None:
    with pytest.raises(ValueError, match=r"reward_components\['b'\] must be a finite number"):
        components_from({"reward_components": {"a": 0.5, "b": bad, "c": 1.0}})


class _Float(float):
    """A float subclass (numpy's float64 is one): not the plain floats the fast check takes."""


@pytest.mark.parametrize(
    ("reward", "parts", "problem"),
    [
        (0.5, {"a": 0.5, "b": -1.0}, None),  # plain floats: checked in C
        (1, {"a": 1e308, "b": 1e308}, None),  # finite, though their sum is not
        (None, {"a": None, "b": 2, "c": True}, None),
        (float("nan"), {"a": 0.5}, "a non-finite reward (nan)"),
        (_Float("inf"), None, "a non-finite reward (inf)"),
        (0.0, {"a": 0.5, "b": float("-inf")}, "a non-finite reward part 'b' (-inf)"),
        (0.0, {"a": None, "b": float("nan")}, "a non-finite reward part 'b' (nan)"),
        (0.0, {"a": _Float("nan")}, "a non-finite reward part 'a' (nan)"),
    ],
)
def test_non_finite_names_the_first_reward_or_part_that_is_not_finite(
    reward: object, parts: dict[str, object] | None, problem: str | None
) -> None:
    metadata = None if parts is None else {"reward_components": parts}
    assert non_finite(reward, metadata) == problem


def test_reward_component_funcs_take_a_rubric_or_names_and_read_reward_parts() -> None:
    pytest.importorskip("trl")
    from envsdk.integrations.trl import reward_component_funcs

    funcs = reward_component_funcs(FrozenLakeRubric())
    assert [f.__name__ for f in funcs] == ["goal", "progress", "format"]
    rows = [{"goal": 1.0, "progress": 0.5}, None, {}]
    assert [f([None] * 3, reward_parts=rows) for f in funcs] == [
        [1.0, None, 0.0],
        [0.5, None, 0.0],
        [0.0, None, 0.0],
    ]
    [custom] = reward_component_funcs(["code.syntax"])
    assert custom([None], reward_parts=[{"code.syntax": 0.25}]) == [0.25]
    with pytest.raises(ValueError, match="no reward part 'code.syntax'"):
        custom([None])


def test_environment_factory_instances_expose_the_parts_to_reward_functions() -> None:
    pytest.importorskip("trl")
    from envsdk.integrations.trl import (
        local_environment_factory,
        reward_component_funcs,
    )

    env = local_environment_factory("frozen_lake", max_turns=20)()
    env.reset(env_config={"seed": 5, "rubric": "shaped"})
    route = _RouteThenJunk(FrozenLakeGame.generate(seed=5)).route
    for direction in route:
        env.act(f"<action>{direction}</action>")
    assert env.get_reward() == 1.0
    columns = [f([None], environments=[env]) for f in reward_component_funcs(FrozenLakeRubric())]
    assert columns == [[1.0], [pytest.approx(1.0)], [float(len(route))]]


def test_rollout_cli_passes_env_config_and_summarises_the_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from envsdk.cli import main

    out = tmp_path / "c.jsonl"
    args = ["rollout", "--env", "frozen_lake", "--episodes", "4", "--no-progress", "--out", str(out)]
    assert main([*args, "--env-config", '{"rubric": "shaped"}']) == 0
    summary = capsys.readouterr().out
    assert all(f"\n  {name} " in summary for name in ("goal", "progress", "format"))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["reward_components"]["goal"]["value"] == 1.0 for r in records)
    assert all(set(r["reward_components"]) == {"goal", "progress", "format"} for r in records)
    assert all(len(c["steps"]) == len(r["step_rewards"]) for r in records for c in r["reward_components"].values())
    with pytest.raises(SystemExit):
        main([*args, "--env-config", "[1]"])
    assert "expected a JSON object" in capsys.readouterr().err
