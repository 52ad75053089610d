"""``envsdk check-env`` on an environment whose action has a bounded number field (``guess: int =
Field(ge=1, le=100)``, the README's own-env shape), run without ``--replies``: the invented values
lie within the field's bounds, so the check runs its rules instead of dying on a pydantic error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.cli.conftest import envsdk

pytestmark = pytest.mark.timeout(120)

GUESS_ENV = textwrap.dedent(
    """
    from pydantic import Field
    from envsdk import Action, Environment, Observation, State


    class Guess(Action):
        guess: int = Field(ge=1, le=100)
        weight: float = Field(gt=0.5, le=0.75)


    class Told(Observation):
        text: str = ""


    class Guessing(Environment):
        def __init__(self):
            self.target, self.steps, self.episode = 0, 0, None

        def reset(self, seed=None, episode_id=None, **kw):
            self.target, self.steps, self.episode = 1 + (seed or 0) % 100, 0, episode_id
            return Told(text="guess a number from 1 to 100")

        def step(self, action: Guess) -> Told:
            assert 1 <= action.guess <= 100 and 0.5 < action.weight <= 0.75, action
            self.steps += 1
            won = action.guess == self.target
            return Told(text="yes" if won else "no", reward=float(won), done=won or self.steps >= 3)

        @property
        def state(self):
            return State(episode_id=self.episode, step_count=self.steps)
    """
)


def test_a_bounded_number_field_gets_values_within_its_bounds(tmp_path: Path) -> None:
    (tmp_path / "guessing.py").write_text(GUESS_ENV, encoding="utf-8")
    result = envsdk("check-env", "guessing:Guessing", cwd=tmp_path, timeout=90)
    assert "ValidationError" not in result.stderr and "input_value" not in result.stderr, result.stderr
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "FAILED" not in result.stdout, result.stdout
