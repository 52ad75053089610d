"""envsdk's reward parts as ms-swift reward columns: the ``reward_parts.py`` plugin's ORMs,
scored by ms-swift's own ``score_completions`` on rollouts the ``envsdk_sudoku`` scheduler
played against a real Sudoku server that computes the parts (the server-side rubric)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.rewards import orms
from swift.rl_core.data import GRPOSample
from swift.rl_core.grpo_algorithm import score_completions
from swift.rollout import multi_turns

from envsdk.policies import SudokuOraclePolicy

from .conftest import load_plugin
from .engine import ReplyScript, ScriptedEngine

pytestmark = pytest.mark.timeout(90)

PARTS = ("empty_cell", "valid_move", "repetition", "progress", "correct")


@pytest.fixture(scope="module")
def parts_plugin() -> ModuleType:
    return load_plugin("reward_parts.py")


def test_plugin_registers_one_orm_per_part_and_more_on_request(parts_plugin: ModuleType) -> None:
    for name in (*PARTS, "goal", "format"):
        assert orms[f"envsdk_part_{name}"]().part == name
    assert parts_plugin.register_reward_parts(["steps_left"]) == ["envsdk_part_steps_left"]
    assert orms["envsdk_part_steps_left"]()(["x"], rollout_infos=[{"reward_parts": {"steps_left": 3}}]) == [3.0]
    # A rollout without the part is left out (None → NaN in ms-swift), never scored 0.
    assert orms["envsdk_part_goal"]()(["x", "y"], rollout_infos=[{}, {"reward_parts": {"goal": 1.0}}]) == [None, 1.0]


async def test_sudoku_rollouts_give_one_column_per_part_beside_the_gym_reward(
    parts_plugin: ModuleType, sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    scheduler = multi_turns["envsdk_sudoku"](
        infer_engine=ScriptedEngine(SudokuOraclePolicy(), tokenizer), max_turns=6, use_gym_env=True
    )
    mistakes = multi_turns["envsdk_sudoku"](
        infer_engine=ScriptedEngine(ReplyScript(["[1 1 1]", "[1 1 1]", "[9 9 9]"]), tokenizer), max_turns=3
    )
    outputs = []
    for sched, seed in ((scheduler, 5), (mistakes, 6)):
        request = RolloutInferRequest(
            messages=[{"role": "user", "content": "Play Sudoku."}],
            data_dict={"env_config": {"base_url": sudoku_url, "seed": seed}},
        )
        outputs.append(await sched.run(request, RequestConfig(max_tokens=16)))
    infos = [o.rollout_infos for o in outputs]
    for i in infos:
        # The server computed the parts (its rubric), and every one has a value for the column.
        assert set(PARTS) <= set(i["reward_parts"]), "the server's rubric parts did not reach rollout_infos"
        assert all(parts_plugin.part_value(i, name) is not None for name in PARTS)

    samples = [GRPOSample(messages=o.messages, rollout_infos=o.rollout_infos) for o in outputs]
    funcs = [orms[f"envsdk_part_{name}"]() for name in PARTS]
    columns = score_completions(
        samples, reward_funcs=funcs, reward_model_plugins=None, use_gym_env=True, device=torch.device("cpu")
    )
    assert columns.shape == (2, len(PARTS) + 1)
    for row, info in zip(columns.tolist(), infos):
        expected = [parts_plugin.part_value(info, name) for name in PARTS]
        assert row[:-1] == pytest.approx(expected)
        assert row[-1] == pytest.approx(info["total_reward"])  # ms-swift's gym column, last
    # The oracle's parts and the mistaken player's differ: the columns carry the episodes' values.
    assert columns[0, :-1].tolist() != columns[1, :-1].tolist()
