"""``envsdk check-env`` names every rule an environment breaks, one line each, not only the first:
fixing one rule should not be how a user finds the next."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.cli.conftest import envsdk

pytestmark = pytest.mark.timeout(120)

#: Three independent faults: reset draws from the process-wide generator, `state` is no State,
#: and a second close raises.
SERVER_ENV = textwrap.dedent(
    """
    import random
    from envsdk import Action, Environment, Observation, State


    class Move(Action):
        message: str


    class Seen(Observation):
        text: str = ""


    class Faulty(Environment):
        def __init__(self):
            self.closed = False
            self.steps = 0

        def reset(self, seed=None, episode_id=None, **kw):
            random.random()
            self.steps = 0
            return Seen(text="hello")

        def step(self, action: Move) -> Seen:
            self.steps += 1
            return Seen(text=f"you said {action.message}", done=self.steps >= 2)

        @property
        def state(self):
            return {"steps": self.steps}

        def close(self):
            if self.closed:
                raise RuntimeError("closed twice")
            self.closed = True
    """
)

#: A local (ms-swift style) env whose reset depends on the instance, that takes steps after its
#: episode ended, and whose second close raises.
LOCAL_ENV = textwrap.dedent(
    """
    import itertools
    from envsdk import Env

    _made = itertools.count()


    class Drifting(Env):
        def __init__(self, env_config):
            self.number = next(_made)
            self.closed = False

        async def reset(self, config):
            return f"instance {self.number}", {}, None

        async def step(self, messages):
            return "ok", 1.0, True, {}

        async def close(self):
            if self.closed:
                raise RuntimeError("closed twice")
            self.closed = True
    """
)


def _failed_rules(stderr: str) -> list[str]:
    return re.findall(r"^check-env \S+: FAILED rule (\S+): ", stderr, re.MULTILINE)


def test_every_broken_rule_of_an_environment_is_named(tmp_path: Path) -> None:
    (tmp_path / "faulty.py").write_text(SERVER_ENV, encoding="utf-8")
    result = envsdk("check-env", "faulty:Faulty", cwd=tmp_path, timeout=90)
    assert result.returncode == 1, result
    assert _failed_rules(result.stderr) == ["no_global_random", "state.returns", "close.idempotent"], result.stderr
    assert "closed twice" in result.stderr and "Traceback" not in result.stderr


def test_every_broken_rule_of_a_local_env_is_named(tmp_path: Path) -> None:
    (tmp_path / "drifting.py").write_text(LOCAL_ENV, encoding="utf-8")
    result = envsdk("check-env", "drifting:Drifting", cwd=tmp_path, timeout=90)
    assert result.returncode == 1, result
    rules = _failed_rules(result.stderr)
    assert rules == [
        "reset.seed_determinism", "reset.concurrent_seed_determinism", "step.after_done_refused", "close.idempotent",
    ], result.stderr
