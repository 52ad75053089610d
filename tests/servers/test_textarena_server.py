"""The TextArena server end to end: real uvicorn, real TextArena games, raw frames and the
real openenv client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from openenv.core.generic_client import GenericEnvClient

from envsdk.server import create_app
from envsdk.testing import running_server
from servers.textarena import TextArenaOptionError, create_textarena_app
from servers.textarena.environment import TextArenaEnvironment
from servers.textarena.models import (
    TextArenaAction,
    TextArenaObservation,
    TextArenaState,
)
from servers.textarena.pool import GamePool
from servers.textarena.start_textarena_server import main as cli_main
from tests.servers.test_game_limits import LOOPING_MOVES
from tests.servers.textarena_games import MAX_STEPS, OFFLINE_GAMES, random_moves

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool() -> Iterator[GamePool]:
    games = GamePool(workers=2)  # ours to stop; the process-wide pool is left alone
    yield games
    games.shutdown()


@pytest.fixture(scope="module")
def base_url(pool: GamePool) -> Iterator[str]:
    app = create_textarena_app("GuessTheNumber-v0", game_pool=pool, max_concurrent_envs=64)
    with running_server(app) as url:
        yield url


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws"


class Session:
    """A raw-frame client: one JSON request, one JSON reply."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(frame))
        return dict(json.loads(await asyncio.wait_for(self.ws.recv(), timeout=60)))

    async def reset(self, **data: Any) -> dict[str, Any]:
        return await self.call({"type": "reset", "data": data})

    async def step(self, message: str) -> dict[str, Any]:
        return await self.call({"type": "step", "data": {"message": message}})

    async def state(self) -> dict[str, Any]:
        return await self.call({"type": "state"})


async def _play(base_url: str, env_id: str, seed: int) -> None:
    players, _ = OFFLINE_GAMES[env_id]
    async with (
        websockets.connect(ws_url(base_url), max_size=None) as a,
        websockets.connect(ws_url(base_url), max_size=None) as b,
    ):
        crowd = [websockets.connect(ws_url(base_url), max_size=None) for _ in range(6)]
        sockets = [await c.__aenter__() for c in crowd]
        try:
            sessions = [Session(ws) for ws in (a, b, *sockets)]
            firsts = await asyncio.gather(
                *(s.reset(env_id=env_id, num_players=players, seed=seed) for s in sessions)
            )
        finally:
            for c in crowd:
                await c.__aexit__(None, None, None)
        assert all(f["type"] == "observation" for f in firsts), firsts[0]
        assert all(f == firsts[0] for f in firsts), f"{env_id}: 8 concurrent resets with seed {seed} differ"
        assert firsts[0]["data"]["observation"]["prompt"]

        # Two sessions, one seed, the same moves: the same episode, step for step, to its end.
        one, two = Session(a), Session(b)
        done, steps = False, 0
        for move in random_moves(env_id, seed):
            left, right = await asyncio.gather(one.step(move), two.step(move))
            assert left["type"] == "observation", left
            assert left == right, f"{env_id}: step {steps + 1} differs between two sessions with seed {seed}"
            steps += 1
            done = left["data"]["done"]
            if done:
                break
        assert done, f"{env_id} did not end within {MAX_STEPS} steps"
        reward = left["data"]["reward"]
        assert isinstance(reward, float)

        state = (await one.state())["data"]
        assert state["env_id"] == env_id and state["seed"] == seed and state["num_players"] == players
        assert state["step_count"] == steps and state["done"] is True
        raw = state["raw_state"]
        assert raw["done"] is True and raw["logs"], f"{env_id}: raw_state carries no game log"
        after = await one.step(random_moves(env_id, seed)[0])
        # A plain OpenEnv peer (no handshake) gets OpenEnv's code for the refusal.
        assert after["type"] == "error" and after["data"]["code"] == "EXECUTION_ERROR"
        assert "episode is over" in after["data"]["message"]


@pytest.mark.parametrize("env_id", list(OFFLINE_GAMES))
async def test_every_offline_game_plays_to_its_end_and_one_seed_gives_one_episode(
    base_url: str, env_id: str
) -> None:
    await _play(base_url, env_id, seed=1234)


async def test_a_seeded_first_observation_is_the_one_textarena_gives_alone(base_url: str) -> None:
    import textarena as ta

    game = ta.make("2048-v0-raw")
    game.reset(num_players=1, seed=77)
    board = game.state.game_state["board"]
    async with websockets.connect(ws_url(base_url)) as ws:
        first = await Session(ws).reset(env_id="2048-v0-raw", seed=77)
        state = (await Session(ws).state())["data"]
    assert state["raw_state"]["game_state"]["board"] == board
    assert first["data"]["observation"]["messages"][0]["category"] == "PROMPT"


