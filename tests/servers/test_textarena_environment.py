"""The TextArena session class and its parts called directly (no server)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import nltk
import pytest

from envsdk.errors import EpisodeDoneError, NotResetError
from servers.textarena import NltkDataMissing, TextArenaAction, TextArenaEnvironment
from servers.textarena.app import parse_kwarg
from servers.textarena.environment import GameRandom, jsonable
from servers.textarena.errors import GenerationTimeout
from servers.textarena.nltk_data import forbid_downloads
from servers.textarena.pool import GamePool
from servers.textarena.start_textarena_server import main as cli_main

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pool() -> Iterator[GamePool]:
    games = GamePool(workers=1)
    yield games
    games.shutdown()


async def test_step_before_reset_and_after_done_are_refused(pool: GamePool) -> None:
    env = TextArenaEnvironment("GuessTheNumber-v0", game_pool=pool)
    with pytest.raises(NotResetError):
        env.step(TextArenaAction(message="[1]"))
    env.reset(seed=1)
    obs = env.step(TextArenaAction(message="nonsense"))
    while not obs.done:
        obs = env.step(TextArenaAction(message="nonsense"))
    with pytest.raises(EpisodeDoneError) as refused:
        env.step(TextArenaAction(message="[1]"))
    assert refused.value.code == "EPISODE_DONE"


async def test_an_unseeded_reset_reports_a_seed_that_replays_the_episode(pool: GamePool) -> None:
    env, replay = TextArenaEnvironment("2048-v0", game_pool=pool), TextArenaEnvironment("2048-v0", game_pool=pool)
    first = env.reset()
    seed = env.state.seed
    assert isinstance(seed, int)
    assert replay.reset(seed=seed) == first
    for move in ("[Up]", "[Left]", "[Down]", "[Right]") * 3:
        stepped = env.step(TextArenaAction(message=move))
        assert stepped == replay.step(TextArenaAction(message=move))
        if stepped.done:  # a random seed's game may end within the scripted moves: so did the replay's
            break


async def test_game_calls_leave_the_process_wide_generators_alone(pool: GamePool) -> None:
    env = TextArenaEnvironment("Blackjack-v0", game_pool=pool)
    random.seed(99)
    before = random.getstate()
    env.reset(seed=5)
    env.step(TextArenaAction(message="[Hit]"))
    assert random.getstate() == before


def test_game_random_keeps_each_sessions_stream_apart() -> None:
    one, two = GameRandom(), GameRandom()
    random.seed(1)
    with one.lease():
        random.seed(7)
        a = random.random()
    with two.lease():
        random.seed(7)
    with one.lease():
        b = random.random()
    reference = random.Random(7)
    assert (a, b) == (reference.random(), reference.random())


def test_jsonable_turns_any_game_state_into_json_values() -> None:
    import textarena as ta

    state: dict[str, Any] = {"letters": {"b", "a"}, "pair": (1, 2), "kind": ta.ObservationType.PROMPT, 3: object}
    out = jsonable(state)
    assert out["letters"] == ["a", "b"] and out["pair"] == [1, 2] and out["kind"] == "PROMPT"
    assert out["3"].startswith("<class")


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("False", False), ("30", 30), ("0.5", 0.5), ("red", "red")]
)
def test_textarena_kw_values_are_parsed_as_literals(text: str, value: Any) -> None:
    assert parse_kwarg(text) == value


def test_nltk_download_is_a_local_lookup_that_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any) -> None:
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    forbid_downloads()
    with pytest.raises(NltkDataMissing, match="not installed: no-such-corpus"):
        nltk.download("no-such-corpus")


def test_the_launcher_refuses_an_unknown_game_id(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["--env-id", "NoSuchGame-v0"])
    assert exited.value.code == 2
    assert "Unknown TextArena env id 'NoSuchGame-v0'" in capsys.readouterr().err


async def test_sudoku_is_the_specialisation_and_sends_raw_state() -> None:
    from servers.sudoku import BoardPool, SudokuAction, SudokuEnvironment

    boards = BoardPool(workers=1)
    try:
        env = SudokuEnvironment("Sudoku-v0-very-easy", board_pool=boards)
        assert isinstance(env, TextArenaEnvironment)
        obs = env.reset(seed=4)
        env.step(SudokuAction(message="[1 1 1]"))
        raw = env.state.raw_state
        assert raw["game_state"]["board"] and any("[1 1 1]" in text for _, text in raw["logs"])
        assert obs.board and env.state.board  # the structured fields stay
    finally:
        boards.shutdown()


def test_the_game_cache_is_bounded_in_bytes() -> None:
    import time

    games = GamePool(workers=1, cache_bytes=1)  # any two cached games are over the bound
    try:
        first = games.submit("GuessTheNumber-v0", {}, 1, 1)
        first.result(timeout=60)
        second = games.submit("GuessTheNumber-v0", {}, 1, 2)
        second.result(timeout=60)
        deadline = time.monotonic() + 10
        while games.submit("GuessTheNumber-v0", {}, 1, 1) is first and time.monotonic() < deadline:
            time.sleep(0.05)  # the size is recorded by a callback right after the result
        assert games.submit("GuessTheNumber-v0", {}, 1, 1) is not first
        assert games.submit("GuessTheNumber-v0", {}, 1, 2) is not second  # evicted by the re-run
    finally:
        games.shutdown()


def test_a_generation_nobody_waits_for_any_more_is_stopped() -> None:
    """Sokoban's medium boards take minutes to generate: a caller that gives up takes its
    generation with it, so the only worker is free for the next game at once."""
    games = GamePool(workers=1, task_timeout_s=600)
    try:
        games.warm()
        with pytest.raises(GenerationTimeout):
            games.game("Sokoban-v0-medium", {}, 1, 1, timeout_s=3.0)
        started = time.monotonic()
        assert games.game("GuessTheNumber-v0", {}, 1, 1, timeout_s=60).payload
        assert time.monotonic() - started < 30
    finally:
        games.shutdown()
