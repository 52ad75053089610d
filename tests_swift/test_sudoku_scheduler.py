"""The ``envsdk_sudoku`` ms-swift scheduler against a real envsdk Sudoku server on 127.0.0.1,
driven by ms-swift's own rollout loops: server mode (``MultiTurnScheduler.run``, what ``swift
rollout`` runs per request) and colocate mode (``invoke_async_hook`` + ``run_multi_turn``, what
``swift rlhf --vllm_mode colocate`` runs). The engine is scripted by envsdk's oracle policy."""

from __future__ import annotations

import asyncio
import json
from types import ModuleType
from typing import Any

import pytest
from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.rollout import MultiTurnScheduler, invoke_async_hook, multi_turns, run_multi_turn

from envsdk.policies import Policy, SudokuOraclePolicy
from envsdk.schedulers import SUDOKU_SYSTEM_MESSAGE
from envsdk.testing import free_port

from .conftest import active_sessions
from .engine import ReplyScript, ScriptedEngine

pytestmark = pytest.mark.timeout(60)

CONFIG = RequestConfig(max_tokens=16, temperature=0.0)


def _request(url: str, seed: int, **env_config: Any) -> RolloutInferRequest:
    return RolloutInferRequest(
        messages=[{"role": "user", "content": "Play Sudoku."}],
        data_dict={"env_config": {"base_url": url, "seed": seed, **env_config}},
    )


def _scheduler(engine: ScriptedEngine | None, max_turns: int | None, **kwargs: Any) -> Any:
    # Built the way `swift rollout` builds it (get_rollout_engine_type).
    return multi_turns["envsdk_sudoku"](infer_engine=engine, max_turns=max_turns, **kwargs)


def test_plugin_registers_the_scheduler_in_ms_swift_multi_turns(sudoku_plugin: ModuleType) -> None:
    cls = multi_turns["envsdk_sudoku"]
    assert cls is sudoku_plugin.EnvsdkSudokuScheduler
    assert issubclass(cls, MultiTurnScheduler)
    # The trainer's colocate path builds it with other keywords than `swift rollout` does.
    scheduler = cls(max_turns=7, tokenizer=None, template=None, gym_env=None)
    assert scheduler.max_turns == 7 and scheduler.core.max_turns == 7


