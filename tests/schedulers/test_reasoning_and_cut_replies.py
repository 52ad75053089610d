"""What the model sends back, read in one place (`MultiTurnScheduler.take_reply`): reasoning kept
and never played, by every scheduler and by their parsers called on a whole completion; a reply
cut by the length limit dealt with by the scheduler's rule (``cut_replies``), flagged in the
record, ranked never above a reply the scheduler cannot read by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envsdk.env import Env, RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv
from envsdk.policies import PolicyOutput
from envsdk.registry import Registry
from envsdk.schedulers import GYMScheduler, OpenEnvScheduler, SudokuScheduler, TrajectoryWriter
from envsdk.schedulers.base import CUT_RULES, DEFAULT_CUT_RULE
from envsdk.schedulers.coding import CodingScheduler, extract_code

COMPLETION = "<think>Could [1 5 4] work? No, column 5 has a 4. So [1 5 9].</think> [1 5 9]"


# ---------------------------------------------------------------- parsers on a whole completion


def test_sudoku_parses_the_move_after_the_reasoning_of_a_whole_completion() -> None:
    """Called outside the run loop (a trainer's hook, a user's code), it read ``[1 5 4]``."""
    scheduler = SudokuScheduler()
    assert scheduler.parse_move(COMPLETION) == (1, 5, 9)
    assert scheduler.parse_action(COMPLETION) == {"message": "[1 5 9]"}
    # A completion that starts inside the block (the template opened it) and one cut inside it.
    assert scheduler.parse_move("[1 5 4]? no.</think>[1 5 9]") == (1, 5, 9)
    assert scheduler.parse_move("<think>Could [1 5 4] work") is None


def test_coding_runs_the_code_after_the_reasoning_of_a_whole_completion() -> None:
    draft = "<think>\n```python\ndef f():\n    return 1\n```\nNo.</think>\n"
    assert extract_code(draft + "def f():\n    return 2\n") == "def f():\n    return 2"
    assert CodingScheduler().parse_action(draft + "```python\ndef f():\n    return 2\n```") == {
        "code": "def f():\n    return 2\n"
    }
    assert extract_code("<think>```python\nx = 1\n```") == ""  # cut inside the reasoning: no code


async def test_frozen_lake_stepped_with_a_whole_completion_plays_its_answer() -> None:
    """ms-swift's own gym scheduler steps the env with the conversation as the model wrote it:
    the tagged move inside the thinking was played over the answer after it."""
    env = FrozenLakeEnv({"map": ["SF", "FG"]})
    await env.reset(RolloutRequest())
    _, _, _, info = await env.step([{"role": "assistant", "content": "<think><action>up</action>? no.</think> down"}])
    assert info["action"] == "down"
    _, _, _, info = await env.step([{"role": "assistant", "content": "<think>then I go left, or"}])
    assert info["outcome"] == "invalid"  # cut inside its thinking: no move


def test_openenv_sends_the_reply_after_the_reasoning_of_a_whole_completion() -> None:
    scheduler = OpenEnvScheduler()
    assert scheduler.parse_action('<think>maybe {"guess": 3}</think> {"guess": 5}') == {"guess": 5}
    assert scheduler.parse_action("<think>hmm</think> hello") == {"message": "hello"}


# ---------------------------------------------------------------- the rule and its checks


def test_the_rule_is_checked_and_defaults_to_the_penalty() -> None:
    assert DEFAULT_CUT_RULE == "penalty" and CUT_RULES == ("env", "penalty", "mask")
    assert GYMScheduler("x").cut_replies == "penalty" and SudokuScheduler(cut_replies="mask").cut_replies == "mask"
    with pytest.raises(ValueError, match="cut_replies must be one of env, penalty, mask, got 'drop'"):
        GYMScheduler("x", cut_replies="drop")  # type: ignore[arg-type]
    scheduler = OpenEnvScheduler()
    with pytest.raises(ValueError, match="got 'keep'"):
        scheduler.cut_replies = "keep"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="cut_penalty must be a finite number"):
        OpenEnvScheduler(cut_penalty=float("nan"))
    with pytest.raises(ValueError, match="max_completion_chars must be >= 1"):
        GYMScheduler("x", max_completion_chars=0)
    assert CodingScheduler().format_penalty == 0.0 and SudokuScheduler().format_penalty == -1.0


# ---------------------------------------------------------------- a local env


class SeenEnv(Env):
    """Reward 1.0 per step; the observation says what the env read as the last reply."""

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        return "start", {}, None

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        return f"read {messages[-1]['content']!r}", 1.0, False, {}


@pytest.fixture
def registry() -> Registry[Any]:
    reg: Registry[Any] = Registry("env")
    reg["seen"] = SeenEnv
    return reg


def _row() -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"name": "seen"}})]


class Replies:
    """`PolicyOutput`s in order, one per turn."""

    def __init__(self, *outputs: PolicyOutput) -> None:
        self.outputs = list(outputs)

    async def act_ex(self, messages: list[dict[str, Any]]) -> PolicyOutput:
        return self.outputs[sum(1 for m in messages if m["role"] == "assistant")]

    async def act(self, messages: list[dict[str, Any]]) -> str:
        return (await self.act_ex(messages)).text


async def test_the_env_reads_the_reply_and_the_record_keeps_the_reasoning(registry: Registry[Any], tmp_path: Path) -> None:
    policy = Replies(PolicyOutput(text=COMPLETION), PolicyOutput(text="[2 2 2]", reasoning="told apart by the server"))
    [traj] = await GYMScheduler(registry=registry, max_turns=2).run(_row(), policy)
    assert traj.messages[1] == {
        "role": "assistant", "content": "[1 5 9]", "reasoning_content": "Could [1 5 4] work? No, column 5 has a 4. So [1 5 9]."
    }
    assert traj.messages[2]["content"] == "read '[1 5 9]'"
    assert traj.messages[3] == {"role": "assistant", "content": "[2 2 2]", "reasoning_content": "told apart by the server"}
    out = tmp_path / "records.jsonl"
    with TrajectoryWriter(out) as writer:
        writer.write(traj)
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["messages"] == traj.messages and record["truncated"] is False


@pytest.mark.parametrize(
    ("rule", "steps", "total", "status"),
    [("penalty", 1, 1.0 - 0.5, "length"), ("mask", 1, 1.0, "length"), ("env", 2, 2.0, "length")],
)
async def test_a_cut_reply_ends_the_episode_by_the_rule(
    registry: Registry[Any], rule: str, steps: int, total: float, status: str
) -> None:
    policy = Replies(PolicyOutput(text="first"), PolicyOutput(text="<think>ok</think> second, cut", finish_reason="length"))
    scheduler = GYMScheduler(registry=registry, max_turns=5, cut_replies=rule, cut_penalty=-0.5 if rule == "penalty" else None)  # type: ignore[arg-type]
    [traj] = await scheduler.run(_row(), policy)
    assert traj.status == status and traj.truncated and traj.turns == 2 and len(traj.steps) == steps
    assert traj.total_reward == pytest.approx(total) and traj.rollout_infos["cut_replies"] == rule
    assert traj.messages[-1] == {"role": "assistant", "content": "second, cut", "reasoning_content": "ok"}
    if rule == "env":
        assert traj.steps[-1].action == "second, cut" and "which played it" in (traj.reason or "")
    else:
        assert "not sent to the environment" in (traj.reason or "")
    assert ("format_penalty" in traj.rollout_infos) == (rule == "penalty")


async def test_a_gym_env_cut_reply_scores_what_an_unreadable_reply_does(registry: Registry[Any]) -> None:
    """A gym `Env` gives a reply it cannot read 0 (FrozenLake does): the default penalty is
    that, so a 0/1 reward stays 0/1 and a cut reply ranks with a reply naming no move."""
    policy = Replies(PolicyOutput(text="first"), PolicyOutput(text="cut", finish_reason="length"))
    [traj] = await GYMScheduler(registry=registry, max_turns=5).run(_row(), policy)
    assert traj.truncated and traj.rollout_infos["format_penalty"] == 0.0 and traj.total_reward == pytest.approx(1.0)


async def test_max_completion_chars_cuts_the_completion_there_reasoning_included(registry: Registry[Any]) -> None:
    policy = Replies(PolicyOutput(text="<think>long thought</think> reply"))
    [traj] = await GYMScheduler(registry=registry, max_turns=3, max_completion_chars=12, cut_replies="env").run(
        _row(), policy
    )
    # Cut inside the reasoning: the block never closes, so the reply is empty, and is played so.
    assert traj.truncated and traj.steps[0].action == "" and "max_completion_chars=12" in (traj.reason or "")
    assert traj.messages[1] == {"role": "assistant", "content": "", "reasoning_content": "long"}


async def test_a_cut_penalty_is_added_to_a_server_env_s_total(echo_url: str) -> None:
    """Under ``penalty`` the episode's reward is its steps' plus the penalty, once the scheduler
    has set its total at the end (its infos given once, as `envsdk rollout` has them)."""
    scheduler = OpenEnvScheduler(base_url=echo_url, max_turns=5, cut_penalty=-2.5)
    scheduler.infos_each_turn = False
    policy = Replies(PolicyOutput(text="<think>x</think>abcd"), PolicyOutput(text="abcdef", finish_reason="length"))
    [traj] = await scheduler.run([RolloutRequest(data_dict={"env_config": {}})], policy)
    assert traj.steps[0].action == {"message": "abcd"} and len(traj.steps) == 1
    assert traj.total_reward == pytest.approx(0.4 - 2.5) and traj.rollout_infos["total_reward"] == traj.total_reward
    assert traj.rollout_infos["format_penalty"] == -2.5 and "format_penalty" in traj.rollout_infos["total_reward_is"]
