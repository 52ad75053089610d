"""OpenEnvScheduler against a real envsdk echo server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from envsdk.client import EnvClient
from envsdk.env import RolloutRequest
from envsdk.schedulers import OpenEnvScheduler
from envsdk.types import StepResult

from .policies import ScriptedPolicy, play_both_ways

pytestmark = pytest.mark.timeout(60)


def _rows(url: str, n: int, **config: Any) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": i, **config}}) for i in range(n)]


async def _active_sessions(url: str) -> int:
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            active = int((await http.get(f"{url}/health")).json()["active_sessions"])
            if active == 0:
                return 0
            await asyncio.sleep(0.02)
    return active


def test_parse_action_defaults() -> None:
    sched = OpenEnvScheduler()
    assert sched.parse_action('```json\n{"message": "hi"}\n```') == {"message": "hi"}
    assert sched.parse_action('{"message": "x", "metadata": {}}') == {"message": "x", "metadata": {}}
    assert sched.parse_action("[1, 2]") == {"message": "[1, 2]"}
    assert sched.parse_action("plain text") == {"message": "plain text"}
    # What the model reads: the observation's text, not a JSON dump; ms-swift's dump on request.
    assert sched.format_observation({"a": "é", "b": 1}) == "é"
    as_json = OpenEnvScheduler(formatter="json")
    assert json.loads(as_json.format_observation({"a": "é", "b": 1})) == {"a": "é", "b": 1}
    assert "é" in as_json.format_observation({"a": "é"})


async def test_episode_runs_to_done_with_rewards_infos_and_system_message(echo_url: str) -> None:
    sched = OpenEnvScheduler(max_turns=10)
    policy = ScriptedPolicy(["ab", '{"message": "abcd"}', "done"])
    [traj] = await sched.run(_rows(echo_url, 1, system_message="sys"), policy)
    assert traj.status == "done" and traj.turns == 3
    assert traj.step_rewards == [0.2, 0.4, 0.4] and traj.total_reward == pytest.approx(1.0)
    assert traj.rollout_infos["step_rewards"] == [0.2, 0.4, 0.4]
    assert traj.steps[1].action == {"message": "abcd"}
    assert traj.steps[0].observation["echoed_message"] == "ab"
    assert traj.steps[0].info["metadata"] == {"step": 1}  # the observation's metadata is kept
    assert traj.messages[0] == {"role": "system", "content": "sys"}
    assert traj.messages[1]["content"] == "ready" and traj.messages[3]["content"] == "ab"
    assert await _active_sessions(echo_url) == 0


async def test_one_env_raising_on_step_3_in_16_fails_only_that_trajectory(echo_url: str) -> None:
    def reply(turn: int, messages: list[dict[str, Any]]) -> str:
        doomed = messages[0]["content"] == "doomed"
        return ["a", "b", "raise" if doomed else "c", "d", "done"][turn]

    rows = _rows(echo_url, 16)
    for i, row in enumerate(rows):
        row.data_dict["env_config"]["system_message"] = "doomed" if i == 9 else "fine"
    trajs = await OpenEnvScheduler(max_turns=10).run(rows, ScriptedPolicy(reply))
    statuses = [t.status for t in trajs]
    assert statuses.count("done") == 15 and statuses[9] == "error"
    assert trajs[9].error_kind == "ServerError" and "echo env raised on purpose" in (trajs[9].reason or "")
    assert len(trajs[9].steps) == 2
    assert all(len(t.steps) == 5 for i, t in enumerate(trajs) if i != 9)
    assert await _active_sessions(echo_url) == 0


async def test_a_reply_the_wire_cannot_carry_ends_its_episode_with_a_typed_error(echo_url: str) -> None:
    # A lone surrogate: what a "\\ud800" escape in a model server's JSON reply decodes to.
    def reply(turn: int, messages: list[dict[str, Any]]) -> str:
        return "b \ud800" if messages[0]["content"] == "doomed" and turn == 1 else "abc"

    rows = _rows(echo_url, 4)
    for i, row in enumerate(rows):
        row.data_dict["env_config"]["system_message"] = "doomed" if i == 2 else "fine"
    trajs = await OpenEnvScheduler(max_turns=3).run(rows, ScriptedPolicy(reply))
    assert [t.status for t in trajs] == ["max_turns", "max_turns", "error", "max_turns"]
    doomed = trajs[2]
    assert doomed.error_kind == "RequestEncodingError", doomed.reason
    assert "step: the request cannot be written as a JSON frame, so nothing was sent" in (doomed.reason or "")
    assert "surrogates not allowed" in (doomed.reason or "")
    assert len(doomed.steps) == 1  # the first step was played; the second never left
    assert all(len(t.steps) == 3 for i, t in enumerate(trajs) if i != 2)
    assert await _active_sessions(echo_url) == 0


async def test_unreachable_server_is_a_recorded_error(echo_url: str) -> None:
    from envsdk.testing import free_port

    rows = _rows(f"http://127.0.0.1:{free_port()}", 1) + _rows(echo_url, 1)
    trajs = await OpenEnvScheduler(max_turns=2).run(rows, ScriptedPolicy(["a", "b"]))
    assert trajs[0].status == "error" and trajs[0].error_kind == "ConnectError"
    assert trajs[1].status == "max_turns"


class _InFlight:
    """A client factory whose clients count resets and steps in flight, across all of them."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    def __call__(self, base_url: str) -> Any:
        counter = self

        class Counted(EnvClient):
            async def _counted(self, coro: Any) -> StepResult[Any]:
                counter.active += 1
                counter.peak = max(counter.peak, counter.active)
                try:
                    return await coro
                finally:
                    counter.active -= 1

            async def reset(self, **kwargs: Any) -> StepResult[Any]:
                return await self._counted(super().reset(**kwargs))

            async def step(self, action: Any) -> StepResult[Any]:
                return await self._counted(super().step(action))

        return Counted(base_url)


