"""What `envsdk rollout` records of Harbor episodes played with tools (the installed ``envsdk``
command from an empty folder, a real Harbor server and podman containers): a ``reward.json``'s
named parts are the record's ``reward_components``, as any rubric's; a verifier that gives no
reward (NaN, garbage, none written) makes its episode an error (status ``error``, the server's
one-line reason, ``error_kind``), counted under "errors" and in the exit status as any other
error, never an ordinary episode that scored 0.0.

Lean: one server per module, on four small fixture tasks; each run plays one to four episodes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._containers import requires_containers
from tests.cli.conftest import REPO, envsdk, harbor_server

pytestmark = requires_containers

FIXTURES = REPO / "tests" / "servers" / "harbor_fixtures"
#: A task whose reward.json has named parts, and three whose verifier gives no reward.
TASKS = ("parts", "reward-nan", "reward-garbage", "no-reward")
BROKEN = {
    "reward-nan": "reward.txt: nan is not a finite number",
    "reward-garbage": "reward.txt",
    "no-reward": "wrote no reward",
}


#: An agent that stops at once, saying so in words: the scheduler submits for it.
STOPPER = """
class Stopper:
    async def act(self, messages):
        return "I am done."
"""


def _stop(url: str, tmp_path: Path, task: str, out: str) -> Any:
    """`STOPPER` played on `task` (one episode) of the server at `url` by ``envsdk rollout`` from `tmp_path`."""
    (tmp_path / "stopper.py").write_text(STOPPER, encoding="utf-8")
    return envsdk("rollout", "--base-url", url, "--policy", "stopper.py:Stopper", "--env-config",
                  json.dumps({"reset_kwargs": {"task": task}}), "--episodes", "1", "--out", out, "--no-progress",
                  cwd=tmp_path, timeout=240)


def _records(path: Path) -> dict[str, dict[str, Any]]:
    """The records of `path` by task."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {r["env_config"]["reset_kwargs"]["task"]: r for r in records}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tasks")
    for name in TASKS:
        shutil.copytree(FIXTURES / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def harbor_url(tasks: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m servers.harbor --tasks <the four>`` started from an empty folder."""
    with harbor_server(tasks, tmp_path_factory.mktemp("server"), seconds=300) as url:
        yield url


def _assert_broken(record: dict[str, Any], task: str) -> None:
    """The record of an episode whose verifier gave no reward: an error saying why, in one line."""
    assert record["status"] == "error", (task, record["status"], record["reason"])
    assert record["error_kind"] == "ToolCallError", record["error_kind"]
    reason = record["reason"]
    assert "\n" not in reason and f"task {task}" in reason and BROKEN[task] in reason, reason
    assert record["success"] is None and record["reward_components"] == {}, record


@pytest.mark.timeout(400)
def test_the_oracle_records_named_parts_and_broken_verifiers_as_errors(harbor_url: str, tasks: Path, tmp_path: Path) -> None:
    run = envsdk("rollout", "--base-url", harbor_url, "--tasks", str(tasks), "--policy", "oracle", "--out", "o.jsonl",
                 "--no-progress", cwd=tmp_path, timeout=360)
    # One episode ran to its verdict: the run succeeded, as a run with some errors does.
    assert run.returncode == 0, run.stderr
    records = _records(tmp_path / "o.jsonl")
    assert sorted(records) == sorted(TASKS)
    parts = records["parts"]
    assert parts["status"] == "done" and parts["total_reward"] == 1.0 and parts["success"] is True, parts["reason"]
    # reward.json's other numbers, each on the step that ended the episode (the submit).
    components = parts["reward_components"]
    assert sorted(components) == ["a", "b", "weight"], components
    for value in components.values():
        assert value["value"] == 1.0
        assert value["steps"][-1] == 1.0 and set(value["steps"][:-1]) <= {None}, value
    for task in BROKEN:
        _assert_broken(records[task], task)
    assert "statuses        done=1, error=3" in run.stdout, run.stdout
    assert "errors          ToolCallError=3" in run.stdout, run.stdout
    assert "reward components (3)" in run.stdout, run.stdout


@pytest.mark.timeout(300)
def test_an_agent_that_stops_is_submitted_for_and_its_record_keeps_the_parts(harbor_url: str, tmp_path: Path) -> None:
    run = _stop(harbor_url, tmp_path, "parts", "s.jsonl")
    assert run.returncode == 0, run.stderr
    record = _records(tmp_path / "s.jsonl")["parts"]
    assert record["status"] == "done" and record["infos"]["submitted"] == "by the scheduler", record["infos"]
    assert record["total_reward"] == 0.0 and record["success"] is False
    assert {name: v["value"] for name, v in record["reward_components"].items()} == {"a": 0.0, "b": 0.0, "weight": 1.0}
    # The scheduler's submit ended the episode: its verdict is the record's final observation.
    assert "[episode over: submitted; reward 0]" in json.dumps(record["final_observation"]), record["final_observation"]


@pytest.mark.timeout(300)
def test_a_run_whose_every_verifier_is_broken_fails_as_a_run_of_errors_does(harbor_url: str, tmp_path: Path) -> None:
    run = _stop(harbor_url, tmp_path, "reward-nan", "e.jsonl")
    assert run.returncode == 1, (run.stdout, run.stderr)
    _assert_broken(_records(tmp_path / "e.jsonl")["reward-nan"], "reward-nan")
    # As for any run of errors: the episode's error logged when it ends, then the run's one line.
    assert "Traceback" not in run.stderr, run.stderr
    failed = [line for line in run.stderr.splitlines() if line.startswith("envsdk rollout: error:")]
    assert len(failed) == 1 and "ToolCallError" in failed[0] and "task reward-nan" in failed[0], run.stderr
    assert "errors          ToolCallError=1" in run.stdout, run.stdout
