"""GYMScheduler and the scheduler core, with local `Env`s (no socket involved)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envsdk.env import Env, RolloutRequest
from envsdk.registry import Registry
from envsdk.schedulers import GYMScheduler, TrajectoryWriter

from .policies import CountingPolicy, LengthCutPolicy, ScriptedPolicy

CLOSED: list[str] = []


class CountdownEnv(Env):
    """Reward 0.25 per step, done after `steps` steps; raises on step `raise_on` if set."""

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        self.n = 0
        self.id = config.uuid
        return "start", {"seed": self.env_config.get("seed")}, self.env_config.get("system")

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        self.n += 1
        if self.env_config.get("raise_on") == self.n:
            raise RuntimeError(f"env broke on step {self.n}")
        limit = self.env_config.get("steps", 100)
        return f"obs{self.n} after {messages[-1]['content']}", 0.25, self.n >= limit, {"n": self.n}

    async def close(self) -> None:
        CLOSED.append(self.id)


@pytest.fixture
def registry() -> Registry[Any]:
    CLOSED.clear()
    reg: Registry[Any] = Registry("env")
    reg["countdown"] = CountdownEnv
    return reg


def _rows(n: int, **config: Any) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"name": "countdown", "seed": i, **config}}) for i in range(n)]


async def test_episode_ends_done_with_summed_reward_and_kept_infos(registry: Registry[Any]) -> None:
    sched = GYMScheduler(registry=registry, max_turns=10)
    [traj] = await sched.run(_rows(1, steps=3, system="be brief"), ScriptedPolicy(["a", "b", "c"]))
    # Positive rewards, but the env never states success: the verdict is "not stated".
    assert traj.status == "done" and traj.turns == 3 and traj.success is None
    assert traj.total_reward == 0.75 and traj.rollout_infos["step_rewards"] == [0.25] * 3
    assert [s.info for s in traj.steps] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert traj.messages[0] == {"role": "system", "content": "be brief"}
    assert traj.messages[1] == {"role": "user", "content": "start"}
    assert [m["role"] for m in traj.messages[2:]] == ["assistant", "user", "assistant", "user", "assistant"]
    assert traj.messages[3]["content"] == "obs1 after a"
    assert traj.reset_info == {"seed": 0}
    assert CLOSED == [traj.uuid]


async def test_env_is_closed_at_max_turns(registry: Registry[Any]) -> None:
    sched = GYMScheduler(registry=registry, max_turns=2)
    trajs = await sched.run(_rows(5), ScriptedPolicy(["x"] * 5))
    assert {t.status for t in trajs} == {"max_turns"}
    assert all(t.turns == 2 and len(t.steps) == 2 for t in trajs)
    assert sorted(CLOSED) == sorted(t.uuid for t in trajs)


async def test_row_name_overrides_gym_env(registry: Registry[Any]) -> None:
    sched = GYMScheduler("nonexistent", registry=registry, max_turns=1)
    [traj] = await sched.run(_rows(1), ScriptedPolicy(["x"]))
    assert traj.status == "max_turns"


async def test_unknown_env_name_is_a_recorded_error_listing_known_names(registry: Registry[Any]) -> None:
    sched = GYMScheduler("nope", registry=registry)
    [traj] = await sched.run([RolloutRequest(data_dict={})], ScriptedPolicy(["x"]))
    assert traj.status == "error" and traj.error_kind == "EnvNotFoundError"
    assert "countdown" in (traj.reason or "")


async def test_one_env_raising_on_step_3_fails_only_its_trajectory(registry: Registry[Any]) -> None:
    rows = _rows(16, steps=5)
    rows[7].data_dict["env_config"]["raise_on"] = 3
    sched = GYMScheduler(registry=registry, max_turns=10)
    trajs = await sched.run(rows, ScriptedPolicy(["m"] * 10))
    statuses = [t.status for t in trajs]
    assert statuses.count("done") == 15 and statuses[7] == "error"
    assert trajs[7].reason == "RuntimeError: env broke on step 3" and trajs[7].error_kind == "RuntimeError"
    assert len(trajs[7].steps) == 2
    assert len(CLOSED) == 16  # the failed env was closed too


async def test_length_cut_reply_is_not_stepped(registry: Registry[Any]) -> None:
    sched = GYMScheduler(registry=registry, max_turns=5)
    [traj] = await sched.run(_rows(1), LengthCutPolicy(cut_on_turn=2))
    assert traj.status == "length" and traj.turns == 2 and len(traj.steps) == 1
    assert traj.messages[-1]["role"] == "assistant"
    assert CLOSED == [traj.uuid]


async def test_max_completion_chars_cuts_and_does_not_step(registry: Registry[Any]) -> None:
    sched = GYMScheduler(registry=registry, max_turns=5, max_completion_chars=3)
    [traj] = await sched.run(_rows(1), ScriptedPolicy(["ok", "much too long"]))
    assert traj.status == "length" and len(traj.steps) == 1 and "max_completion_chars=3" in (traj.reason or "")


async def test_cancelling_run_closes_every_env(registry: Registry[Any]) -> None:
    sched = GYMScheduler(registry=registry, max_turns=50)
    policy = ScriptedPolicy(["x"] * 50, delay_s=0.01)
    task = asyncio.create_task(sched.run(_rows(4), policy))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(CLOSED) == 4


async def test_on_trajectory_end_runs_exactly_once_per_trajectory(registry: Registry[Any]) -> None:
    ends: list[str] = []

    class Counting(GYMScheduler):
        async def on_trajectory_end(self, trajectory: Any) -> None:
            ends.append(trajectory.uuid)
            await super().on_trajectory_end(trajectory)

    rows = _rows(4, steps=2) + _rows(1, raise_on=1)
    trajs = await Counting(registry=registry, max_turns=3).run(rows, ScriptedPolicy(["x"] * 3))
    assert sorted(ends) == sorted(t.uuid for t in trajs) and len(ends) == 5


async def test_the_policy_gets_its_own_copy_of_the_conversation_each_turn(registry: Registry[Any]) -> None:
    """A policy that scribbles on the messages it was given, or keeps and extends the list,
    changes neither the trajectory's messages nor what it is given next turn; a hook that
    rewrites a message the policy saw before is seen in its new form."""
    seen: list[list[dict[str, Any]]] = []

    class Scribbler:
        async def act(self, messages: list[dict[str, Any]]) -> str:
            seen.append([dict(m) for m in messages])
            turn = sum(1 for m in messages if m["role"] == "assistant")
            if turn == 0:
                messages[-1]["content"] = "scribbled"
                messages.append({"role": "user", "content": "appended by the policy"})
            elif turn == 1:
                messages.pop(0)
            return f"reply{turn}"

    class Rewriting(GYMScheduler):
        async def step(self, trajectory: Any, turn_result: Any, turn: int) -> None:
            await super().step(trajectory, turn_result, turn)
            if turn == 2:
                trajectory.messages[1]["content"] = "start (rewritten)"

    [traj] = await Rewriting(registry=registry, max_turns=4).run(_rows(1, steps=4, system="sys"), Scribbler())
    expected = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "start (rewritten)"},
        {"role": "assistant", "content": "reply0"},
        {"role": "user", "content": "obs1 after reply0"},
        {"role": "assistant", "content": "reply1"},
        {"role": "user", "content": "obs2 after reply1"},
        {"role": "assistant", "content": "reply2"},
        {"role": "user", "content": "obs3 after reply2"},
        {"role": "assistant", "content": "reply3"},
    ]
    assert traj.messages == expected
    assert seen[0] == [expected[0], {"role": "user", "content": "start"}]
    assert seen[1] == [expected[0], {"role": "user", "content": "start"}, *expected[2:4]]
    assert seen[2] == expected[:6] and seen[3] == expected[:8]


async def test_max_concurrency_bounds_trajectories_in_flight(registry: Registry[Any]) -> None:
    policy = CountingPolicy(delay_s=0.005)
    await GYMScheduler(registry=registry, max_turns=3).run(_rows(12), policy, max_concurrency=3)
    assert policy.peak == 3


async def test_writer_keeps_every_field(registry: Registry[Any], tmp_path: Path) -> None:
    sched = GYMScheduler(registry=registry, max_turns=10)
    trajs = await sched.run(_rows(2, steps=2), ScriptedPolicy(["a", "b"]))
    path = tmp_path / "out" / "completions.jsonl"
    with TrajectoryWriter(path, "full") as writer:
        for t in trajs:
            writer.write(t)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 2
    rec = records[0]
    assert rec["schema"] == "envsdk.completions/1"
    assert rec["status"] == "done" and rec["seed"] == 0 and rec["env"] == "countdown"
    assert rec["step_rewards"] == [0.25, 0.25] and rec["infos"]["step_infos"] == [{"n": 1}, {"n": 2}]
    assert rec["timings"]["total_s"] > 0 and len(rec["steps"]) == 2 and "duration_s" in rec["steps"][0]
    assert [s["info"] for s in rec["steps"]] == [{"n": 1}, {"n": 2}]
    assert rec["messages"][-1] == {"role": "assistant", "content": "b"}


async def test_an_envsdk_policy_whose_act_gives_a_cut_reply_is_read_as_cut(registry: Registry[Any]) -> None:
    """A `Policy` subclass that keeps the base act_ex and returns a `PolicyOutput` from act: the
    wrapper made it the text of another PolicyOutput, so the env was sent the object's repr and
    the cut went unseen."""
    from envsdk.policies import Policy, PolicyOutput

    class CutsOnce(Policy):
        async def act(self, messages: list[dict[str, Any]]) -> Any:
            return PolicyOutput(text="abc", finish_reason="length")

    [traj] = await GYMScheduler(registry=registry, max_turns=5).run(_rows(1), CutsOnce())
    assert traj.status == "length" and traj.turns == 1 and not traj.steps
    assert traj.messages[-1] == {"role": "assistant", "content": "abc"}
