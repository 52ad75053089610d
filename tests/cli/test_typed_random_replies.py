"""Random replies for an environment whose action is typed: drawn from the server's action JSON
schema (``/schema``), so every reply is an action the server accepts; and the reply hint a
scheduler gives for a reply that is no action shows values of the right types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import ServeFn, envsdk

pytestmark = pytest.mark.timeout(240)

#: The README's env with a typed action: a number to guess.
GUESS_ENV = """\
from envsdk import Environment, Action, Observation, State
from pydantic import Field

class Guess(Action):
    guess: int = Field(ge=1, le=100)

class Hint(Observation):
    text: str = ""

class MyEnv(Environment):
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id=episode_id, step_count=0)
        return Hint(text="guess a number from 1 to 100")

    def step(self, action: Guess) -> Hint:
        self._state.step_count += 1
        return Hint(text=f"{action.guess} is wrong", done=self._state.step_count >= 3)

    @property
    def state(self) -> State:
        return self._state
"""

#: An action of every JSON type, bounded: the server refuses any reply out of its bounds.
RICH_ENV = """\
from typing import Literal
from envsdk import Environment, Action, Observation, State
from pydantic import BaseModel, Field

class Point(BaseModel):
    x: float = Field(ge=-1.0, le=1.0)
    label: str = Field(min_length=3, max_length=5)

class Order(Action):
    count: int = Field(gt=10, lt=13)
    ratio: float = Field(ge=0.25, le=0.5)
    urgent: bool
    side: Literal["buy", "sell"]
    kind: Literal["limit"]
    note: str = Field(min_length=2, max_length=4)
    where: Point
    tags: list[int] = Field(min_length=2, max_length=3)
    extra: dict[str, int] = {}
    maybe: int | None = None

class Seen(Observation):
    text: str = ""

class Orders(Environment):
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id=episode_id, step_count=0)
        return Seen(text="place an order")

    def step(self, action: Order) -> Seen:
        self._state.step_count += 1
        return Seen(text=action.model_dump_json(), done=self._state.step_count >= 4)

    @property
    def state(self) -> State:
        return self._state
"""

#: A policy that never answers with an action.
CHATTY = """\
from envsdk.policies import Policy

class Chatty(Policy):
    async def act(self, messages):
        return "let me think about it"
"""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_random_replies_to_an_int_action_are_ints_the_server_accepts(tmp_path: Path, serve: ServeFn) -> None:
    (tmp_path / "my_env.py").write_text(GUESS_ENV, encoding="utf-8")
    url = serve("my_env:MyEnv", cwd=tmp_path)
    result = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "8", "--no-progress",
                    "--record", "full", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = _records(tmp_path / "completions.jsonl")
    assert [r["status"] for r in records] == ["done"] * 8, [r["reason"] for r in records]
    guesses = [step["action"]["guess"] for r in records for step in r["steps"]]
    assert len(guesses) == 24 and all(type(g) is int and 1 <= g <= 100 for g in guesses), guesses
    assert len(set(guesses)) > 3  # drawn, not one value


def test_random_replies_fill_every_json_type_within_its_bounds(tmp_path: Path, serve: ServeFn) -> None:
    (tmp_path / "orders.py").write_text(RICH_ENV, encoding="utf-8")
    url = serve("orders:Orders", cwd=tmp_path)
    result = envsdk("rollout", "--env", "orders", "--base-url", url, "--episodes", "6", "--policy", "random",
                    "--no-progress", "--record", "full", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = _records(tmp_path / "completions.jsonl")
    assert [r["status"] for r in records] == ["done"] * 6, [r["reason"] for r in records]
    actions = [step["action"] for r in records for step in r["steps"]]
    assert len(actions) == 24
    for action in actions:
        assert action["count"] in (11, 12) and 0.25 <= action["ratio"] <= 0.5
        assert type(action["urgent"]) is bool and action["side"] in ("buy", "sell") and action["kind"] == "limit"
        assert 2 <= len(action["note"]) <= 4 and 3 <= len(action["where"]["label"]) <= 5
        assert -1.0 <= action["where"]["x"] <= 1.0
        assert 2 <= len(action["tags"]) <= 3 and all(type(t) is int for t in action["tags"])
    assert {a["side"] for a in actions} == {"buy", "sell"} and {a["urgent"] for a in actions} == {True, False}


def test_a_text_action_still_gets_the_generic_text_replies(tmp_path: Path, serve: ServeFn, folder: Path) -> None:
    url = serve("my_env:MyEnv", cwd=folder)
    result = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "4", "--no-progress",
                    "--record", "full", cwd=folder)
    assert result.returncode == 0, result.stderr
    messages = [step["action"]["message"] for r in _records(folder / "completions.jsonl") for step in r["steps"]]
    assert messages and not any(m.startswith("{") for m in messages), messages


def test_the_hint_for_a_reply_that_is_no_action_shows_a_value_of_the_actions_type(
    tmp_path: Path, serve: ServeFn
) -> None:
    (tmp_path / "my_env.py").write_text(GUESS_ENV, encoding="utf-8")
    (tmp_path / "chatty.py").write_text(CHATTY, encoding="utf-8")
    url = serve("my_env:MyEnv", cwd=tmp_path)
    result = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "1", "--policy",
                    "chatty:Chatty", "--no-progress", cwd=tmp_path)
    (record,) = _records(tmp_path / "completions.jsonl")
    assert record["error_kind"] == "ReplyParseError", record
    assert 'such as {"guess": 1}' in record["reason"], record["reason"]
    assert "\\u2026" not in record["reason"] and "…" not in record["reason"]
    assert result.returncode == 1
