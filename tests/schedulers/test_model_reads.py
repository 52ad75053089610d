"""What the model reads and how its replies become actions, through real servers on 127.0.0.1:
a TextArena server (OpenEnv's cumulative transcript) and a server whose action has a typed field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from envsdk.env import RolloutRequest
from envsdk.schedulers import OpenEnvScheduler
from envsdk.server import create_app
from envsdk.testing import running_server
from tests.server.envs import GuessAction, GuessObservation, NumberGuessEnv

from .policies import ScriptedPolicy

pytestmark = pytest.mark.timeout(120)

INSTRUCTIONS = "You are playing Guess The Number"


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    with running_server(create_app(NumberGuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8)) as url:
        yield url


def _row(url: str, **config: Any) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": 1, **config}})]


def _user_messages(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


async def test_textarena_instructions_are_read_once_and_later_turns_only_the_news(textarena_url: str) -> None:
    [traj] = await OpenEnvScheduler(max_turns=3).run(_row(textarena_url), ScriptedPolicy(["[3]", "[6]", "[9]"]))
    first, *later = _user_messages(traj.messages)
    # The instructions as text, once: not a JSON dump holding them three times (1,838 chars).
    assert not first.lstrip().startswith("{") and first.count(INSTRUCTIONS) == 1 and len(first) < 700
    assert first.startswith("[GAME] You are Player 0.")
    # Each later turn: only what the game added, not the whole transcript again.
    assert len(later) == 3
    for guess, text in zip(["[3]", "[6]", "[9]"], later):
        assert text.startswith(f"[Player] {guess}\n[GAME] ") and INSTRUCTIONS not in text and len(text) < 100


async def test_json_formatter_gives_ms_swifts_dump_by_argument_or_by_row(textarena_url: str) -> None:
    by_arg = OpenEnvScheduler(max_turns=1, formatter="json")
    [traj] = await by_arg.run(_row(textarena_url), ScriptedPolicy(["[3]"]))
    assert INSTRUCTIONS in json.loads(_user_messages(traj.messages)[0])["prompt"]
    [traj] = await OpenEnvScheduler(max_turns=1).run(_row(textarena_url, formatter="json"), ScriptedPolicy(["[3]"]))
    assert json.loads(_user_messages(traj.messages)[0])["metadata"]["env_id"] == "GuessTheNumber-v0"


async def test_an_override_with_ms_swifts_signature_is_what_the_model_reads(guess_url: str) -> None:
    class Shouting(OpenEnvScheduler):
        def format_observation(self, obs: dict[str, Any]) -> str:  # type: ignore[override]
            return str(obs["text"]).upper()

        def parse_action(self, text: str) -> dict[str, Any]:
            return {"guess": len(text)}

    [traj] = await Shouting(max_turns=5).run(_row(guess_url), ScriptedPolicy(["a", "bb", "ccc"]))
    assert _user_messages(traj.messages) == ["GUESS A NUMBER FROM 1 TO 9.", "YOU SAID 1", "YOU SAID 2"]
    assert [s.action for s in traj.steps] == [{"guess": 1}, {"guess": 2}, {"guess": 3}]


async def test_replies_fill_a_typed_action_field(guess_url: str) -> None:
    replies = ScriptedPolicy(["7", '```json\n{"guess": 4}\n```', "2"])
    [traj] = await OpenEnvScheduler(max_turns=5).run(_row(guess_url), replies)
    assert traj.status == "done", traj.reason
    assert [s.action for s in traj.steps] == [{"guess": 7}, {"guess": 4}, {"guess": 2}]
    assert _user_messages(traj.messages) == ["Guess a number from 1 to 9.", "you said 7", "you said 4"]


async def test_a_reply_that_fits_no_field_ends_with_a_hint(guess_url: str) -> None:
    [traj] = await OpenEnvScheduler(max_turns=5).run(_row(guess_url), ScriptedPolicy(["seven"]))
    assert traj.status == "error" and traj.error_kind == "ReplyParseError"
    assert "guess (integer)" in (traj.reason or "") and '{"guess":' in (traj.reason or "")


def test_the_rendering_function_is_public_and_documented() -> None:
    from envsdk.formats import formatters, parse_reply, render_observation

    cumulative = {"prompt": "rules", "messages": [{"content": "rules\nboard 1"}]}
    later = {"prompt": "env", "messages": [{"content": "rules\nboard 1\nmove\nboard 2"}], "reward": 0.0}
    assert render_observation(cumulative) == "rules\nboard 1"
    assert render_observation(later, cumulative) == "move\nboard 2"
    compact = {"prompt": "", "messages": [{"content": "[Player] [1]"}, {"content": "[GAME] higher"}]}
    assert render_observation(compact, cumulative) == "[Player] [1]\n[GAME] higher"
    assert render_observation({"tool_name": "t", "result": {"data": 5}}) == "5"
    assert render_observation({"board": [1, 2], "metadata": {"x": 1}}) == '{"board": [1, 2]}'
    assert set(formatters) >= {"text", "json"}
    assert parse_reply("hi", {"properties": {"message": {"type": "string"}}}) == {"message": "hi"}


async def test_2048_moves_score_but_an_unsolved_game_is_not_a_success() -> None:
    from envsdk.rollout import summarize
    from servers.textarena.app import create_textarena_app
    from servers.textarena.pool import GamePool

    pool = GamePool(workers=1)
    try:
        with running_server(create_textarena_app("2048-v0", game_pool=pool, max_concurrent_envs=4)) as url:
            rows = [RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": s}}) for s in range(4)]
            # A move, then words 2048 refuses: the game ends and pays a small positive reward.
            moves = ScriptedPolicy(["[Up]"] + ["hello"] * 7)
            trajectories = await OpenEnvScheduler(max_turns=8).run(rows, moves)
    finally:
        pool.shutdown()
    # The old rule ("ended on its own with a positive last reward") called every one a success.
    assert all(t.status == "done" and t.steps[-1].reward > 0 for t in trajectories), [t.reason for t in trajectories]
    # A reward is not a verdict: the game's own outcome is (2048 not reached: not solved), so the
    # rate is not a guessed 100%.
    assert all(t.success is False for t in trajectories), [t.success for t in trajectories]
    assert summarize(trajectories, 1.0).render().splitlines()[1].startswith("success rate    0.0%")
