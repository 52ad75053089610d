"""The Harbor server's parts that need no container: how a verifier's reward files are read
(Harbor's rules, plus short part names and a bound on the numbers; a broken file is one line
naming the task and the file), what of the verdict goes to the client, the step action's
arguments, what the agent reads of a command, and the command line's usage errors."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from pydantic import ValidationError

from envsdk.sandbox import CompletedRun
from servers.harbor.environment import (
    LOGS_TMPFS_BYTES,
    TESTS_TMPFS_MARGIN,
    HarborLimits,
    HarborTasks,
    Verdict,
    _bash_outcome,
    parse_reward,
)
from servers.harbor.models import HarborAction
from servers.harbor.tasks import TaskError, read_task

FIXTURES = Path(__file__).parent / "harbor_fixtures"
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "reward", "parts"),
    [
        (None, b"1\n", 1.0, {}),
        (None, b" 0.25 ", 0.25, {}),
        (b'{"reward": 0.5, "a": 1, "b": 0}', None, 0.5, {"a": 1.0, "b": 0.0}),
        # reward.json wins over reward.txt, as in Harbor, and its non-numbers are left out.
        (b'{"reward": 0.0, "note": "x", "ok": true}', b"1", 0.0, {}),
        # No "reward" key: reward.txt's number is the reward, the JSON's numbers its parts.
        (b'{"a": 1, "b": 0}', b"0.5", 0.5, {"a": 1.0, "b": 0.0}),
        # One number alone is the reward.
        (b'{"score": 0.75}', None, 0.75, {"score": 0.75}),
    ],
)
def test_the_reward_is_read_as_harbor_reads_it(
    reward_json: bytes | None, reward_txt: bytes | None, reward: float, parts: dict[str, float]
) -> None:
    assert parse_reward("t", reward_json, reward_txt) == (reward, parts)


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "said"),
    [
        (None, None, "task t: tests/test.sh: wrote no reward (/logs/verifier/reward.txt or reward.json)"),
        (None, b"passed!\n", "task t: /logs/verifier/reward.txt: not a number: 'passed!'"),
        (None, b"nan", "task t: /logs/verifier/reward.txt: nan is not a finite number"),
        (None, b"-inf", "task t: /logs/verifier/reward.txt: -inf is not a finite number"),
        (None, b"\n", "task t: /logs/verifier/reward.txt: empty"),
        (b"{reward: 1}", None, "task t: /logs/verifier/reward.json: not JSON: '{reward: 1}'"),
        (b"[1]", None, "task t: /logs/verifier/reward.json: must be a JSON object of named numbers, got '[1]'"),
        (b'{"reward": NaN}', None, "task t: /logs/verifier/reward.json: 'reward' is 'nan', not a finite number"),
        (b'{"reward": 1e999}', None, "task t: /logs/verifier/reward.json: 'reward' is 'inf', not a finite number"),
        (b'{"reward": 1' + b"0" * 400 + b"}", None, "task t: /logs/verifier/reward.json: 'reward' is '1000000000"),
        (b"[" * 100_000, None, "task t: /logs/verifier/reward.json: not JSON: '[[[["),
        (b'{"a": 1, "b": 0}', None, "task t: /logs/verifier/reward.json: 2 numbers and no 'reward' among them"),
        (b'{"note": "no number"}', None, "task t: /logs/verifier/reward.json: 0 numbers and no 'reward' among them"),
        (b'{"a": 1, "b": 0}', b"oops", "task t: /logs/verifier/reward.txt: not a number: 'oops'"),
    ],
)
def test_a_reward_that_cannot_be_read_is_one_line_naming_the_file(
    reward_json: bytes | None, reward_txt: bytes | None, said: str
) -> None:
    with pytest.raises(TaskError) as caught:
        parse_reward("t", reward_json, reward_txt)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "reward", "parts"),
    [
        # Part names are short identifiers; the reward may be any number up to the bound.
        (b'{"reward": 1, "tests.passed": 3, "unit:io-2": 1, "A_b": 0}', None, 1.0,
         {"tests.passed": 3.0, "unit:io-2": 1.0, "A_b": 0.0}),
        (b'{"reward": -1000000, "' + b"n" * 64 + b'": 1e6}', None, -1e6, {"n" * 64: 1e6}),
        (None, b"1e6", 1e6, {}),
        # 32 numbers in all, the reward among them; the names of fields that are no number are
        # never sent, so they are not checked.
        (b"{" + b", ".join(b'"p%d": 1' % n for n in range(31)) + b', "reward": 1, "a note!": "x"}', None, 1.0,
         {f"p{n}": 1.0 for n in range(31)}),
    ],
)
def test_reward_json_parts_are_short_names_and_numbers_within_the_bound(
    reward_json: bytes | None, reward_txt: bytes | None, reward: float, parts: dict[str, float]
) -> None:
    assert parse_reward("t", reward_json, reward_txt) == (reward, parts)


# What a verifier's hook (or a broken test) could put in reward.json: the text of the tests.
LEAK = "LEAK /tests/expected_report.txt: 66 E1001 51 E2041 42 E4004 SECRET-TAIL-" + "x" * 200 + " END-OF-TESTS"


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "said"),
    [
        (f'{{"reward": 1, "{LEAK}": 0}}'.encode(), None,
         "task t: /logs/verifier/reward.json: part name 'LEAK /tests/expected_report"),
        (b'{"reward": 1, "a b": 0}', None, "task t: /logs/verifier/reward.json: part name 'a b' is not a short name"),
        (b'{"reward": 1, "": 0}', None, "task t: /logs/verifier/reward.json: part name '' is not a short name"),
        (b'{"reward": 1, "' + b"n" * 65 + b'": 0}', None, "task t: /logs/verifier/reward.json: part name 'nnnn"),
        ('{"reward": 1, "caf\u00e9": 0}'.encode(), None, "task t: /logs/verifier/reward.json: part name 'caf\\xe9'"),
        (b'{"reward": 1, "line\\nbreak": 0}', None, "task t: /logs/verifier/reward.json: part name 'line\\nbreak'"),
        # The name is judged before the value: a NaN does not bring it into the message whole.
        (f'{{"{LEAK}": NaN}}'.encode(), None, "task t: /logs/verifier/reward.json: part name 'LEAK"),
        (b"{" + b", ".join(b'"p%d": 1' % n for n in range(33)) + b"}", None,
         "task t: /logs/verifier/reward.json: 33 numbers, more than 32"),
        # Rewards past the bound: a broken (or subverted) verifier, never a trainer's signal.
        (None, b"1e300", "task t: /logs/verifier/reward.txt: 1e+300 is past the bound on a reward (1e+06 either way)"),
        (None, b"-1000001", "task t: /logs/verifier/reward.txt: -1000001.0 is past the bound"),
        (b'{"reward": 1e300}', None, "task t: /logs/verifier/reward.json: 'reward' is 1e+300, past the bound"),
        (b'{"reward": 1, "mean": -2e6}', None, "task t: /logs/verifier/reward.json: 'mean' is -2000000.0, past the bound"),
        (b'{"reward": 1' + b"0" * 400 + b"}", None, "task t: /logs/verifier/reward.json: 'reward' is '1000000000"),
        # Text that float() reads as infinity is shown cut short too (its digits could carry text).
        (None, b"9" * 5000, "task t: /logs/verifier/reward.txt: 99999999"),
    ],
)
def test_a_reward_json_that_could_carry_text_or_an_absurd_number_is_a_broken_verifier(
    reward_json: bytes | None, reward_txt: bytes | None, said: str
) -> None:
    with pytest.raises(TaskError) as caught:
        parse_reward("t", reward_json, reward_txt)
    message = str(caught.value)
    assert message.startswith(said) and "\n" not in message
    # Never more than a short excerpt of what the verifier wrote goes back to the client.
    assert len(message) < 200 and "SECRET-TAIL" not in message and "END-OF-TESTS" not in message


def test_the_verdict_sends_numbers_only() -> None:
    # Of the verifier's run, the client gets its exit status and whether it timed out (its
    # seconds go with the step's timings); its output stays in the server's log, and the part
    # names are short identifiers (above).
    verdict = Verdict(reward=1.0, parts={"a": 1.0}, exit_code=3, seconds=1.5, timed_out=False)
    assert verdict.wire() == {"exit_code": 3, "timed_out": False}
    assert {f.name for f in fields(Verdict)} == {"reward", "parts", "exit_code", "seconds", "timed_out", "tampered"}


@pytest.mark.parametrize(
    ("action", "said"),
    [
        ({"tool": "bash"}, "bash takes command; missing: command"),
        ({"tool": "write_file", "path": "/a"}, "write_file takes path, content; missing: content"),
        ({"tool": "submit", "command": "ls"}, "submit takes no argument; not taken: command"),
        ({"tool": "read_file", "path": "/a", "content": "x"}, "read_file takes path; not taken: content"),
        ({"tool": "rm"}, "Input should be 'bash', 'read_file', 'write_file' or 'submit'"),
    ],
)
def test_a_step_action_carries_exactly_its_tools_arguments(action: dict[str, str], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        HarborAction.model_validate(action)
    assert HarborAction(tool="write_file", path="a", content="").arguments() == {"path": "a", "content": ""}


def _run(stdout: bytes, stderr: bytes = b"", returncode: int = 0, timed_out: bool = False, **kw: object) -> CompletedRun:
    fields: dict[str, object] = {
        "args": "x", "returncode": returncode, "stdout": stdout, "stderr": stderr, "stdout_bytes": len(stdout),
        "stderr_bytes": len(stderr), "timed_out": timed_out, "duration_s": 0.1,
    }
    return CompletedRun(**{**fields, **kw})  # type: ignore[arg-type]


def test_what_the_agent_reads_of_a_command() -> None:
    assert _bash_outcome(_run(b"hi\n"), 10, 100).text == "hi\n"
    failed = _bash_outcome(_run(b"out", b"bad\n", 2), 10, 100)
    assert (failed.text, failed.exit_code) == ("out\nbad\n[exit status 2]", 2)
    stopped = _bash_outcome(_run(b"", b"", -9, True), 2.5, 100)
    assert stopped.text == "[stopped: the command ran past 2.5 s]" and stopped.timed_out
    assert _bash_outcome(_run(b""), 10, 100).text == "[no output]"
    # A long output shows its start and its end, and says how much there was.
    long = _bash_outcome(_run(b"a" * 500 + b"z" * 500, stdout_bytes=5000), 10, 100)
    assert long.truncated and long.text.startswith("a" * 50 + "\n[...]\n" + "z" * 50)
    assert long.text.endswith("[output cut: 5000 bytes written, the start and end shown]")


def test_limits_are_checked_and_cover_a_command_then_the_verifier() -> None:
    limits = HarborLimits(command_timeout_s=20, max_verifier_timeout_s=30)
    assert limits.step_timeout_s > 20 + 30
    with pytest.raises(ValueError, match="HarborLimits.max_cpus must be a positive number, got 0"):
        HarborLimits(max_cpus=0)
    with pytest.raises(ValueError, match="HarborLimits.pids must be a whole number, got 2.5"):
        HarborLimits(pids=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps must be at most 10000"):
        HarborLimits(max_steps=10_001)


def test_the_verifiers_folders_are_tmpfs_mounts_sized_by_the_task_and_counted_in_its_memory() -> None:
    task = read_task(FIXTURES / "minimal")
    limits = HarborLimits().container_limits(task)
    (logs, logs_bytes), (tests, tests_bytes) = limits.tmpfs
    files = sum(path.stat().st_size for path in task.tests_dir.rglob("*") if path.is_file())
    assert (logs, logs_bytes, tests) == ("/logs", LOGS_TMPFS_BYTES, "/tests")
    assert files + TESTS_TMPFS_MARGIN < tests_bytes < files + TESTS_TMPFS_MARGIN + (64 << 10)
    assert limits.container_memory_mb == limits.memory_mb + limits.storage_mb + 48 + 16 + 17


def test_a_broken_tasks_error_longer_than_the_wire_keeps_is_cut_after_a_clause(tmp_path: Path) -> None:
    (tmp_path / "minimal").symlink_to(FIXTURES / "minimal")
    tasks = HarborTasks(tmp_path, provider=None)  # type: ignore[arg-type]  # no image is built here
    problem = (
        "FROM registry.invalid/nobody/not-here:1.0: not in the container store and no registry is used (builds are "
        "offline): map it to a local image in an image map file named by ENVSDK_IMAGE_MAP (a TOML line "
        '"registry.invalid/nobody/not-here:1.0" = "<local image>"), or start from a base image built here'
    )
    tasks.broken["minimal"] = TaskError("minimal", "environment/Dockerfile", problem)
    with pytest.raises(TaskError) as caught:
        tasks.task("minimal")
    assert str(caught.value) == (
        "task minimal: environment/Dockerfile: FROM registry.invalid/nobody/not-here:1.0: not in the container store "
        "and no registry is used (builds are offline) (the whole error is in the server's log from its start)"
    )
    assert len(str(caught.value)) <= 256
    short = TaskError("minimal", "task.toml", "missing")
    tasks.broken["minimal"] = short
    with pytest.raises(TaskError) as caught:
        tasks.task("minimal")
    assert caught.value is short


def _command(*args: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servers.harbor", *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(REPOSITORY), "PATH": "/usr/bin:/bin", **variables},
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "--tasks DIR (or HARBOR_TASKS) is required"),
        (("--tasks", "nowhere"), "tasks folder 'nowhere' does not exist"),
        (("--tasks", str(FIXTURES), "--max-steps", "10001"), "--max-steps 10001 is more than 10000"),
        (("--tasks", str(FIXTURES), "--command-timeout", "0"), "--command-timeout: expected a number > 0, got '0'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = _command(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr.splitlines()[-1]


@pytest.mark.timeout(120)
def test_a_tamper_check_variable_that_is_no_switch_is_a_usage_error(tmp_path: Path) -> None:
    # Read as "on" it would hide a typo of "off"; read as "off" it would drop the check unasked.
    done = _command("--tasks", str(FIXTURES), cwd=tmp_path, HARBOR_TAMPER_CHECK="maybe")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "python -m servers.harbor: error: HARBOR_TAMPER_CHECK must be 1 or 0 (true/false, yes/no, on/off), got 'maybe'"
    )
