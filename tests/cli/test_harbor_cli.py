"""The user's path on Harbor tasks, as a user runs it from an empty folder (the installed ``envsdk``
command, real podman containers): ``envsdk rollout --env harbor --tasks DIR`` (a Harbor server
started for the run) and ``--base-url`` of a running ``python -m servers.harbor``, with the oracle
(every repository task 1.0, pass@1 1.000), the do-nothing agent (0.0), an agent that cheats (0.0,
and it never sees the tests), groups with pass@k, ``--resume``, ``envsdk check-env harbor`` and
the ``/web`` page's view of an episode.

Lean: one server per module (its images are built once per store; a later start builds nothing)
and one embedded run, the oracle's over every task."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.formats import tool_result_text
from tests._containers import requires_containers
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import substitute
from tests.cli.conftest import (
    REPO,
    assert_one_line_error,
    envsdk,
    harbor_server,
)

TASKS = REPO / "servers" / "harbor" / "tasks"
NAMES = sorted(p.name for p in TASKS.iterdir() if p.is_dir() and not p.name.startswith("."))

#: An agent that cheats, as a user's plugin: it writes the reward the verifier reads, looks for
#: the tests, plants a test script of its own where they go; then it says it is done.
CHEATER = '''
import json

class Cheater:
    async def act(self, messages):
        if any(m["role"] == "assistant" for m in messages):
            return "I am done."
        calls = [
            ("write_file", {"path": "/logs/verifier/reward.txt", "content": "1"}),
            ("bash", {"command": "ls /tests; cat /tests/test.sh"}),
            ("write_file", {"path": "/tests/test.sh", "content": "echo 1 > /logs/verifier/reward.txt"}),
            ("submit", {}),
        ]
        return "\\n".join(
            f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>" for name, arguments in calls
        )
'''


#: An agent that does a task's work (the oracle's calls) and then says in words that it is done,
#: never calling submit: a reply with no tool call is the agent saying it is done.
WORKER = f'''
import json

from envsdk.policies import HarborOraclePolicy
from servers.harbor.tasks import load_tasks

class Worker:
    def __init__(self):
        self.oracle = HarborOraclePolicy(load_tasks({str(TASKS)!r}))

    async def act(self, messages):
        if any(m["role"] == "assistant" for m in messages):
            return "Done: the machine is as the task asks."
        calls = [(name, arguments) for name, arguments in self.oracle.calls(messages) if name != "submit"]
        return "\\n".join(
            f"<tool_call>{{json.dumps({{'name': name, 'arguments': arguments}})}}</tool_call>" for name, arguments in calls
        )
'''


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _test_lines() -> set[str]:
    """Every line of the repository tasks' tests that says something (what the agent must never read)."""
    lines = set()
    for task in NAMES:
        for file in (TASKS / task / "tests").rglob("*"):
            if file.is_file():
                lines |= {line.strip() for line in file.read_text(encoding="utf-8", errors="replace").splitlines()}
    return {line for line in lines if len(line) >= 24}


