"""How `ToolScheduler` ends an episode of a tool env that judges the work at ``submit`` (a
Harbor task's shape): the env's own end (its state's ``done``) ends the trajectory, and an
episode that ends otherwise (a reply with no tool call, ``max_turns``, a cut reply) is submitted
by the scheduler before the reward is read, so its reward is the env's verdict. Real servers on
127.0.0.1 (`tests.tool_envs.submit_env`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from envsdk.env import RolloutRequest
from envsdk.policies import PolicyOutput
from envsdk.schedulers import ToolScheduler
from envsdk.schedulers.base import FORMAT_PENALTY
from envsdk.testing import running_server

from .submit_env import create_answer_app, create_submit_app

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def submit_url() -> Iterator[str]:
    with running_server(create_submit_app(max_concurrent_envs=4)) as url:
        yield url


@pytest.fixture(scope="module")
def answer_url() -> Iterator[str]:
    with running_server(create_answer_app(max_concurrent_envs=4)) as url:
        yield url


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class Scripted:
    """Replies in turn from `replies` (the last one again once they run out); counts the turns
    it was asked."""

    def __init__(self, *replies: str | PolicyOutput, fail_at: int | None = None) -> None:
        self.replies = replies
        self.fail_at = fail_at
        self.asked = 0

    async def act(self, messages: list[dict[str, Any]]) -> str | PolicyOutput:
        self.asked += 1
        if self.asked == self.fail_at:
            raise RuntimeError("the policy's backend went away")
        return self.replies[min(self.asked, len(self.replies)) - 1]


def _tool_calls(url: str) -> int:
    found = re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{url}/metrics", timeout=5).text, re.MULTILINE)
    assert found
    return int(found.group(1))


def _called(trajectory: Any) -> list[str]:
    return [step.action["tool_name"] for step in trajectory.steps]


async def test_the_envs_own_end_ends_the_trajectory(submit_url: str) -> None:
    """After ``submit`` the state says done: the reply's later calls are not run, and the model
    is not asked again."""
    policy = Scripted(_call("note", word="right"), _call("submit") + _call("note", word="late"), _call("note", word="more"))
    [trajectory] = await ToolScheduler(base_url=submit_url, max_turns=6).run([RolloutRequest()], policy)
    assert (trajectory.status, trajectory.reason) == ("done", "environment signalled done")
    assert policy.asked == 2 and _called(trajectory) == ["note", "submit"]
    assert [step.done for step in trajectory.steps] == [False, True]  # the call that ended it
    assert trajectory.total_reward == 1.0 and trajectory.success is True
    assert "submitted" not in trajectory.rollout_infos  # the agent submitted, not the scheduler


async def test_a_reply_without_a_tool_call_is_submitted_for_the_agent(submit_url: str) -> None:
    """"Done." is the agent saying it is done: its work is judged (1.0), never an unjudged 0.0."""
    before = _tool_calls(submit_url)
    policy = Scripted(_call("note", word="right"), "Done.")
    [trajectory] = await ToolScheduler(base_url=submit_url, max_turns=6).run([RolloutRequest()], policy)
    assert (trajectory.status, trajectory.reason) == ("done", "no tool call")
    assert _called(trajectory) == ["note", "submit"] and trajectory.steps[-1].turn == 2
    assert trajectory.rollout_infos["submitted"] == "by the scheduler"
    assert trajectory.total_reward == 1.0 and trajectory.success is True
    assert _tool_calls(submit_url) - before == 2  # the submit reached the server, once
    # Work not done is judged too: 0.0, stated as a failure.
    [wrong] = await ToolScheduler(base_url=submit_url, max_turns=6).run(
        [RolloutRequest()], Scripted(_call("note", word="wrong"), "Done.")
    )
    assert _called(wrong) == ["note", "submit"] and wrong.total_reward == 0.0 and wrong.success is False


async def test_max_turns_and_a_cut_reply_are_submitted_for_the_agent(submit_url: str) -> None:
    [turns] = await ToolScheduler(base_url=submit_url, max_turns=1).run(
        [RolloutRequest()], Scripted(_call("note", word="right"))
    )
    assert turns.status == "max_turns" and _called(turns) == ["note", "submit"]
    assert turns.total_reward == 1.0 and turns.success is True
    cut = PolicyOutput(text=_call("note", word="rig"), finish_reason="length")
    [length] = await ToolScheduler(base_url=submit_url, max_turns=6).run(
        [RolloutRequest()], Scripted(_call("note", word="right"), cut)
    )
    # The cut reply is not played (the default rule), the work before it is judged, then penalised.
    assert length.status == "length" and _called(length) == ["note", "submit"]
    assert length.success is True and length.total_reward == 1.0 + FORMAT_PENALTY


async def test_nothing_is_submitted_after_an_error(submit_url: str) -> None:
    before = _tool_calls(submit_url)
    policy = Scripted(_call("note", word="right"), "Done.", fail_at=2)
    [trajectory] = await ToolScheduler(base_url=submit_url, max_turns=6).run([RolloutRequest()], policy)
    assert trajectory.status == "error" and "backend went away" in (trajectory.reason or "")
    assert _called(trajectory) == ["note"] and "submitted" not in trajectory.rollout_infos
    assert trajectory.total_reward == 0.0 and trajectory.success is None  # never judged
    assert _tool_calls(submit_url) - before == 1


async def test_a_submit_that_takes_an_argument_is_left_to_the_agent(answer_url: str) -> None:
    [trajectory] = await ToolScheduler(base_url=answer_url, max_turns=6).run(
        [RolloutRequest()], Scripted(_call("note", word="right"), "Done.")
    )
    assert (trajectory.status, _called(trajectory)) == ("done", ["note"])
    assert "submitted" not in trajectory.rollout_infos and trajectory.success is None
    # Submitted by the agent, the env's end ends it as with an argument-free submit.
    policy = Scripted(_call("submit", answer="right"), _call("note", word="more"))
    [submitted] = await ToolScheduler(base_url=answer_url, max_turns=6).run([RolloutRequest()], policy)
    assert submitted.status == "done" and policy.asked == 1 and submitted.total_reward == 1.0