async def test_bad_reset_options_get_errors_that_say_what_to_change(base_url: str) -> None:
    async with websockets.connect(ws_url(base_url)) as ws:
        s = Session(ws)
        # The client's mistakes: VALIDATION_ERROR, never the server's EXECUTION_ERROR.
        unknown = await s.reset(env_id="NoSuchGame-v0")
        assert unknown["data"]["code"] == "VALIDATION_ERROR"
        assert "Unknown TextArena env id 'NoSuchGame-v0'" in unknown["data"]["message"]
        lonely = await s.reset(env_id="MarketEntryGame-v0", num_players=1)
        assert lonely["data"]["code"] == "VALIDATION_ERROR"
        assert "num_players must be >= 2, got 1" in lonely["data"]["message"]
        crowd = await s.reset(env_id="MarketEntryGame-v0", num_players=100_000)
        assert crowd["data"]["code"] == "VALIDATION_ERROR"
        assert "num_players must be <= 15" in crowd["data"]["message"]
        two = await s.reset(env_id="TicTacToe-v0", num_players=1)  # the game's own check
        assert two["data"]["code"] == "VALIDATION_ERROR"
        assert "The number of players has to be 2" in two["data"]["message"]
        bad_form = await s.reset(observation_form="verbose")
        assert bad_form["data"]["code"] == "VALIDATION_ERROR" and "observation_form" in bad_form["data"]["message"]
        no_opponent = await s.reset(env_id="QuantumTicTacToe-v0", num_players=1, opponent="random")
        assert no_opponent["data"]["code"] == "VALIDATION_ERROR"
        assert "has no built-in opponent" in no_opponent["data"]["message"]
        refused_step = await s.step("[1]")
        assert refused_step["data"]["code"] == "EXECUTION_ERROR"  # OpenEnv's code: a plain peer
        assert "send reset first" in refused_step["data"]["message"]  # a failed reset leaves no episode
        typo = await s.reset(oponent="random")
        assert typo["data"]["code"] == "VALIDATION_ERROR"
        # The session still works after all of that.
        ok = await s.reset(seed=1)
        assert ok["type"] == "observation"


async def test_a_reset_the_game_refuses_leaves_the_running_episode_as_it_was(base_url: str) -> None:
    """A reset the game itself refused (TicTacToe with one player, checked as the pool generates
    it; an opponent for a game without one) threw the running episode away, though refusals of
    the options checked before generation kept it: the state still showed the old episode
    running, and its next step got EXECUTION_ERROR "raised NotResetError", even on a session
    that asked for precise codes."""
    async with websockets.connect(ws_url(base_url)) as ws:
        s = Session(ws)
        assert (await s.call({"type": "session"}))["type"] == "session"  # precise error codes
        assert (await s.reset(seed=1))["type"] == "observation"
        assert (await s.step("[3]"))["type"] == "observation"
        before = await s.state()
        assert before["data"]["step_count"] == 1 and before["data"]["done"] is False
        for refused in (
            {"env_id": "TicTacToe-v0", "num_players": 1},
            {"env_id": "QuantumTicTacToe-v0", "num_players": 1, "opponent": "random"},
        ):
            reply = await s.reset(**refused)
            assert reply["data"]["code"] == "VALIDATION_ERROR", reply
            assert await s.state() == before
        going_on = await s.step("[4]")
        assert going_on["type"] == "observation", going_on
        after = await s.state()
        assert after["data"]["episode_id"] == before["data"]["episode_id"]
        assert after["data"]["step_count"] == 2


class _UnguardedRotation(TextArenaEnvironment):
    """TextArena's free-for-all rotation as it ships: the last of `LOOPING_MOVES` never returns."""

    guard_rotation = False


