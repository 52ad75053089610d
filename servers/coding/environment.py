"""`CodingEnvironment`: HumanEval problems solved by code run in a sandbox, on OpenEnv's coding wire.

One sandbox per session, taken from a warm `SandboxPool` at reset and closed with the episode
(or the session): a fresh interpreter for every episode, so nothing leaks between episodes.
A step runs the action's code in the sandbox's persistent interpreter; then, when the program
so far (every step that exited 0, in order) defines the problem's entry point, that program is
verified (`envsdk.verify.verify_function`): it runs again in a fresh process of the sandbox
and only answers calls to its function, while the problem's tests run in a verifier process
on the host that the program cannot reach, and only exact builtin values cross between them.
Reward: 1.0 on the step where the tests first pass (the episode is then done), else 0.0.
Parts on the wire (``metadata.reward_components``): ``compiles`` (the step's code parses),
``tests_passed``; and ``metadata.timings.time_s``, seconds the step's code and its verification
took (a latency, kept with the record's timings, never a part of the reward).

What a failed verification shows (``metadata.tests.output``): the program's own error (its
traceback, its own frames only), never the tests; with ``show_failed_test`` (a reset option or
a server option) also the line of the tests that failed.

Every method is a plain function: the server runs it on the session's lane with its deadline,
and every sandbox call has its own (shorter) deadline inside.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from envsdk.env import Environment
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.protocol import ErrorCode, FrameError, shorten_input
from envsdk.rewards.parts import REWARD_COMPONENTS, TIMINGS
from envsdk.sandbox import CompletedRun, Sandbox, SandboxError, SandboxPool
from envsdk.schedulers.coding import render_code_observation
from envsdk.tools import tool
from envsdk.web import WebView
from envsdk.verify import VERIFY_TIMEOUT_S, VERIFY_WALL_TIMEOUT_S, Verdict, verify_function
from servers.coding.models import CodeAction, CodeObservation, CodeState
from envsdk.games.humaneval import Problem, humaneval

__all__ = ["CodingEnvironment", "CodingOptionError", "MAX_STEPS"]

_T = TypeVar("_T")

#: Default most steps of one episode (a reset option changes it, up to `MAX_STEPS_LIMIT`).
MAX_STEPS = 8
MAX_STEPS_LIMIT = 64
#: How much of a test run's output the observation keeps.
TEST_OUTPUT_CHARS = 4000


class CodingOptionError(FrameError, ValueError):
    """A reset option has a value the coding server cannot use: the client's mistake, answered
    VALIDATION_ERROR (as the game servers answer theirs), not an execution error with a logged
    traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.VALIDATION_ERROR, shorten_input(message))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class CodingEnvironment(Environment[CodeAction, CodeObservation, CodeState]):
    """HumanEval in a sandbox: run Python, pass the problem's tests (see the module docstring)."""

    # A step runs the code, then the tests: two sandbox deadlines and the agent's grace.
    step_timeout_s: ClassVar[float] = 60.0
    reset_timeout_s: ClassVar[float] = 60.0
    close_timeout_s: ClassVar[float] = 15.0

    def __init__(
        self, pool: SandboxPool, *, max_steps: int = MAX_STEPS, verify_timeout_s: int = VERIFY_TIMEOUT_S,
        verify_wall_timeout_s: float = VERIFY_WALL_TIMEOUT_S, show_failed_test: bool = False,
    ) -> None:
        self._pool = pool
        self._default_max_steps = max_steps
        self._max_steps = max_steps
        self._verify_timeout_s = verify_timeout_s
        self._verify_wall_timeout_s = verify_wall_timeout_s
        self._default_show_failed_test = show_failed_test
        self._show_failed_test = show_failed_test
        self._sandbox: Sandbox | None = None
        self._problem: Problem | None = None
        self._program: list[str] = []
        self._state = CodeState(sandbox=pool.provider.name)
        self._done = False

    # ---------------------------------------------------------------- OpenEnv calls

    def reset(  # type: ignore[override]
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        *,
        task_id: str | None = None,
        max_steps: int | None = None,
        show_failed_test: bool | None = None,
    ) -> CodeObservation:
        """Start an episode on a HumanEval problem: `task_id` (``"HumanEval/7"``), else the
        problem ``seed % 164``, else a random one. `max_steps` (1..64, default 8).
        `show_failed_test`: a failed verification also shows the test line that failed
        (default: the server's choice, hidden unless it was started with it)."""
        problem = self._pick(seed, task_id)
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= MAX_STEPS_LIMIT):
            raise CodingOptionError(f"max_steps must be an integer from 1 to {MAX_STEPS_LIMIT}, got {max_steps!r}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise CodingOptionError(f"episode_id must be a string, got {episode_id!r}")
        if show_failed_test is not None and not isinstance(show_failed_test, bool):
            raise CodingOptionError(f"show_failed_test must be true or false, got {show_failed_test!r}")
        self._show_failed_test = self._default_show_failed_test if show_failed_test is None else show_failed_test
        self._release()
        self._sandbox = self._pool.take()
        self._problem, self._program, self._done = problem, [], False
        self._max_steps = max_steps or self._default_max_steps
        self._state = CodeState(
            episode_id=episode_id or uuid.uuid4().hex, task_id=problem.task_id, sandbox=self._pool.provider.name
        )
        return CodeObservation(metadata=self._problem_info())

    def step(self, action: CodeAction) -> CodeObservation:
        """Run `action.code` in the interpreter, then the tests when the entry point is defined."""
        sandbox, problem = self._running()
        compiles = _compiles(action.code)
        run = self._run(lambda: sandbox.run_python(action.code))
        if run.returncode == 0:
            self._program.append(action.code)
        tests = self._tests(sandbox, problem, "\n\n".join(self._program)) if self._defines_entry(problem) else None
        passed = bool(tests and tests["passed"])
        return self._observe(run, compiles, tests, passed, run.duration_s + (tests["seconds"] if tests else 0.0))

    @property
    def state(self) -> CodeState:
        return self._state

    def close(self) -> None:
        self._release()

    # ---------------------------------------------------------------- tools (MCP)

    @tool
    def run_python(self, code: str) -> dict[str, Any]:
        """Run Python code in the episode's persistent interpreter.

        Args:
            code: Python source; names it defines stay for later calls.

        Returns:
            stdout, stderr and exit_code (0 ok, 1 an exception, negative: killed).
        """
        observation = self.step(CodeAction(code=code))
        return {"stdout": observation.stdout, "stderr": observation.stderr, "exit_code": observation.exit_code}

    @tool
    def run_tests(self) -> dict[str, Any]:
        """Verify the program written so far (every call that exited 0) against the problem's
        hidden tests.

        Returns:
            passed, verdict (passed, failed, error or timed out), output (the program's own
            error; the failed test line only where the server shows it) and seconds.
        """
        sandbox, problem = self._running(allow_done=True)
        return self._tests(sandbox, problem, "\n\n".join(self._program))

    @tool
    def submit(self, code: str) -> dict[str, Any]:
        """Submit a complete solution: the problem's tests run on `code` alone and the episode ends.

        Args:
            code: The whole program (the function with its imports).

        Returns:
            passed, verdict, output and seconds, as run_tests; the reward is 1.0 when passed.
        """
        sandbox, problem = self._running()
        tests = self._tests(sandbox, problem, code)
        self._state.step_count += 1
        self._finish(bool(tests["passed"]))
        self._done = True
        return tests

    # ---------------------------------------------------------------- web page

    @staticmethod
    def render_web(observation: CodeObservation) -> WebView:
        """The /web page's view of an observation: the characters a model reads of it (the
        coding scheduler's rendering), under the problem's task id."""
        stepped = REWARD_COMPONENTS in observation.metadata
        text = render_code_observation(observation.model_dump(), {} if stepped else None)
        return WebView(text=f"# {observation.metadata.get('task_id', '')}\n{text}")

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _pick(seed: int | None, task_id: str | None) -> Problem:
        problems = humaneval()
        if task_id is not None:
            for problem in problems:
                if problem.task_id == task_id:
                    return problem
            raise CodingOptionError(f"unknown task_id {task_id!r}: HumanEval/0 .. HumanEval/{len(problems) - 1}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise CodingOptionError(f"seed must be an integer, got {seed!r}")
        index = seed % len(problems) if seed is not None else random.SystemRandom().randrange(len(problems))
        return problems[index]

    def _running(self, allow_done: bool = False) -> tuple[Sandbox, Problem]:
        if self._sandbox is None or self._problem is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._done and not allow_done:
            raise EpisodeDoneError(
                "The episode is over (tests passed, submitted or out of steps); reset to start another",
                code=ErrorCode.EPISODE_DONE.value,
            )
        return self._sandbox, self._problem

    def _run(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except SandboxError:
            # The sandbox itself is gone (its code killed the agent, or it hung): the episode
            # cannot go on in it.
            self._release()
            self._done = True
            raise

    def _defines_entry(self, problem: Problem) -> bool:
        return any(problem.entry_point in cell for cell in self._program)

    def _tests(self, sandbox: Sandbox, problem: Problem, program: str) -> dict[str, Any]:
        """Verify `program` on `problem` (see the module docstring): the verdict as
        ``metadata.tests`` carries it."""
        verdict: Verdict = self._run(
            lambda: verify_function(
                sandbox, program, problem.function_tests, timeout_s=self._verify_timeout_s,
                wall_timeout_s=self._verify_wall_timeout_s,
            )
        )
        output = verdict.feedback
        if self._show_failed_test and verdict.failed_test:
            output = f"{output}\nfailed test: {verdict.failed_test}".lstrip()
        return {
            "passed": verdict.passed,
            "verdict": verdict.verdict,
            "output": output[-TEST_OUTPUT_CHARS:],
            "seconds": round(verdict.seconds, 4),
            "timed_out": verdict.timed_out,
        }

    def _finish(self, passed: bool) -> None:
        if passed:
            self._state.solved = True
            self._state.reward = 1.0

    def _observe(
        self, run: CompletedRun, compiles: bool, tests: dict[str, Any] | None, passed: bool, seconds: float
    ) -> CodeObservation:
        state = self._state
        state.step_count += 1
        state.last_exit_code = run.returncode
        first_pass = passed and not state.solved
        self._finish(passed)
        self._done = passed or state.step_count >= self._max_steps
        metadata = {
            **self._problem_info(),
            "tests": tests,
            "timed_out": run.timed_out,
            "truncated": run.truncated,
            "note": run.note,
            REWARD_COMPONENTS: {"compiles": float(compiles), "tests_passed": float(passed)},
            # A latency, not a part of the reward: records keep it with their timings.
            TIMINGS: {"time_s": round(seconds, 4)},
        }
        return CodeObservation(
            stdout=_text(run.stdout), stderr=_text(run.stderr), exit_code=run.returncode,
            reward=1.0 if first_pass else 0.0, done=self._done, metadata=metadata,
        )

    def _problem_info(self) -> dict[str, Any]:
        assert self._problem is not None
        return {"task_id": self._problem.task_id, "prompt": self._problem.prompt, "entry_point": self._problem.entry_point}

    def _release(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()


def _compiles(code: str) -> bool:
    """Whether `code` compiles, as the sandbox's ``exec(compile(...))`` will find: the compiler's
    own errors (``return`` outside a function) count, and a program nested too deeply to compile
    is an answer, not an error. Compiled to bytecode, never to `ast` objects: `ast.parse` keeps
    a process-wide depth counter while it builds them (CPython 3.11), and two lane threads
    parsing at once could fail with ``SystemError: AST constructor recursion depth mismatch``."""
    try:
        compile(code, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True
