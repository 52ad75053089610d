"""The ``envsdk_tools`` ms-swift scheduler: a tool environment (the ledger example, envsdk
``@tool`` methods served over MCP) played through ms-swift's server-mode rollout loop, its tools
discovered at reset and its reward read from the environment's state."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.rollout import multi_turns

from envsdk.policies import Policy
from envsdk.testing import running_server

from .conftest import active_sessions
from .engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)


class LedgerPlayer(Policy):
    """Brings the ledger to its target with one tool call, then stops calling tools."""

    def __init__(self, detour: bool = False) -> None:
        self.detour = detour
        self.systems: list[str] = []

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if messages and messages[0]["role"] == "system":
            self.systems.append(messages[0]["content"])
        replies = [m for m in messages if m["role"] == "assistant"]
        first = messages[1]["content"]
        start, target = (int(n) for n in re.findall(r"\d+", first)[:2])
        if self.detour and not replies:
            return '<tool_call>{"name": "deposit", "arguments": {"amount": 5}}</tool_call>'
        balance = start + (5 if self.detour else 0)
        if replies and "tool_call" in replies[-1]["content"] and (not self.detour or len(replies) > 1):
            return "Done."
        name, amount = ("deposit", target - balance) if target > balance else ("withdraw", balance - target)
        if amount == 0:
            return "Done."
        return f'<tool_call>{json.dumps({"name": name, "arguments": {"amount": amount}})}</tool_call>'


def _ledger(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(0, 20) * 5, rng.randint(0, 20) * 5


@pytest.fixture(scope="module")
def ledger_url() -> Iterator[str]:
    from examples.ledger_tools import create_ledger_app

    with running_server(create_ledger_app(max_concurrent_envs=8)) as url:
        yield url


async def test_tool_scheduler_discovers_tools_and_scores_from_the_state(
    sudoku_plugin: ModuleType, ledger_url: str, tokenizer: Any
) -> None:
    seed = next(s for s in range(100) if _ledger(s)[0] != _ledger(s)[1])
    player = LedgerPlayer()
    scheduler = multi_turns["envsdk_tools"](infer_engine=ScriptedEngine(player, tokenizer), max_turns=4, use_gym_env=True)
    request = RolloutInferRequest(
        messages=[{"role": "user", "content": "Balance the ledger."}],
        data_dict={"env_config": {"base_url": ledger_url, "seed": seed}},
    )
    output = await scheduler.run(request, RequestConfig(max_tokens=32))

    infos = output.rollout_infos
    assert infos["status"] == "done" and infos["reason"] == "no tool call"
    assert infos["total_reward"] == 1.0  # the ledger's own state says the target was reached
    assert all(name in player.systems[0] for name in ("deposit", "withdraw", "balance"))
    assert scheduler.open_trajectories == 0
    assert active_sessions(ledger_url) == 0


async def test_an_episode_that_misses_the_target_scores_zero(
    sudoku_plugin: ModuleType, ledger_url: str, tokenizer: Any
) -> None:
    seed = next(s for s in range(100) if _ledger(s)[1] != _ledger(s)[0] + 5)
    # One detour deposit, then stop: the balance is off by the detour unless it hit the target.
    player = LedgerPlayer(detour=True)
    scheduler = multi_turns["envsdk_tools"](infer_engine=ScriptedEngine(player, tokenizer), max_turns=1)
    request = RolloutInferRequest(
        messages=[{"role": "user", "content": "Balance the ledger."}],
        data_dict={"env_config": {"base_url": ledger_url, "seed": seed}},
    )
    output = await scheduler.run(request, RequestConfig(max_tokens=32))
    assert output.rollout_infos["status"] == "max_turns"
    assert output.rollout_infos["total_reward"] == 0.0
    assert active_sessions(ledger_url) == 0