async def test_server_mode_run_solves_a_game_and_closes_its_session(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    engine = ScriptedEngine(SudokuOraclePolicy(), tokenizer)
    scheduler = _scheduler(engine, 100, use_gym_env=True, gym_env=None)
    # A `datasets` struct column gives missing keys as None: the default system message stays.
    output = await scheduler.run(_request(sudoku_url, 3, system_message=None), CONFIG)

    infos = output.rollout_infos
    assert infos["status"] == "done" and infos["reason"] == "solved" and infos["success"] and infos["gym_done"]
    assert infos["total_reward"] == pytest.approx(4.0)
    assert infos["correct"] == 1.0 and infos["progress"] == 1.0 and infos["valid_move"] == 1.0
    assert infos["empty_cell"] == 1.0 and infos["repetition"] == 0.0 and infos["format_penalty"] == 0.0
    assert infos["step_rewards"][-1] == 1.0 and sum(infos["step_rewards"]) == 1.0
    assert infos["num_turns"] == infos["cells_filled"] == len(infos["step_rewards"]) >= 15
    assert infos["reward_parts"] == {name: infos[name] for name in ("empty_cell", "valid_move", "repetition", "progress", "correct")}
    json.dumps(infos)  # ms-swift requires rollout_infos to be JSON-serialisable

    messages = output.messages
    assert messages[0] == {"role": "system", "content": SUDOKU_SYSTEM_MESSAGE}
    # The default hints give no move of the solution (ENVSDK_SUDOKU_HINTS=all gives ms-swift's).
    assert "Current Sudoku board" in messages[1]["content"] and "GUARANTEED MOVES" not in messages[1]["content"]
    assert "Play Sudoku." not in messages[1]["content"]
    assert messages[3]["role"] == "user" and messages[3]["content"].startswith("Step 1. Progress: 1 cells filled.")
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * infos["num_turns"]
    assert len(output.response_token_ids) == infos["num_turns"]  # one token segment per reply
    assert scheduler.open_trajectories == 0
    assert active_sessions(sudoku_url) == 0


def test_colocate_mode_sessions_outlive_ms_swift_short_lived_event_loops(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    engine = ScriptedEngine(SudokuOraclePolicy(), tokenizer)
    # Built the way the GRPO trainer builds it in colocate mode (_prepare_scheduler).
    scheduler = multi_turns["envsdk_sudoku"](max_turns=3, tokenizer=tokenizer, template=None)
    requests = [_request(sudoku_url, seed) for seed in (1, 2)]
    # ms-swift resets on one event loop, closes it, then runs the turns on another.
    invoke_async_hook(scheduler.on_trajectory_start(requests))
    first_turn = engine.rollout_fn(requests, CONFIG)
    outputs = run_multi_turn(requests, first_turn, scheduler, engine.rollout_fn, CONFIG, max_turns=3)

    assert engine.conversations[0][1]["content"] != engine.conversations[1][1]["content"]  # two seeds, two boards
    for output in outputs:
        infos = output.rollout_infos
        assert infos["status"] == "max_turns" and infos["num_turns"] == 3 and not infos["success"]
        assert infos["valid_move"] == 1.0 and infos["reward_parts"]["valid_move"] == 1.0
        assert len(infos["step_rewards"]) == 3
        assert infos["cells_filled"] == 3 and infos["correct"] == 0.0
        assert infos["total_reward"] == pytest.approx(2.0 + infos["progress"])
        assert [m["role"] for m in output.messages] == ["system"] + ["user", "assistant"] * 3
    assert scheduler.open_trajectories == 0
    assert active_sessions(sudoku_url) == 0


async def test_reply_cut_by_the_length_limit_is_not_played_and_costs_what_no_move_costs(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    """It ended with reward 0.0: above a reply naming no move (−1.0), so GRPO rewarded rambling."""
    engine = ScriptedEngine(ReplyScript(["[1 1 1"]), tokenizer, finish_reasons=["length"])
    output = await _scheduler(engine, 100).run(_request(sudoku_url, 4), CONFIG)
    infos = output.rollout_infos
    assert infos["status"] == "length" and infos["num_turns"] == 1 and infos["truncated"] is True
    assert infos["cut_replies"] == "penalty" and infos["step_rewards"] == []
    assert infos["format_penalty"] == -1.0 and infos["total_reward"] == -1.0
    assert active_sessions(sudoku_url) == 0


class _Thinking(Policy):
    """The oracle's move after a ``<think>`` block that weighs another move (one on a filled cell)."""

    def __init__(self) -> None:
        self.oracle = SudokuOraclePolicy()
        self.weighed: list[str] = []

    async def act(self, messages: list[dict[str, Any]]) -> str:
        right = await self.oracle.act(messages)
        board = SudokuOraclePolicy.read_board(messages)
        r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c])
        wrong = f"[{r + 1} {c + 1} {board[r][c] % 9 + 1}]"
        self.weighed.append(wrong)
        return f"<think>Could {wrong} work? No. So {right}.</think> {right}"


async def test_a_reasoning_reply_plays_the_move_after_its_thinking(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    """The bridge stepped the game with the whole completion: the move inside ``<think>`` was played."""
    policy = _Thinking()
    engine = ScriptedEngine(policy, tokenizer)
    output = await _scheduler(engine, 3).run(_request(sudoku_url, 7), CONFIG)
    infos = output.rollout_infos
    assert infos["status"] == "max_turns" and infos["valid_move"] == 1.0 and infos["empty_cell"] == 1.0
    assert len(infos["moves_tried"]) == 3 and not set(infos["moves_tried"]) & set(policy.weighed)
    assert active_sessions(sudoku_url) == 0


async def test_with_cut_replies_env_a_cut_reply_is_played_and_ends_the_episode(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVSDK_CUT_REPLIES", "env")
    engine = ScriptedEngine(_Thinking(), tokenizer, finish_reasons=["stop", "length"])
    output = await _scheduler(engine, 100).run(_request(sudoku_url, 8), CONFIG)
    infos = output.rollout_infos
    assert infos["status"] == "length" and infos["truncated"] is True and infos["cut_replies"] == "env"
    assert infos["num_turns"] == 2 and len(infos["step_rewards"]) == 2 and infos["valid_move"] == 1.0
    assert active_sessions(sudoku_url) == 0

    monkeypatch.setenv("ENVSDK_CUT_REPLIES", "drop")
    with pytest.raises(ValueError, match="ENVSDK_CUT_REPLIES.*env, penalty, mask"):
        _scheduler(engine, 100)


async def test_unparseable_reply_costs_one_and_ends_the_episode(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    engine = ScriptedEngine(ReplyScript(["I would rather not play."]), tokenizer)
    output = await _scheduler(engine, 100).run(_request(sudoku_url, 4), CONFIG)
    infos = output.rollout_infos
    assert infos["status"] == "done" and not infos["success"] and infos["unparseable_reply"]
    assert infos["format_penalty"] == -1.0 and infos["total_reward"] == -1.0
    assert active_sessions(sudoku_url) == 0


class _OracleOrAnyMove(Policy):
    """The oracle where there is a board; any move where there is none (a failed reset)."""

    def __init__(self) -> None:
        self.oracle = SudokuOraclePolicy()

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if any("R1" in str(m.get("content")) for m in messages if m.get("role") == "user"):
            return await self.oracle.act(messages)
        return "[1 1 1]"


async def test_an_unreachable_server_ends_only_its_own_trajectory(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    engine = ScriptedEngine(_OracleOrAnyMove(), tokenizer)
    scheduler = _scheduler(engine, 2)
    dead_url = f"http://127.0.0.1:{free_port()}"
    good, bad = await asyncio.gather(
        scheduler.run(_request(sudoku_url, 5), CONFIG), scheduler.run(_request(dead_url, 5), CONFIG)
    )
    assert good.rollout_infos["status"] == "max_turns" and good.rollout_infos["num_turns"] == 2
    assert bad.rollout_infos["status"] == "error" and bad.rollout_infos["num_turns"] == 1
    assert bad.rollout_infos["env_error"] and bad.rollout_infos["total_reward"] == 0.0
    assert scheduler.open_trajectories == 0
    assert active_sessions(sudoku_url) == 0


async def test_an_inference_error_mid_episode_still_closes_the_session(
    sudoku_plugin: ModuleType, sudoku_url: str, tokenizer: Any
) -> None:
    engine = ScriptedEngine(ReplyScript(["[1 1 1]"]), tokenizer)  # the second turn raises
    scheduler = _scheduler(engine, 100)
    with pytest.raises(AssertionError, match="only 1 replies"):
        await scheduler.run(_request(sudoku_url, 6), CONFIG)
    assert scheduler.open_trajectories == 0
    assert active_sessions(sudoku_url) == 0
