"""``envsdk check-env`` always ends with a verdict and an exit code a CI gate can trust.

Each test writes an environment into a temporary folder and runs the installed ``envsdk`` there
(no PYTHONPATH), as a user would: an env that exits the interpreter, hangs, blocks the event
loop, hangs a tool or leaves a thread running is judged, never mistaken for a pass; an env whose
action a rollout's text reply cannot build, or that ignores its seed, is named.
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from envsdk.checker import EnvCheckError, check_env
from envsdk.testing import EchoEnvironment
from tests.cli.conftest import Result, envsdk

pytestmark = pytest.mark.timeout(120)

HEADER = textwrap.dedent(
    """
    import asyncio, os, random, sys, threading, time
    from typing import Any
    from envsdk import Action, Environment, Observation, State


    class Move(Action):
        message: str


    class Seen(Observation):
        text: str = ""


    class Sound(Environment[Move, Seen, State]):
        def __init__(self) -> None:
            self._state = State()
            self.rng = random.Random()

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Seen:
            self.rng = random.Random(seed)
            self._state = State(episode_id=episode_id, step_count=0)
            return Seen(text=f"a coin shows {self.rng.randint(0, 99)}")

        def step(self, action: Move) -> Seen:
            self._state.step_count += 1
            return Seen(text=f"you said {action.message}", reward=1.0, done=self._state.step_count >= 2)

        @property
        def state(self) -> State:
            return self._state
    """
)


def check(tmp_path: Path, body: str, target: str, *flags: str) -> tuple[Result, float]:
    (tmp_path / "envs.py").write_text(HEADER + textwrap.dedent(body), encoding="utf-8")
    started = time.monotonic()
    result = envsdk("check-env", f"envs:{target}", *flags, cwd=tmp_path, timeout=90)
    return result, time.monotonic() - started


def assert_failed(result: Result, rule: str, *needles: str) -> None:
    assert result.returncode == 1, result
    assert f"FAILED rule {rule}" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# ------------------------------------------------------------------ it judges instead of dying


@pytest.mark.parametrize(("where", "rule"), [("reset", "reset.returns"), ("step", "step.returns")])
def test_an_env_that_calls_sys_exit_fails_the_rule_with_its_message(tmp_path: Path, where: str, rule: str) -> None:
    body = f"""
    class Exits(Sound):
        def {where}(self, *args: Any, **kwargs: Any) -> Any:
            sys.exit(0)  # an env that exits the process with 0 must not read as a pass
    """
    result, _ = check(tmp_path, body, "Exits")
    assert_failed(result, rule, "SystemExit")


def test_an_env_that_exits_while_imported_cannot_be_loaded(tmp_path: Path) -> None:
    result, _ = check(tmp_path, "sys.exit(0)\n", "Sound")
    assert result.returncode == 2, result
    assert "cannot load" in result.stderr and "SystemExit" in result.stderr


@pytest.mark.parametrize(
    ("body", "rule", "what"),
    [
        (
            """
            class HangsInReset(Sound):
                def reset(self, *args: Any, **kwargs: Any) -> Seen:
                    time.sleep(3600)  # a sync call: it holds the checker's loop
                    return Seen()
            """,
            "reset.returns",
            "reset",
        ),
        (
            """
            class HangsInStep(Sound):
                async def step(self, action: Move) -> Seen:
                    await asyncio.Event().wait()  # an await that never ends
                    return Seen()
            """,
            "step.returns",
            "step",
        ),
        (
            """
            class BlocksTheLoop(Sound):
                async def reset(self, *args: Any, **kwargs: Any) -> Seen:
                    time.sleep(3600)  # declared async, blocks anyway
                    return Seen()
            """,
            "reset.returns",
            "reset",
        ),
        (
            """
            class IgnoresCancellation(Sound):
                async def step(self, action: Move) -> Seen:
                    while True:
                        try:
                            await asyncio.sleep(3600)
                        except asyncio.CancelledError:
                            pass
            """,
            "step.returns",
            "step",
        ),
    ],
    ids=["sync-reset", "async-step", "loop-blocking-reset", "cancel-swallowing-step"],
)
def test_a_hanging_call_fails_its_rule_at_the_deadline(tmp_path: Path, body: str, rule: str, what: str) -> None:
    target = body.split("class ", 1)[1].split("(", 1)[0]
    result, elapsed = check(tmp_path, body, target, "--call-timeout", "2")
    assert_failed(result, rule, f"{what} did not return within 2 s")
    assert elapsed < 2 + 15, f"check-env took {elapsed:.1f} s with --call-timeout 2"


def test_a_hanging_tool_fails_the_tool_rule(tmp_path: Path) -> None:
    body = """
    from envsdk.tools import tool


    class SlowTools(Sound):
        @tool
        def lookup(self, word: str) -> str:
            \"\"\"Look a word up.\"\"\"
            time.sleep(3600)
            return word
    """
    result, elapsed = check(tmp_path, body, "SlowTools", "--call-timeout", "2")
    assert_failed(result, "tools.call", "did not return within 2 s")
    assert elapsed < 2 + 15


def test_a_non_daemon_thread_left_by_the_env_does_not_keep_check_env_running(tmp_path: Path) -> None:
    body = """
    class LeavesAThread(Sound):
        def reset(self, *args: Any, **kwargs: Any) -> Seen:
            threading.Thread(target=time.sleep, args=(3600,), name="forgotten", daemon=False).start()
            return super().reset(*args, **kwargs)
    """
    result, elapsed = check(tmp_path, body, "LeavesAThread", "--call-timeout", "5")
    assert result.returncode == 0, result
    assert "warn  close.threads" in result.stdout and "forgotten" in result.stdout
    assert elapsed < 60
    strict, _ = check(tmp_path, body, "LeavesAThread", "--strict")
    assert strict.returncode == 1 and "warn  close.threads" in strict.stdout


def test_a_sound_env_still_passes_with_no_warning(tmp_path: Path) -> None:
    result, _ = check(tmp_path, "", "Sound")
    assert result.returncode == 0, result
    assert "0 warnings" in result.stdout and "warn " not in result.stdout


# ------------------------------------------------------------------ what a rollout would send

SECRETS = """
class Guess(Action):
    guess: int