@pytest.fixture(scope="module")
def harbor_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m servers.harbor --tasks <repository tasks>`` started from an empty folder."""
    with harbor_server(TASKS, tmp_path_factory.mktemp("server"), seconds=600) as url:
        yield url


@requires_containers
@pytest.mark.timeout(900)
def test_the_oracle_scores_every_repository_task_one_on_a_server_started_for_the_run(tmp_path: Path) -> None:
    # The README's line (and docs/harbor.md's), as a reader runs it from another folder.
    line = commands(doc_block("README.md", "harbor"))[3]
    args = substitute(line, {"servers/harbor/tasks": str(TASKS)}).split()[1:]
    assert args == ["rollout", "--env", "harbor", "--tasks", str(TASKS), "--policy", "oracle"]
    done = envsdk(*args, "--out", "oracle.jsonl", "--no-progress", cwd=tmp_path, timeout=840)
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "oracle.jsonl")
    # Every task once, by default, each named by its task.
    assert sorted(r["eval"]["example"] for r in records) == NAMES
    for record in records:
        assert record["total_reward"] == 1.0 and record["success"] is True, (record["eval"], record["reason"])
        assert record["env_config"]["reset_kwargs"] == {"task": record["eval"]["example"]}
        # Played with native tool calls: its solution written, solve.sh run, then submitted.
        assert record["infos"]["tool_format"] == "native"
    assert f"episodes        {len(NAMES)}" in done.stdout
    assert "pass@1=1.000" in done.stdout, done.stdout


@requires_containers
@pytest.mark.timeout(600)
def test_a_do_nothing_agent_and_a_cheater_score_zero_and_the_cheater_never_sees_the_tests(
    harbor_url: str, tmp_path: Path
) -> None:
    nothing = envsdk("rollout", "--base-url", harbor_url, "--policy", "noop", "--out", "noop.jsonl", "--no-progress",
                     cwd=tmp_path, timeout=540)
    assert nothing.returncode == 0, nothing.stderr
    records = _records(tmp_path / "noop.jsonl")
    assert sorted(r["eval"]["example"] for r in records) == NAMES
    assert all(r["total_reward"] == 0.0 and r["success"] is False for r in records), [r["reason"] for r in records]

    (tmp_path / "cheat.py").write_text(CHEATER, encoding="utf-8")
    cheat = envsdk("rollout", "--base-url", harbor_url, "--policy", "cheat.py:Cheater", "--record", "full",
                   "--out", "cheat.jsonl", "--no-progress", cwd=tmp_path, timeout=540)
    assert cheat.returncode == 0, cheat.stderr
    records = _records(tmp_path / "cheat.jsonl")
    assert sorted(r["eval"]["example"] for r in records) == NAMES
    secret = _test_lines()
    assert len(secret) > 50  # what is looked for below: the tests' own lines
    for record in records:
        task = record["eval"]["example"]
        assert record["total_reward"] == 0.0 and record["success"] is False, (task, record["reason"])
        # Its one reply ended the episode (submit): the answers it never read are the record's steps.
        assert record["status"] == "done" and record["final_observation"] is not None
        answers = "\n".join(tool_result_text(step["observation"]) for step in record["steps"])
        # Its reward file and test script were written; the tests were nowhere to be read.
        assert "wrote 1 bytes to /logs/verifier/reward.txt" in answers and "bytes to /tests/test.sh" in answers
        assert "cat: /tests/test.sh: No such file or directory" in answers, answers
        seen = json.dumps(record)
        leaked = [line for line in secret if line in seen]
        assert not leaked, (task, leaked[:3])


@requires_containers
@pytest.mark.timeout(600)
def test_an_agent_that_says_it_is_done_without_submitting_is_judged_by_the_tests(harbor_url: str, tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER, encoding="utf-8")
    done = envsdk("rollout", "--base-url", harbor_url, "--policy", "worker.py:Worker", "--limit", "2",
                  "--out", "worker.jsonl", "--no-progress", cwd=tmp_path, timeout=540)
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "worker.jsonl")
    assert sorted(r["eval"]["example"] for r in records) == NAMES[:2]
    for record in records:
        # Its last reply called no tool: the scheduler submitted for it, and the tests judged the work.
        assert record["total_reward"] == 1.0 and record["success"] is True, (record["eval"], record["reason"])
        assert record["infos"]["submitted"] == "by the scheduler"
        assert [m["role"] for m in record["messages"]][-1] == "assistant"


@requires_containers
@pytest.mark.timeout(600)
def test_groups_report_pass_at_k_and_resume_plays_only_what_is_missing(harbor_url: str, tmp_path: Path) -> None:
    first = envsdk(
        "rollout", "--base-url", harbor_url, "--tasks", str(TASKS), "--policy", "oracle", "--limit", "2",
        "--rollouts-per-example", "2", "--out", "groups.jsonl", "--no-progress", cwd=tmp_path, timeout=540,
    )
    assert first.returncode == 0, first.stderr
    assert "pass@k          pass@1=1.000  pass@2=1.000" in first.stdout, first.stdout
    records = (tmp_path / "groups.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(records) == 4
    # The run was cut short: its last record never got written.
    (tmp_path / "groups.jsonl").write_text("\n".join(records[:3]) + "\n", encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--out", "groups.jsonl", "--no-progress", cwd=tmp_path, timeout=540)
    assert resumed.returncode == 0, resumed.stderr
    assert "episodes        1\n" in resumed.stdout and "attempt 2" in resumed.stdout, resumed.stdout
    played = _records(tmp_path / "groups.jsonl")
    assert sorted((r["eval"]["example"], r["eval"]["index"]) for r in played) == [
        (name, index) for name in NAMES[:2] for index in (0, 1)
    ]
    assert all(r["total_reward"] == 1.0 for r in played)
    summary = json.loads((tmp_path / "groups.eval.json").read_text(encoding="utf-8"))
    assert summary["pass_at_k"] == {"1": 1.0, "2": 1.0}, summary


@requires_containers
@pytest.mark.timeout(600)
def test_check_env_passes_every_rule_on_the_repository_tasks(tmp_path: Path) -> None:
    # docs/harbor.md's line, its task folder given as a path from here.
    line = commands(doc_block("docs/harbor.md", "harbor-serve"))[2]
    args = shlex.split(substitute(line, {"servers/harbor/tasks": str(TASKS)}))[1:]
    assert args[:3] == ["check-env", "harbor", "--tasks"] and '{"tool": "submit"}' in args
    checked = envsdk(*args, cwd=tmp_path, timeout=540)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "14 rules passed, 0 skipped" in checked.stdout and "0 warnings" in checked.stdout, checked.stdout


@requires_containers
@pytest.mark.timeout(300)
def test_the_web_page_shows_a_harbor_episode_as_the_model_reads_it(harbor_url: str) -> None:
    from envsdk.client import OpenEnvWrapper

    page = httpx.get(f"{harbor_url}/web", timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    info = httpx.get(f"{harbor_url}/web/api/info", timeout=60).json()
    assert {tool["name"] for tool in info["tools"]} == {"bash", "read_file", "write_file", "submit"}
    task = NAMES[0]
    with OpenEnvWrapper(harbor_url) as client:
        shown = []
        for observation in (
            client.reset(task=task).observation,
            client.step({"tool": "bash", "command": "echo hello from the machine"}).observation,
            client.step({"tool": "submit"}).observation,
        ):
            view = httpx.post(f"{harbor_url}/web/api/render", json={"observation": observation}, timeout=30).json()
            shown.append(view["text"])
    instruction = (TASKS / task / "instruction.md").read_text(encoding="utf-8").strip()
    assert shown[0].startswith(f"# {task}") and instruction in shown[0]
    assert "hello from the machine" in shown[1] and not shown[1].lstrip().startswith("{")
    assert "episode over: submit" in shown[2]


@requires_containers
@pytest.mark.timeout(120)
def test_harbor_options_a_run_cannot_use_are_refused_in_one_line(harbor_url: str, tmp_path: Path) -> None:
    assert_one_line_error(envsdk("rollout", "--env", "harbor", cwd=tmp_path), "--tasks DIR", "--base-url")
    assert_one_line_error(
        envsdk("rollout", "--env", "harbor", "--tasks", "no-such-folder", cwd=tmp_path), "--tasks", "no-such-folder",
    )
    assert_one_line_error(envsdk("rollout", "--env", "sudoku", "--tasks", str(TASKS), cwd=tmp_path), "--tasks", "sudoku")
    assert_one_line_error(
        envsdk("rollout", "--base-url", harbor_url, "--policy", "oracle", cwd=tmp_path), "--policy oracle", "--tasks DIR",
    )
    assert_one_line_error(envsdk("check-env", "harbor", cwd=tmp_path), "harbor", "--tasks DIR")
    # None of them wrote a record.
    assert not list(tmp_path.glob("*.jsonl"))


@requires_containers
@pytest.mark.timeout(600)
def test_the_text_tool_form_plays_on_a_harbor_server_started_for_the_run(tmp_path: Path) -> None:
    """docs/harbor.md: a model without native tool calls plays with ``--tool-format text``; the
    embedded server is a tool server like a running one (it was refused as 'not one')."""
    done = envsdk("rollout", "--env", "harbor", "--tasks", str(TASKS), "--policy", "oracle", "--limit", "1",
                  "--tool-format", "text", "--out", "text.jsonl", "--no-progress", cwd=tmp_path, timeout=540)
    assert done.returncode == 0, done.stderr
    [record] = _records(tmp_path / "text.jsonl")
    assert record["infos"]["tool_format"] == "text" and record["total_reward"] == 1.0, record["reason"]
    assert "<tool_call>" in [m for m in record["messages"] if m["role"] == "assistant"][0]["content"]