async def test_one_semaphore_bounds_env_calls_across_concurrent_batches(echo_url: str) -> None:
    counter = _InFlight()
    sched = OpenEnvScheduler(max_concurrent_envs=3, max_turns=2, client_factory=counter)
    policy = ScriptedPolicy(["sleep:0.05", "sleep:0.05"])
    batches = await asyncio.gather(sched.run(_rows(echo_url, 6), policy), sched.run(_rows(echo_url, 6), policy))
    assert all(t.status == "max_turns" for batch in batches for t in batch)
    assert counter.peak == 3


async def test_blocking_wrapper_runs_in_threads(echo_url: str) -> None:
    sched = OpenEnvScheduler(max_turns=5, use_threads=True)
    trajs = await sched.run(_rows(echo_url, 3), ScriptedPolicy(["x", "done"]))
    assert [t.status for t in trajs] == ["done"] * 3
    assert all(t.step_rewards == [0.1, 0.4] for t in trajs)
    assert await _active_sessions(echo_url) == 0


class _Failing:
    """Replies "hello" twice, then raises."""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if sum(m["role"] == "assistant" for m in messages) >= 2:
            raise RuntimeError("policy failed")
        return "hello"


@pytest.mark.parametrize(
    ("policy", "status"),
    [
        (ScriptedPolicy(["hi", "hello", "done"]), "done"),
        (ScriptedPolicy(["a", "bb", "ccc", "dddd"]), "max_turns"),
        (_Failing(), "error"),
    ],
    ids=["done", "max_turns", "error"],
)
async def test_infos_given_once_at_the_end_equal_infos_given_every_turn(echo_url: str, policy: Any, status: str) -> None:
    """With `infos_each_turn` False (as `envsdk rollout` sets it) a turn that does not end the
    episode gives no infos, and the trajectory's end gives the ones the last turn would have."""
    records, results = await play_both_ways(OpenEnvScheduler, _rows(echo_url, 1), policy, status, max_turns=4)
    assert records[0] == records[1]
    assert records[1]["total_reward"] == pytest.approx(sum(records[1]["step_rewards"]))
    assert records[1]["total_reward"] > 0
    every_turn, at_the_end = results
    assert all("rollout_infos" in r for r in every_turn)
    assert all("rollout_infos" not in r for r in at_the_end if not r["done"]) and len(at_the_end) >= 2


async def test_a_run_bounded_to_the_limit_keeps_steps_within_it_without_the_semaphore(echo_url: str) -> None:
    """`run_batches` runs each scheduler it makes once, `max_concurrent_envs` trajectories at a
    time, and lets its steps skip the semaphore (`limit_steps` False): steps in flight must still
    stay within the limit."""
    counter = _InFlight()
    sched = OpenEnvScheduler(max_concurrent_envs=3, max_turns=3, client_factory=counter)
    sched.limit_steps = False
    trajs = await sched.run(_rows(echo_url, 9), ScriptedPolicy(["sleep:0.05"] * 3), max_concurrency=3)
    assert all(t.status == "max_turns" for t in trajs)
    assert counter.peak == 3
