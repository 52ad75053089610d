"""An env served by the real ``envsdk serve`` and policies loaded by the real ``envsdk rollout``
(as ``file.py:Class``), written into the test's folder: what a user of the evaluation commands has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import (
    serve,  # noqa: F401  (the fixture: servers started and stopped per test)
    user_env,
)

#: An env with graded answers: ``question N`` for seed N; each step sleeps ``$GRADED_STEP_S`` (so a kill
#: can land mid-episode); after ``STEPS`` replies it ends with reward 1 and success when the
#: last reply was "right", reward 0 otherwise.
GRADED_ENV = """\
import os
import time
from envsdk import Environment, Action, Observation, State
from envsdk.server import create_app

STEPS = 2
STEP_S = float(os.environ.get("GRADED_STEP_S", "0.02"))

class Answer(Action):
    message: str

class Question(Observation):
    text: str = ""

class Graded(Environment):
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id=episode_id, step_count=0)
        return Question(text=f"question {seed}")

    def step(self, action: Answer) -> Question:
        time.sleep(STEP_S)
        self._state.step_count += 1
        if self._state.step_count < STEPS:
            return Question(text=f"step {self._state.step_count}: go on")
        right = action.message == "right"
        return Question(text="graded", reward=1.0 if right else 0.0, done=True, metadata={"success": right})

    @property
    def state(self) -> State:
        return self._state

app = create_app(Graded, Answer, Question, max_concurrent_envs=64)
"""

#: Policies: `Scripted` answers the k-th episode of question N from SCRIPT[N][k] (calls counted in
#: this process; the test runs with --concurrency 1 so episodes start in order); `Parity` is
#: deterministic: "right" for even N, "wrong" for odd N, whatever the process.
POLICIES = """\
import json, os, re
from envsdk.policies import Policy

SCRIPT = {int(k): v for k, v in json.loads(os.environ.get("GRADED_SCRIPT", "{}")).items()}

def question(messages):
    for m in messages:
        found = re.search(r"question (\\d+)", str(m.get("content")))
        if found:
            return int(found.group(1))
    raise ValueError(f"no question in {messages}")

class Scripted(Policy):
    def __init__(self):
        self.started = {}

    async def act(self, messages):
        earlier = [m["content"] for m in messages if m["role"] == "assistant"]
        if earlier:
            return earlier[0]
        n = question(messages)
        k = self.started.get(n, 0)
        self.started[n] = k + 1
        return "right" if SCRIPT[n][k] else "wrong"

class Parity(Policy):
    async def act(self, messages):
        return "right" if question(messages) % 2 == 0 else "wrong"
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's folder with ``graded.py`` (the env) and ``policies.py``."""
    (tmp_path / "graded.py").write_text(GRADED_ENV, encoding="utf-8")
    (tmp_path / "policies.py").write_text(POLICIES, encoding="utf-8")
    return tmp_path


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs that played the same thing: wall-clock
    timings and the run id and attempt number."""
    kept = {k: v for k, v in record.items() if k != "timings"}
    kept["eval"] = {k: v for k, v in record["eval"].items() if k not in ("run", "attempt")}
    return kept


def by_pair(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The records of `path` by (example, index); fails if a pair appears twice."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records(path):
        key = (record["eval"]["example"], record["eval"]["index"])
        assert key not in found, f"{key} written twice in {path}"
        found[key] = record
    return found


def grow_to_64_mb(path: Path) -> None:
    """Append 64 copies of the first record of `path`, each made 1 MB long by a long first
    message (a long transcript): 64 MB of valid records, each pair of them written again."""
    big = json.loads(path.read_bytes().splitlines()[0])
    big["messages"][0]["content"] += " " + "x" * 1_000_000
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(big) + "\n" for _ in range(64))


def peak_rss_kb(args: list[str], cwd: Path) -> int:
    """Run `args` in a process of its own and return the largest resident size (KB) of it and of
    what it started, as measured by a parent process that does nothing else."""
    measure = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", measure, *args], cwd=cwd, env=user_env(), capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])