class TypedSecret(Sound):
    \"\"\"A typed action field: a rollout's reply must become {"guess": <int>}.\"\"\"

    def step(self, action: Guess) -> Seen:
        return Seen(text="thanks", reward=1.0, done=True)


class Secret(Sound):
    \"\"\"Name the secret number (drawn from the seed); a wrong guess is told the secret.\"\"\"

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Seen:
        self.secret = self.draw(seed)
        self._state = State(episode_id=episode_id, step_count=0)
        return Seen(text="name my number")

    def draw(self, seed: int | None) -> int:
        return random.Random(seed).randint(0, 10**6)

    def step(self, action: Move) -> Seen:
        self._state.step_count += 1
        if not action.message.strip().isdigit():
            return Seen(text="say a number", done=self._state.step_count >= 10)
        if int(action.message) == self.secret:
            return Seen(text="right", reward=1.0, done=True)
        return Seen(text=f"wrong, it was {self.secret}", done=True)


class IgnoresSeed(Secret):
    def draw(self, seed: int | None) -> int:
        return random.Random().randint(0, 10**6)


class FixedSecret(Secret):
    def draw(self, seed: int | None) -> int:
        return 7
"""


def test_a_typed_action_no_text_reply_can_build_is_named_with_the_fix(tmp_path: Path) -> None:
    result, _ = check(tmp_path, SECRETS, "TypedSecret")
    assert result.returncode == 0, result
    assert "warn  action.from_reply" in result.stdout, result.stdout
    assert "guess" in result.stdout and "--replies" in result.stdout
    strict, _ = check(tmp_path, SECRETS, "TypedSecret", "--strict")
    assert strict.returncode == 1
    # A reply the rollout's rule makes into {"guess": 4}: no warning.
    fits, _ = check(tmp_path, SECRETS, "TypedSecret", "--replies", "4", "--strict")
    assert fits.returncode == 0 and "warn " not in fits.stdout, fits


def test_replies_that_reach_the_seeded_logic_pass_a_seeded_env(tmp_path: Path) -> None:
    result, _ = check(tmp_path, SECRETS, "Secret", "--replies", "3", "5", "8", "--strict")
    assert result.returncode == 0, result
    assert "warn " not in result.stdout and "ok    step.seed_determinism" in result.stdout


def test_an_env_that_ignores_its_seed_passes_the_generic_replies_but_not_ones_that_reach_its_logic(
    tmp_path: Path,
) -> None:
    generic, _ = check(tmp_path, SECRETS, "IgnoresSeed")
    assert generic.returncode == 0, generic  # what the issue saw: the replies never reach the secret
    for flags in (("--replies", "3", "5", "8"), ("--action", '{"message": "4"}', "--action", '{"message": "6"}')):
        result, _ = check(tmp_path, SECRETS, "IgnoresSeed", *flags)
        assert_failed(result, "step.seed_determinism", "wrong, it was")


def test_an_env_whose_seed_changes_nothing_is_named(tmp_path: Path) -> None:
    result, _ = check(tmp_path, SECRETS, "FixedSecret", "--replies", "3", "5", "8")
    assert result.returncode == 0, result
    assert "warn  seed.changes_nothing" in result.stdout, result.stdout


def test_a_bad_action_option_is_a_usage_error(tmp_path: Path) -> None:
    result, _ = check(tmp_path, SECRETS, "TypedSecret", "--action", '{"guess": "many"}')
    assert result.returncode == 2, result
    assert "--action" in result.stderr and "guess" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------ the library call


_RELEASE = threading.Event()


class _LoopBlocker(EchoEnvironment):
    """An async reset that blocks the event loop until the test lets it go."""

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        _RELEASE.wait()


@pytest.mark.timeout(60)
def test_check_env_returns_a_verdict_while_the_env_call_still_blocks() -> None:
    started = time.monotonic()
    try:
        with pytest.raises(EnvCheckError) as caught:
            check_env(_LoopBlocker, call_timeout=1)
        elapsed = time.monotonic() - started
    finally:
        _RELEASE.set()  # the abandoned call returns and the check's thread ends
    assert caught.value.rule == "reset.returns" and "did not return within 1 s" in caught.value.detail
    assert elapsed < 1 + 10


# ------------------------------------------------------------------ options that would check nothing

STEP_RAISES = """
class StepRaises(Sound):
    def step(self, action: Move) -> Seen:
        raise RuntimeError("step is broken")
