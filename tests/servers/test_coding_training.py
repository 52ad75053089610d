"""The coding server as a TRL ``environment_factory`` (its MCP tools become the methods the model
calls; the reward is the state's) and through `CodingScheduler` (code blocks of a model's reply)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from envsdk.games.humaneval import humaneval
from envsdk.integrations.trl import tool_environment_factory
from envsdk.schedulers.coding import CodingScheduler, extract_code
from envsdk.testing import running_server
from servers.coding import create_coding_app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = create_coding_app(provider="auto", warm=2, max_concurrent_envs=8)
    try:
        with running_server(app) as url:
            yield url
    finally:
        app.state.envsdk_sandbox_pool.close()


def test_trl_environment_factory_plays_and_rewards(base_url: str) -> None:
    problem = humaneval()[12]
    factory = tool_environment_factory(base_url, reset_kwargs={"task_id": problem.task_id}, class_name="Coding")
    solver, loser = factory(), factory()
    try:
        # OpenEnv's strict observation has no prompt field: the model reads the observation's JSON.
        assert json.loads(solver.reset())["metadata"]["prompt"] == problem.prompt
        loser.reset()
        assert '"exit_code": 0' in solver.run_python(code="print(2 + 2)")
        assert '"passed": true' in solver.submit(code=problem.solution)
        assert '"passed": false' in loser.submit(code=f"{problem.prompt}    return None\n")
        assert (solver.get_reward(), loser.get_reward()) == (1.0, 0.0)
    finally:
        factory.close()


def test_extract_code_takes_the_last_python_block() -> None:
    reply = "Plan:\n```text\nnotes\n```\nFirst try:\n```python\nx = 1\n```\nFinal:\n```py\ndef f():\n    return 2\n```"
    assert extract_code(reply) == "def f():\n    return 2\n"
    assert extract_code("```bash\nls\n```") == "ls\n"
    assert extract_code("print(1)") == "print(1)"
    assert extract_code("```python\ndef g(): pass") == "def g(): pass"


class FirstTryWrong:
    """A model that answers wrong first, then right after reading the test failure."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def act(self, messages: list[dict[str, str]]) -> str:
        from envsdk.policies.coding import CodingOraclePolicy

        self.seen.append(messages[-1]["content"])
        problem = CodingOraclePolicy.problem(messages)
        if len(self.seen) == 1:
            return f"Let me try.\n```python\n{problem.prompt}    return None\n```"
        return f"Fixed:\n```python\n{problem.solution}```"


def test_scheduler_shows_the_failure_and_scores_the_fix(base_url: str) -> None:
    scheduler = CodingScheduler(base_url=base_url, max_turns=3)
    from envsdk.env import RolloutRequest

    model = FirstTryWrong()
    rows = [RolloutRequest(messages=[], data_dict={"env_config": {"name": "coding", "seed": 4, "base_url": base_url}})]
    [trajectory] = asyncio.run(scheduler.run(rows, model))
    assert trajectory.turns == 2 and trajectory.total_reward == 1.0 and trajectory.success
    assert "tests: failed" in model.seen[1]
    assert trajectory.rollout_infos["reward_parts"]["tests_passed"] == 1.0
