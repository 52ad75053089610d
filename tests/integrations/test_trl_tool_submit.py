"""TRL's ``environment_factory`` on a tool env that judges the work at ``submit`` (a Harbor
task's shape), its methods called as TRL calls them (``reset(**row)``, the tools, then
``get_reward()`` once the model stopped calling tools): the model reads the observation's text,
and an episode the model did not submit is submitted before its reward is read. Real servers on
127.0.0.1; no training (nothing here depends on the model)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from envsdk.integrations.trl import tool_environment_factory
from envsdk.testing import running_server
from tests.tool_envs.submit_env import INSTRUCTION, create_answer_app, create_submit_app

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def submit_url() -> Iterator[str]:
    with running_server(create_submit_app(max_concurrent_envs=4)) as url:
        yield url


def _tool_calls(url: str) -> int:
    found = re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{url}/metrics", timeout=5).text, re.MULTILINE)
    assert found
    return int(found.group(1))


def test_the_model_reads_the_observations_text(submit_url: str) -> None:
    factory = tool_environment_factory(submit_url, class_name="Submits")
    try:
        # The observation has no prompt: its text, not its JSON, is what the model reads.
        assert factory().reset(seed=3) == INSTRUCTION
    finally:
        factory.close()


def test_get_reward_submits_for_a_model_that_stopped_calling_tools(submit_url: str) -> None:
    factory = tool_environment_factory(submit_url, class_name="Submits")
    # Typed Any: the tools are methods the factory made from the server's list.
    worker, wrong, submitter = (factory() for _ in range(3))  # type: Any, Any, Any
    try:
        before = _tool_calls(submit_url)
        for env in (worker, wrong, submitter):
            env.reset()
        assert worker.note(word="right") == "noted right" and wrong.note(word="wrong") == "noted wrong"
        submitter.note(word="right")
        assert submitter.submit() == "[episode over: submitted; reward 1]"
        # The work is judged, never an unjudged 0.0; an episode the model submitted is not submitted again.
        assert (worker.get_reward(), wrong.get_reward(), submitter.get_reward()) == (1.0, 0.0, 1.0)
        assert _tool_calls(submit_url) - before == 6 == factory.tool_calls
    finally:
        factory.close()
    assert httpx.get(f"{submit_url}/health", timeout=5).json()["active_sessions"] == 0


def test_a_submit_that_takes_an_argument_is_left_to_the_model() -> None:
    with running_server(create_answer_app(max_concurrent_envs=2)) as url:
        factory = tool_environment_factory(url, class_name="Answers")
        try:
            env: Any = factory()
            env.reset()
            env.note(word="right")
            before = _tool_calls(url)
            assert env.get_reward() == 0.0 and _tool_calls(url) == before
        finally:
            factory.close()