"""


@pytest.mark.parametrize("steps", ["0", "-1"])
def test_max_steps_below_one_is_a_usage_error_not_a_pass(tmp_path: Path, steps: str) -> None:
    result, _ = check(tmp_path, STEP_RAISES, "StepRaises", "--max-steps", steps)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envsdk check-env: error: --max-steps"), result.stderr
    assert "passed" not in result.stdout, result.stdout
    # the same env with a step to play is failed, as it should be
    failed, _ = check(tmp_path, STEP_RAISES, "StepRaises", "--max-steps", "1")
    assert_failed(failed, "step.returns", "step is broken")


@pytest.mark.parametrize("concurrency", ["100000", "257", "1", "0", "-5"])
def test_a_concurrency_out_of_bounds_is_a_usage_error_not_the_envs_fault(tmp_path: Path, concurrency: str) -> None:
    result, elapsed = check(tmp_path, "", "Sound", "--concurrency", concurrency)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envsdk check-env: error: --concurrency"), result.stderr
    assert "256" in lines[0] and "FAILED" not in result.stderr, result.stderr
    assert elapsed < 30


def test_check_env_refuses_steps_and_crowds_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        check_env(EchoEnvironment, max_steps=0)
    with pytest.raises(ValueError, match="at most 256"):
        check_env(EchoEnvironment, concurrency=100_000)
