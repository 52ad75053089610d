"""What the model reads after a coding step (`render_code_observation`): what its code did, then
the test verdict with its feedback, from the ``tests`` metadata of either shape the coding server
sends (``verdict``, or the older ``returncode``)."""

from __future__ import annotations

from typing import Any

import pytest

from envsdk.schedulers.coding import CODE_INSTRUCTIONS, render_code_observation

PROBLEM = {"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f"}
RESET = {"stdout": "", "stderr": "", "exit_code": 0, "metadata": PROBLEM}


def _step(exit_code: int = 0, tests: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    metadata = {**PROBLEM, "tests": tests, **fields.pop("metadata", {})}
    return {"stdout": "", "stderr": "", "exit_code": exit_code, "metadata": metadata, **fields}


def _read(observation: dict[str, Any]) -> list[str]:
    return render_code_observation(observation, RESET).splitlines()


def test_the_reset_shows_the_problem_and_how_to_answer() -> None:
    assert render_code_observation(RESET) == f"{CODE_INSTRUCTIONS}\n\n```python\ndef f():\n```"


def test_a_run_without_an_error_then_failed_tests_reads_as_two_facts() -> None:
    tests = {"passed": False, "verdict": "failed", "output": "AssertionError: f() returned 2, expected 3",
             "seconds": 0.1, "timed_out": False}
    lines = _read(_step(0, tests, stdout="hello\n"))
    assert lines == [
        "your code ran without an error (exit status 0)",
        "stdout:",
        "hello",
        "tests: failed",
        "AssertionError: f() returned 2, expected 3",
    ]


@pytest.mark.parametrize(
    ("exit_code", "metadata", "said"),
    [
        (1, {}, "your code raised an exception (exit status 1)"),
        (3, {}, "your code exited with status 3"),
        (-9, {}, "your code was killed (signal 9)"),
        (-9, {"timed_out": True}, "your code was stopped: it ran past its time limit"),
    ],
)
def test_the_first_line_says_what_the_code_run_did(exit_code: int, metadata: dict[str, Any], said: str) -> None:
    assert _read(_step(exit_code, None, stderr="Traceback ...\nValueError: x\n", metadata=metadata))[0] == said


@pytest.mark.parametrize("verdict", ["error", "timed out"])
def test_a_verdict_other_than_failed_is_said_as_the_server_gives_it(verdict: str) -> None:
    tests = {"passed": False, "verdict": verdict, "output": "why", "seconds": 10.0, "timed_out": verdict == "timed out"}
    lines = _read(_step(0, tests))
    assert lines[-2:] == [f"tests: {verdict}", "why"]


def test_hidden_tests_give_the_verdict_alone() -> None:
    tests = {"passed": False, "verdict": "failed", "output": "", "seconds": 0.1, "timed_out": False}
    assert _read(_step(0, tests))[-1] == "tests: failed"


def test_passed_tests_say_passed() -> None:
    tests = {"passed": True, "verdict": "passed", "output": "", "seconds": 0.1, "timed_out": False}
    assert _read(_step(0, tests))[-1] == "tests: passed"


@pytest.mark.parametrize(
    ("tests", "said"),
    [
        ({"passed": True, "returncode": 0, "output": "", "seconds": 0.1}, ["tests: passed"]),
        ({"passed": False, "returncode": 1, "output": "AssertionError", "seconds": 0.1}, ["tests: failed", "AssertionError"]),
        ({"passed": False, "returncode": -9, "output": "", "seconds": 10.0, "timed_out": True}, ["tests: timed out"]),
    ],
)
def test_the_older_tests_shape_is_read_too(tests: dict[str, Any], said: list[str]) -> None:
    lines = _read(_step(0, tests))
    assert lines[0] == "your code ran without an error (exit status 0)" and lines[-len(said):] == said


def test_before_the_function_is_defined_the_tests_did_not_run() -> None:
    assert _read(_step(0, None))[-1] == "tests: not run yet (f is not defined)"


def test_a_note_of_the_sandbox_is_shown() -> None:
    lines = _read(_step(-9, None, metadata={"timed_out": True, "note": "the interpreter restarted: names are lost"}))
    assert "note: the interpreter restarted: names are lost" in lines