async def test_the_state_after_a_stopped_step_says_the_episode_is_over(pool: GamePool) -> None:
    """Once a looping step was stopped (TIMEOUT: "the episode is over"), the state went on
    showing the episode running (done false), so a client polling the state could not tell it
    had to reset."""
    app = create_app(
        lambda: _UnguardedRotation("MarketEntryGame-v0", num_players=2, game_pool=pool),
        TextArenaAction, TextArenaObservation, state_type=TextArenaState,
    )
    with running_server(app) as url:
        async with websockets.connect(ws_url(url)) as ws:
            s = Session(ws)
            assert (await s.call({"type": "session"}))["type"] == "session"  # precise error codes
            assert (await s.reset(seed=1))["type"] == "observation"
            for move in LOOPING_MOVES[:-1]:
                assert (await s.step(move))["type"] == "observation"
            stopped = await s.step(LOOPING_MOVES[-1])
            assert stopped["data"]["code"] == "TIMEOUT", stopped
            state = await s.state()
            assert state["data"]["done"] is True, state
            after = await s.step("[0]")
            assert after["type"] == "error" and "reset" in after["data"]["message"], after
            # The session asked for precise codes: the env's "reset first" is NOT_RESET, as the
            # server's own is, not an EXECUTION_ERROR that reads like a bug in the game.
            assert after["data"]["code"] == "NOT_RESET", after
            assert (await s.reset(seed=2))["type"] == "observation"


async def test_compact_form_sends_only_new_messages_and_cumulative_the_transcript(base_url: str) -> None:
    async with websockets.connect(ws_url(base_url)) as a, websockets.connect(ws_url(base_url)) as b:
        compact, cumulative = Session(a), Session(b)
        c0 = await compact.reset(seed=5, observation_form="compact")
        u0 = await cumulative.reset(seed=5)
        assert "GuessTheNumber" not in c0["data"]["observation"]["prompt"] or c0["data"]["observation"]["prompt"]
        assert all(m["category"] != "PROMPT" for m in c0["data"]["observation"]["messages"])
        c1 = await compact.step("[10]")
        u1 = await cumulative.step("[10]")
        assert c1["data"]["observation"]["prompt"] == ""
        categories = [m["category"] for m in c1["data"]["observation"]["messages"]]
        assert categories[0] == "PLAYER_ACTION" and "PROMPT" not in categories
        transcript = u1["data"]["observation"]["messages"][0]["content"]
        assert transcript.startswith(u0["data"]["observation"]["messages"][0]["content"])
        assert u1["data"]["observation"]["prompt"] == "GuessTheNumber-v0"  # OpenEnv's rule after turn 0
        assert len(json.dumps(c1)) < len(json.dumps(u1))


async def test_tictactoe_against_the_scripted_opponent_which_blocks(base_url: str) -> None:
    async with websockets.connect(ws_url(base_url)) as ws:
        s = Session(ws)
        first = await s.reset(env_id="TicTacToe-v0", num_players=2, opponent="scripted", seed=3)
        assert first["data"]["observation"]["current_player_id"] == 0
        await s.step("[0]")  # the scripted opponent (X) takes the centre
        board = (await s.state())["data"]["raw_state"]["game_state"]["board"]
        assert board[1][1] == "X" and board[0][0] == "O"
        reply = await s.step("[1]")  # threatens 0-1-2: the opponent must block at 2
        board = (await s.state())["data"]["raw_state"]["game_state"]["board"]
        assert board[0][2] == "X"
        assert reply["data"]["observation"]["current_player_id"] == 0 and not reply["data"]["done"]
        transcript = reply["data"]["observation"]["messages"][0]["content"]
        assert "placed their symbol (X) in cell 2" in transcript


@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "ConnectFour-v0"])
@pytest.mark.parametrize("opponent", ["random", "scripted"])
async def test_two_player_games_finish_against_each_opponent(base_url: str, env_id: str, opponent: str) -> None:
    async with websockets.connect(ws_url(base_url), max_size=None) as ws:
        s = Session(ws)
        outcomes = []
        for seed in range(4):
            reply = await s.reset(env_id=env_id, num_players=2, opponent=opponent, seed=seed,
                                  agent_player_id=seed % 2)
            for turn in range(60):
                if reply["data"]["done"]:
                    break
                assert reply["data"]["observation"]["current_player_id"] == seed % 2
                board = (await s.state())["data"]["raw_state"]["game_state"]["board"]
                if env_id == "TicTacToe-v0":
                    free = [r * 3 + c for r in range(3) for c in range(3) if board[r][c] == ""]
                    move = f"[{free[(seed + turn) % len(free)]}]"
                else:
                    free = [c for c in range(len(board[0])) if board[0][c] == "."]
                    move = f"[col {free[(seed + turn) % len(free)]}]"
                reply = await s.step(move)
                assert reply["type"] == "observation", reply
            assert reply["data"]["done"]
            outcomes.append(reply["data"]["reward"])
        assert all(r in (-1.0, 0.0, 1.0) for r in outcomes), outcomes


