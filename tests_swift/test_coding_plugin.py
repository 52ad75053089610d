"""The ``envsdk_coding`` ms-swift scheduler (examples/coding_swift_plugin.py) against a real
envsdk coding server on 127.0.0.1, driven by ms-swift's own rollout loops: server mode
(``MultiTurnScheduler.run``, what ``swift rollout`` runs per request) and colocate mode
(``invoke_async_hook`` + ``run_multi_turn``, what ``swift rlhf --vllm_mode colocate`` runs).
Replies are scripted: a HumanEval problem's canonical solution must score 1.0, a wrong body 0.0,
both run by the server in the session's sandbox."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest
from swift.rollout import MultiTurnScheduler, invoke_async_hook, multi_turns, run_multi_turn

from envsdk.games.humaneval import humaneval
from envsdk.policies.coding import CodingOraclePolicy

from .conftest import active_sessions
from .engine import ReplyScript, ScriptedEngine

pytestmark = pytest.mark.timeout(120)

CONFIG = RequestConfig(max_tokens=512, temperature=0.0)


def _request(url: str, **env_config: Any) -> RolloutInferRequest:
    return RolloutInferRequest(
        messages=[{"role": "user", "content": "Solve the problem."}],
        data_dict={"env_config": {"base_url": url, **env_config}},
    )


def _scheduler(engine: ScriptedEngine | None, max_turns: int | None, **kwargs: Any) -> Any:
    # Built the way `swift rollout` builds it (get_rollout_engine_type).
    return multi_turns["envsdk_coding"](infer_engine=engine, max_turns=max_turns, **kwargs)


def test_plugin_registers_the_scheduler_in_ms_swift_multi_turns(coding_plugin: ModuleType) -> None:
    cls = multi_turns["envsdk_coding"]
    assert cls is coding_plugin.EnvsdkCodingScheduler
    assert issubclass(cls, MultiTurnScheduler)
    # The trainer's colocate path builds it with other keywords than `swift rollout` does.
    scheduler = cls(max_turns=3, tokenizer=None, template=None, gym_env=None)
    assert scheduler.max_turns == 3 and scheduler.core.max_turns == 3


async def test_server_mode_canonical_solution_scores_one(coding_plugin: ModuleType, coding_url: str, tokenizer: Any) -> None:
    problem = humaneval()[12]
    engine = ScriptedEngine(ReplyScript([f"Here it is.\n```python\n{problem.solution}```"]), tokenizer)
    scheduler = _scheduler(engine, 4, use_gym_env=True, gym_env=None)
    output = await scheduler.run(_request(coding_url, reset_kwargs={"task_id": problem.task_id}), CONFIG)

    infos = output.rollout_infos
    assert infos["total_reward"] == 1.0 and infos["success"] and infos["gym_done"]
    assert infos["num_turns"] == 1 and infos["reward_parts"]["tests_passed"] == 1.0
    json.dumps(infos)  # ms-swift requires rollout_infos to be JSON-serialisable
    # The problem's prompt, not the row's placeholder, is what the model was shown.
    shown = engine.conversations[0][-1]["content"]
    assert problem.prompt in shown and "Solve the problem." not in shown
    assert [m["role"] for m in output.messages if m["role"] != "system"] == ["user", "assistant"]
    assert scheduler.open_trajectories == 0
    assert active_sessions(coding_url) == 0


async def test_server_mode_wrong_solution_scores_zero(coding_plugin: ModuleType, coding_url: str, tokenizer: Any) -> None:
    problem = humaneval()[12]
    wrong = f"```python\n{problem.prompt}    return None\n```"
    engine = ScriptedEngine(ReplyScript([wrong, wrong]), tokenizer)
    output = await _scheduler(engine, 2).run(_request(coding_url, reset_kwargs={"task_id": problem.task_id}), CONFIG)

    infos = output.rollout_infos
    assert infos["status"] == "max_turns" and infos["num_turns"] == 2
    assert infos["total_reward"] == 0.0 and not infos["success"]
    # The second turn was shown the failing tests of the first.
    assert "tests: failed" in engine.conversations[1][-1]["content"]
    assert active_sessions(coding_url) == 0


def test_colocate_mode_solves_two_problems_by_seed(coding_plugin: ModuleType, coding_url: str, tokenizer: Any) -> None:
    engine = ScriptedEngine(CodingOraclePolicy(), tokenizer)
    # Built the way the GRPO trainer builds it in colocate mode (_prepare_scheduler).
    scheduler = multi_turns["envsdk_coding"](max_turns=2, tokenizer=tokenizer, template=None)
    requests = [_request(coding_url, seed=seed) for seed in (3, 40)]
    # ms-swift resets on one event loop, closes it, then runs the turns on another.
    invoke_async_hook(scheduler.on_trajectory_start(requests))
    first_turn = engine.rollout_fn(requests, CONFIG)
    outputs = run_multi_turn(requests, first_turn, scheduler, engine.rollout_fn, CONFIG, max_turns=2)

    problems = humaneval()
    for seed, conversation in zip((3, 40), engine.conversations):
        assert problems[seed].prompt in conversation[-1]["content"]
    for output in outputs:
        infos = output.rollout_infos
        assert infos["total_reward"] == 1.0 and infos["success"] and infos["num_turns"] == 1
    assert scheduler.open_trajectories == 0
    assert active_sessions(coding_url) == 0
