"""FrozenLake: seeded maps, moves, rewards, action parsing, and the Env wrapper's contract."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from envsdk.adapters import env_app
from envsdk.client import EnvClient
from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import (
    INVALID_ACTION_MESSAGE,
    SYSTEM_MESSAGE,
    FrozenLakeEnv,
    FrozenLakeGame,
    parse_direction,
    shortest_path,
)
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.testing import running_server

REPO = Path(__file__).resolve().parents[1]


def _request(seed: int, **cfg: Any) -> RolloutRequest:
    return RolloutRequest(data_dict={"env_config": {"name": "frozen_lake", "seed": seed, **cfg}})


def _reply(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "map"}, {"role": "assistant", "content": text}]


def test_every_map_for_seeds_0_to_999_is_solvable() -> None:
    for seed in range(1000):
        game = FrozenLakeGame.generate(seed=seed)
        assert game.start != game.goal
        assert game.grid[game.start[0]][game.start[1]] == "S"
        assert game.grid[game.goal[0]][game.goal[1]] == "G"
        path = shortest_path(game.grid, game.start, game.goal)
        assert path, f"seed {seed} gave an unsolvable map:\n{game.render()}"


def test_following_the_shortest_path_reaches_the_goal_with_reward_one() -> None:
    for seed in range(50):
        game = FrozenLakeGame.generate(size=5, p=0.7, seed=seed)
        path = shortest_path(game.grid, game.start, game.goal)
        assert path is not None
        outcomes = [game.move(move) for move in path]
        assert [o.kind for o in outcomes[:-1]] == ["moved"] * (len(path) - 1)
        assert (outcomes[-1].kind, outcomes[-1].reward, outcomes[-1].done) == ("goal", 1.0, True)
        assert game.position == game.goal


def test_map_parameters_are_honoured() -> None:
    game = FrozenLakeGame.generate(size=7, p=1.0, seed=3)
    assert len(game.grid) == 7 and all(len(row) == 7 for row in game.grid)
    assert "H" not in "".join(game.grid)
    assert sum(row.count("S") + row.count("G") for row in game.grid) == 2


@pytest.mark.parametrize("size, p", [(1, 0.8), (4, 0.0), (4, 1.5)])
def test_invalid_map_parameters_are_rejected(size: int, p: float) -> None:
    with pytest.raises(ValueError):
        FrozenLakeGame.generate(size=size, p=p, seed=0)


def test_map_generation_leaves_the_global_random_untouched() -> None:
    import random

    before = random.getstate()
    FrozenLakeGame.generate(seed=5)
    assert random.getstate() == before


def test_different_seeds_give_different_maps() -> None:
    maps = {(FrozenLakeGame.generate(seed=s).grid) for s in range(40)}
    assert len(maps) > 30


@pytest.mark.timeout(60)
def test_same_seed_gives_the_same_map_in_separate_processes() -> None:
    code = (
        "import json; from envsdk.envs.frozen_lake import FrozenLakeGame as G;"
        "print(json.dumps([[list(g.grid), g.start, g.goal] for g in (G.generate(seed=s) for s in range(20))]))"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True,
            env={"PYTHONHASHSEED": str(hash_seed), "PATH": ""},
        ).stdout
        for hash_seed in (1, 2)
    ]
    here = [[list(g.grid), list(g.start), list(g.goal)] for g in (FrozenLakeGame.generate(seed=s) for s in range(20))]
    assert json.loads(outputs[0]) == json.loads(outputs[1]) == here


def test_off_grid_moves_stay_put() -> None:
    game = FrozenLakeGame(["SF", "FG"], start=(0, 0), goal=(1, 1))
    for direction in ("up", "left"):
        outcome = game.move(direction)
        assert (outcome.kind, outcome.position, outcome.done) == ("blocked", (0, 0), False)


def test_hole_ends_the_game_with_reward_zero() -> None:
    game = FrozenLakeGame(["SH", "FG"], start=(0, 0), goal=(1, 1))
    outcome = game.move("right")
    assert (outcome.kind, outcome.reward, outcome.done) == ("hole", 0.0, True)
    with pytest.raises(RuntimeError):
        game.move("down")


def test_render_marks_the_player_and_hides_nothing_else() -> None:
    game = FrozenLakeGame(["SF", "HG"], start=(0, 0), goal=(1, 1))
    assert game.render() == "P F\nH G"
    game.move("right")
    assert game.render() == "S P\nH G"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<action>up</action>", "up"),
        ("I think <action> Left </action> is best", "left"),
        ("<action>up</action> no wait <action>down</action>", "down"),
        ("first left, then maybe right", "right"),
        ("<action>down</action> although right looks good", "down"),
        ("Upwards is not a word we parse; upright neither", None),
        ("", None),
    ],
)
def test_parse_direction_prefers_the_last_tag_then_the_last_word(text: str, expected: str | None) -> None:
    assert parse_direction(text) == expected


async def test_env_reset_returns_map_info_and_system_message() -> None:
    env = FrozenLakeEnv()
    observation, info, system = await env.reset(_request(7))
    assert env.game is not None
    assert env.game.render() in observation
    assert info == {"position": list(env.game.start), "goal": list(env.game.goal)}
    assert system == SYSTEM_MESSAGE and "<action>" in system


async def test_env_config_from_the_row_overrides_the_constructor() -> None:
    env = FrozenLakeEnv({"size": 4, "seed": 1})
    await env.reset(_request(2, size=6))
    assert env.game is not None and env.game.size == 6
    assert env.game.grid == FrozenLakeGame.generate(size=6, seed=2).grid


async def test_fixed_map_is_played_whatever_the_seed() -> None:
    env = FrozenLakeEnv({"map": "SFH/FFF/HFG"})
    grids = set()
    for seed in range(5):
        observation, info, _ = await env.reset(_request(seed, size=6))
        assert env.game is not None
        grids.add(env.game.grid)
        assert "P F H\nF F F\nH F G" in observation and info["goal"] == [2, 2]
    assert grids == {("SFH", "FFF", "HFG")}
    for move in ("right", "down", "down"):
        assert (await env.step(_reply(f"<action>{move}</action>")))[1:3] == (0.0, False)
    assert (await env.step(_reply("<action>right</action>")))[1:3] == (1.0, True)
    assert FrozenLakeGame.from_map(["sfh", "fff", "hfg"]).grid == ("SFH", "FFF", "HFG")


@pytest.mark.parametrize(
    "layout, problem",
    [
        ("SF/FFG", "square"),
        ("S", "square"),
        ("SFX/FFF/HFG", "only S, F, H and G"),
        ("SFF/FSF/FFG", "exactly one S and one G"),
        ("SFF/FFF/FFF", "exactly one S and one G"),
        ("SHF/HHF/FFG", "no path"),
        (["SF", 3], "rows of text"),
    ],
)
async def test_bad_fixed_maps_are_refused_with_the_reason(layout: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        await FrozenLakeEnv({"map": layout}).reset(_request(0))


async def test_env_plays_the_oracle_path_to_reward_one() -> None:
    env = FrozenLakeEnv()
    await env.reset(_request(11))
    assert env.game is not None
    path = shortest_path(env.game.grid, env.game.position, env.game.goal)
    assert path
    results = [await env.step(_reply(f"<action>{move}</action>")) for move in path]
    assert [r[1:3] for r in results] == [(0.0, False)] * (len(path) - 1) + [(1.0, True)]
    assert results[-1][3]["outcome"] == "goal"


async def test_unparseable_reply_gets_instructions_and_no_move() -> None:
    env = FrozenLakeEnv()
    await env.reset(_request(3))
    assert env.game is not None
    before = env.game.position
    text, reward, done, info = await env.step(_reply("I am not sure."))
    assert (text, reward, done, info["outcome"]) == (INVALID_ACTION_MESSAGE, 0.0, False, "invalid")
    assert env.game.position == before


async def test_step_after_done_is_refused() -> None:
    env = FrozenLakeEnv()
    await env.reset(_request(11))
    assert env.game is not None
    for move in shortest_path(env.game.grid, env.game.position, env.game.goal) or []:
        await env.step(_reply(move))
    with pytest.raises(EpisodeDoneError):
        await env.step(_reply("<action>up</action>"))


async def test_step_before_reset_is_refused_and_close_is_idempotent() -> None:
    env = FrozenLakeEnv()
    with pytest.raises(NotResetError):
        await env.step(_reply("up"))
    await env.close()
    await env.close()


def test_example_dataset_has_128_rows_with_seeds_0_to_127() -> None:
    lines = (REPO / "examples" / "data" / "frozen_lake.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows == [
        {"messages": [{"role": "user", "content": "<placeholder>"}], "env_config": {"name": "frozen_lake", "seed": i}}
        for i in range(128)
    ]


@pytest.mark.parametrize("cfg", [{"size": 65}, {"size": 100_000}, {"map": "/".join(["SG" + "F" * 63] + ["F" * 65] * 64)}])
async def test_a_map_above_the_size_bound_is_refused_with_the_bound(cfg: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="<= 64"):
        await FrozenLakeEnv().reset(_request(1, **cfg))


async def test_the_largest_map_is_played() -> None:
    env = FrozenLakeEnv({"rubric": "shaped"})
    observation, _, _ = await env.reset(_request(1, size=64))
    assert env.game is not None and env.game.size == 64 and len(observation) < 10_000
    await env.step(_reply("<action>up</action>"))


def _metrics(base_url: str) -> str:
    return str(urllib.request.urlopen(base_url + "/metrics", timeout=5).read().decode())


def _lane_calls(metrics: str) -> int:
    """The server's count of env calls run on lane threads (``envsdk_lane_calls_total``)."""
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in metrics.splitlines() if line.startswith("envsdk_lane_calls_total{"))


@pytest.mark.timeout(30)
def test_served_reset_and_step_play_the_game_off_the_event_loop() -> None:
    # Served, FrozenLake's reset and step (a 64x64 map) run on the session's lane thread, under
    # the server's deadlines: the server counts them as lane calls, and none held its loop.
    row = {"data_dict": {"env_config": {"size": 64, "rubric": "shaped"}}}

    async def episode(url: str) -> tuple[int, Any, Any]:
        async with EnvClient(url) as client:
            await client.reset(seed=3, **row)  # builds the session's env too
            before = _lane_calls(await asyncio.to_thread(_metrics, url))
            first = await client.reset(seed=3, **row)
            step = await client.step({"messages": _reply("<action>left</action>")})
            return _lane_calls(await asyncio.to_thread(_metrics, url)) - before, first, step

    with running_server(env_app("frozen_lake")) as url:
        lane_calls, first, step = asyncio.run(episode(url))
        metrics = _metrics(url)
    assert lane_calls == 2
    assert len(first.observation["text"].splitlines()) == 1 + 64 + 1  # "Here is the map:", 64 rows, the question
    assert step.observation["info"]["action"] == "left"
    assert "envsdk_loop_stalls_total{" not in metrics