async def test_self_play_one_session_moves_for_both_players(base_url: str) -> None:
    async with websockets.connect(ws_url(base_url)) as ws:
        s = Session(ws)
        reply = await s.reset(env_id="TicTacToe-v0", num_players=2, seed=1)
        players = [reply["data"]["observation"]["current_player_id"]]
        for move in ("[4]", "[0]", "[8]"):
            reply = await s.step(move)
            players.append(reply["data"]["observation"]["current_player_id"])
        assert players == [0, 1, 0, 1]
        assert reply["data"]["observation"]["legal_players"] == [0, 1]


def test_the_wheel_generic_client_plays_guess_the_number_to_a_win(base_url: str) -> None:
    with GenericEnvClient(base_url=base_url).sync() as client:
        result = client.reset(seed=11)
        low, high = 1, 20
        for _ in range(10):
            guess = (low + high) // 2
            result = client.step({"message": f"[{guess}]"})
            if result.done:
                break
            feedback = result.observation["messages"][0]["content"].rsplit("[GAME]", 1)[-1]
            if "higher" in feedback:
                low = guess + 1
            else:
                high = guess - 1
        assert result.done and result.reward == 1.0
        state = client.state()
        assert state["env_id"] == "GuessTheNumber-v0" and state["raw_state"]["game_state"]


def test_a_game_that_needs_nltk_data_is_refused_at_start_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TextArenaOptionError, match="NLTK data not installed") as refused:
        create_textarena_app("Hangman-v0")
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("TEXTARENA_ENV_ID", "Hangman-v0")
    assert cli_main(["--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Hangman-v0 is unavailable: NLTK data not installed: words")
    assert "\n" not in err


def test_openenv_style_settings_reach_the_game(pool: GamePool, monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.textarena.app import env_kwargs_from_environ

    monkeypatch.setenv("TEXTARENA_KW_MAX_NUMBER", "5")
    monkeypatch.setenv("TEXTARENA_KW_MAX_TURNS", "3")
    kwargs = env_kwargs_from_environ()
    assert kwargs == {"max_number": 5, "max_turns": 3}
    app = create_textarena_app("GuessTheNumber-v0", max_turns=9, env_kwargs=kwargs, game_pool=pool)
    with running_server(app) as url, GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(seed=2)
        assert "between 1 and 5" in result.observation["prompt"]
        for _ in range(3):
            result = client.step({"message": "[99]"})
            if result.done:
                break
        state = client.state()
        assert state["max_turns"] == 9 and state["raw_state"]["turn"] <= 3
        assert result.done
    with pytest.raises(TextArenaOptionError, match="refused its kwargs"):
        create_textarena_app("GuessTheNumber-v0", env_kwargs={"colour": "red"}, game_pool=pool)


async def test_a_game_textarena_cannot_compile_here_gets_a_clear_error(base_url: str) -> None:
    import sys

    if sys.version_info >= (3, 12):
        pytest.skip("textarena 0.7.4's Chess module compiles on Python >= 3.12")
    async with websockets.connect(ws_url(base_url)) as ws:
        reply = await Session(ws).reset(env_id="Chess-v0", num_players=2)
    assert "does not compile on Python 3.11" in reply["data"]["message"]


def test_the_web_page_offers_every_reset_option_of_any_game(base_url: str) -> None:
    import httpx

    assert httpx.get(f"{base_url}/web", timeout=10).status_code == 200
    info = httpx.get(f"{base_url}/web/api/info", timeout=10).json()
    names = json.dumps(info["reset_parameters"])
    for option in ("env_id", "num_players", "observation_form", "opponent", "agent_player_id"):
        assert option in names
    assert info["text_field"] == "message"


async def test_concurrent_resets_with_different_seeds_each_get_their_own_game(base_url: str) -> None:
    import textarena as ta

    seeds = list(range(100, 108))
    expected = []
    for seed in seeds:
        game = ta.make("Minesweeper-v0-raw")
        game.reset(num_players=1, seed=seed)
        game.step("[3 3]")  # the mines are laid at the first click, from the generator
        expected.append(game.state.game_state["grid"])

    async def one(seed: int) -> Any:
        async with websockets.connect(ws_url(base_url), max_size=None) as ws:
            s = Session(ws)
            await s.reset(env_id="Minesweeper-v0-raw", seed=seed)
            await s.step("[3 3]")
            return (await s.state())["data"]["raw_state"]["game_state"]["grid"]

    grids = await asyncio.gather(*(one(seed) for seed in seeds))
    assert grids == expected
    assert len({json.dumps(g) for g in grids}) > 1
