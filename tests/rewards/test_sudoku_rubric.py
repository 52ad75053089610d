"""The Sudoku server's shaped-reward rubric against the scheduler's own computation.

64 episodes on a real Sudoku server, each played by a scripted policy that makes mistakes
(overwrites, wrong digits, repeats, moves off the board) between good moves: once with the
server computing the five parts (``rubric="shaped"``, the scheduler using them) and once with
the scheduler computing them itself. Every step's parts must be equal, bit for bit.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import pytest

from envsdk.env import RolloutRequest
from envsdk.games.sudoku import parse_board, solve
from envsdk.schedulers import SudokuScheduler, Trajectory
from envsdk.schedulers.sudoku import SUDOKU_COMPONENTS
from envsdk.testing import running_server

pytestmark = pytest.mark.timeout(600)

EPISODES = 64
KINDS = ["good"] * 5 + ["filled", "wrong", "repeat", "offboard"]


@pytest.fixture(scope="module")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=64)) as url:
        yield url


class MistakePolicy:
    """Deterministic in the conversation alone (so both runs play the same moves): the kind of
    each move is drawn from a generator seeded by the first board and the turn."""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        users = [m["content"] for m in messages if m["role"] == "user"]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        digest = hashlib.sha256(f"{users[0]}|{len(replies)}".encode()).digest()
        kind = random.Random(digest).choice(KINDS)
        board = parse_board(users[-1])
        assert board is not None
        empty = [(r, c) for r in range(9) for c in range(9) if board[r][c] == 0]
        if kind == "repeat" and replies:
            return replies[-1]
        if kind == "offboard":
            return "[10 1 5]"
        if kind == "filled":
            r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c])
            return f"[{r + 1} {c + 1} {board[r][c]}]"
        solution = solve(board)
        assert solution is not None and empty
        r, c = empty[len(replies) % len(empty)]
        digit = solution[r][c] if kind != "wrong" else solution[r][c] % 9 + 1
        return f"Placing [{r + 1} {c + 1} {digit}]"


def _rows(url: str) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": 1000 + i}}) for i in range(EPISODES)]


async def _play(url: str, server_rewards: bool) -> list[Trajectory]:
    scheduler = SudokuScheduler(max_turns=30, max_concurrent_envs=16, server_rewards=server_rewards)
    return await scheduler.run(_rows(url), MistakePolicy())


async def test_server_rubric_parts_equal_the_schedulers_for_every_step(sudoku_url: str) -> None:
    served = await _play(sudoku_url, server_rewards=True)
    computed = await _play(sudoku_url, server_rewards=False)
    steps = differences = 0
    for ours, theirs in zip(served, computed, strict=True):
        assert ours.status != "error" and theirs.status != "error", (ours.reason, theirs.reason)
        assert [s.action for s in ours.steps] == [s.action for s in theirs.steps]
        for mine, own in zip(ours.steps, theirs.steps, strict=True):
            steps += 1
            assert mine.info["reward_source"] == "server" and own.info["reward_source"] == "scheduler"
            wire = mine.info["frame_metadata"]["reward_components"]
            # The server's parts as sent, and as the scheduler kept them, against its own: exact.
            differences += sum(wire[name] != own.components[name] for name in SUDOKU_COMPONENTS)
            differences += sum(mine.components[name] != own.components[name] for name in [*SUDOKU_COMPONENTS, "total"])
        assert ours.total_reward == theirs.total_reward
        assert ours.rollout_infos["reward_parts"] == theirs.rollout_infos["reward_parts"]
    assert differences == 0
    assert steps >= EPISODES * 3
    # The scripts did make every kind of mistake the reward distinguishes.
    parts = [s.components for t in computed for s in t.steps]
    assert any(p["valid_move"] == -0.5 for p in parts)
    assert any(p["repetition"] < 0 for p in parts)
    assert any(p["empty_cell"] == -1.0 for p in parts)
    assert any(p["valid_move"] == 1.0 for p in parts)
    assert any(t.reason and "game lost" in t.reason for t in computed)


async def test_a_server_without_the_rubric_option_leaves_the_scheduler_computing(sudoku_url: str) -> None:
    from servers.sudoku.openenv_style import create_openenv_style_app

    with running_server(create_openenv_style_app(max_concurrent_envs=4)) as url:
        scheduler = SudokuScheduler(max_turns=5)
        [traj] = await scheduler.run(_rows(url)[:1], MistakePolicy())
    assert traj.status != "error" and traj.steps
    assert all(s.info["reward_source"] == "scheduler" for s in traj.steps)
    assert set(traj.rollout_infos["reward_parts"]) == set(SUDOKU_COMPONENTS)


async def test_unknown_rubric_option_is_refused(sudoku_url: str) -> None:
    from envsdk.client import EnvClient
    from envsdk.errors import ServerError

    async with EnvClient(sudoku_url) as env:
        with pytest.raises(ServerError, match="rubric must be one of shaped"):
            await env.reset(seed=1, rubric="fancy")
