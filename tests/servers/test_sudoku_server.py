"""The TextArena Sudoku server end to end: real uvicorn, the real openenv client, raw frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import textarena as ta
import websockets
from openenv.core.generic_client import GenericEnvClient

from envsdk.games.sudoku import Board, parse_board, solve
from envsdk.testing import running_server
from servers.sudoku import SudokuOptionError, create_sudoku_app
from servers.sudoku.openenv_style import create_openenv_style_app
from servers.sudoku.start_sudoku_server import main as cli_main

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_server(create_sudoku_app("Sudoku-v0", max_concurrent_envs=64)) as url:
        yield url


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws"


def board_of_seed(env_id: str, seed: int) -> Board:
    """The puzzle TextArena itself gives for `seed`, generated alone in this process."""
    game = ta.make(env_id)
    game.reset(num_players=1, seed=seed)
    while hasattr(game, "env"):
        game = game.env
    return [row[:] for row in game.game_board]


class Session:
    """A raw-frame client: one JSON request, one JSON reply."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sizes: list[int] = []

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(frame))
        raw = await asyncio.wait_for(self.ws.recv(), timeout=30)
        self.sizes.append(len(raw))
        return json.loads(raw)

    async def reset(self, **data: Any) -> dict[str, Any]:
        return await self.call({"type": "reset", "data": data})

    async def step(self, message: str) -> dict[str, Any]:
        return await self.call({"type": "step", "data": {"message": message}})


def empty_cells_with_solution(board: Board) -> list[tuple[int, int, int]]:
    solution = solve(board)
    assert solution is not None
    return [(r + 1, c + 1, solution[r][c]) for r in range(9) for c in range(9) if not board[r][c]]


def test_openenv_client_plays_a_game_to_the_win(base_url: str) -> None:
    with GenericEnvClient(base_url=base_url).sync() as client:
        result = client.reset(seed=11)
        board = parse_board(result.observation["messages"][-1]["content"])
        assert board == board_of_seed("Sudoku-v0", 11)
        moves = empty_cells_with_solution(board)
        for i, (r, c, n) in enumerate(moves):
            result = client.step({"message": f"I will play [{r} {c} {n}]"})
            assert result.done == (i == len(moves) - 1)
        assert result.reward == 1.0
        assert result.observation["last_move"]["verdict"] == "valid"
        assert all(all(row) for row in result.observation["board"])


async def test_concurrent_sessions_each_get_their_seeds_board(base_url: str) -> None:
    seeds = list(range(100, 132)) + [100]  # the last one shares a seed with the first

    async def reset_one(seed: int) -> Board:
        async with websockets.connect(ws_url(base_url), max_size=None) as ws:
            reply = await Session(ws).reset(seed=seed)
            assert reply["type"] == "observation", reply
            return reply["data"]["observation"]["board"]

    boards = await asyncio.gather(*(reset_one(s) for s in seeds))
    expected = {seed: board_of_seed("Sudoku-v0", seed) for seed in set(seeds)}
    assert [b == expected[s] for b, s in zip(boards, seeds)] == [True] * len(seeds)
    assert boards[0] == boards[-1]
    assert len({json.dumps(b) for b in boards}) == 32


async def test_second_invalid_move_ends_the_game_with_the_fraction_then_steps_are_refused(
    base_url: str,
) -> None:
    async with websockets.connect(ws_url(base_url), max_size=None) as ws:
        session = Session(ws)
        reply = await session.reset(seed=7)
        obs = reply["data"]["observation"]
        moves = empty_cells_with_solution(obs["board"])
        for r, c, n in moves[:3]:
            await session.step(f"[{r} {c} {n}]")
        first = await session.step("no move here")
        assert first["data"]["done"] is False
        assert first["data"]["observation"]["last_move"]["verdict"] == "bad_format"
        assert first["data"]["observation"]["invalid_moves_left"] == 0
        r, c, _ = moves[3]
        wrong = next(d for d in range(1, 10) if d != moves[3][2])
        last = await session.step(f"[{r} {c} {wrong}]")
        assert last["data"]["done"] is True
        assert last["data"]["reward"] == pytest.approx(3 / len(moves))
        assert last["data"]["observation"]["last_move"] == {
            "move": [r, c, wrong],
            "verdict": "invalid",
            "reason": f"Invalid move. Player 0 attempted to place {wrong} at ({r}, {c}), "
            "which violates Sudoku rules.",
        }
        refused = await session.step(f"[{r} {c} {moves[3][2]}]")
        assert refused["type"] == "error"
        # A plain OpenEnv peer (no handshake) gets OpenEnv's code for the refusal.
        assert refused["data"]["code"] == "EXECUTION_ERROR" and "episode is over" in refused["data"]["message"]
        state = await session.call({"type": "state"})
        assert state["data"]["done"] is True and state["data"]["step_count"] == 5


async def test_compact_frames_stay_small_while_cumulative_frames_grow(base_url: str) -> None:
    async def play(form: str) -> tuple[list[int], list[dict[str, Any]]]:
        async with websockets.connect(ws_url(base_url), max_size=None) as ws:
            session = Session(ws)
            reset = await session.reset(seed=21, observation_form=form)
            observations = [reset["data"]["observation"]]
            for r, c, n in empty_cells_with_solution(observations[0]["board"])[:10]:
                observations.append((await session.step(f"[{r} {c} {n}]"))["data"]["observation"])
            return session.sizes, observations

    compact_sizes, compact = await play("compact")
    cumulative_sizes, cumulative = await play("cumulative")
    assert max(compact_sizes[1:]) < 2_000
    assert all(b > a for a, b in zip(cumulative_sizes[1:], cumulative_sizes[2:]))
    assert cumulative_sizes[-1] > 5 * compact_sizes[-1]
    # Both forms carry the same structured facts.
    assert [o["board"] for o in compact] == [o["board"] for o in cumulative]
    # ms-swift reads the new text of the cumulative form as content[last_len:].
    last_len = len(cumulative[0]["messages"][-1]["content"])
    for obs in cumulative[1:]:
        content = obs["messages"][-1]["content"]
        new_text = content[last_len:]
        last_len = len(content)
        r, c, n = obs["last_move"]["move"]
        assert new_text.startswith(f"\n[Player] [{r} {c} {n}]\n[GAME] Board state:")
        assert parse_board(new_text) == obs["board"]
    # The compact form sends that new game text as separate messages, nothing older.
    step = compact[1]
    assert [m["category"] for m in step["messages"]] == ["PLAYER_ACTION", "GAME_BOARD"]
    assert parse_board(step["messages"][-1]["content"]) == step["board"]
    assert compact[0]["prompt"].startswith("You are Player 0. You are playing Sudoku.")
    assert step["prompt"] == ""


async def test_cumulative_form_matches_openenv_style_server_frame_for_frame(base_url: str) -> None:
    structured = {"board", "initial_filled", "last_move", "invalid_moves_left", "step", "turn",
                  "end_reason"}

    async def play(url: str) -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(url), max_size=None) as ws:
            session = Session(ws)
            frames = [await session.reset(seed=3)]
            board = parse_board(frames[0]["data"]["observation"]["messages"][-1]["content"])
            r, c, n = empty_cells_with_solution(board)[0]
            for message in (f"[{r} {c} {n}]", "[1 1 1]", "bad", f"[{r} {c} {n}]"):
                frames.append(await session.step(message))
            return frames[:4]  # OpenEnv keeps stepping after done; compare up to the end

    with running_server(create_openenv_style_app("Sudoku-v0")) as openenv_url:
        theirs = await play(openenv_url)
    ours = await play(base_url)
    for mine, reference in zip(ours, theirs):
        body = {k: v for k, v in mine["data"]["observation"].items() if k not in structured}
        assert body == reference["data"]["observation"]
        assert (mine["data"]["reward"], mine["data"]["done"]) == (
            reference["data"]["reward"], reference["data"]["done"])


async def test_unknown_or_bad_reset_options_get_clear_errors(base_url: str) -> None:
    async with websockets.connect(ws_url(base_url), max_size=None) as ws:
        session = Session(ws)
        unknown = await session.reset(seed=1, difficulty="hard")
        assert unknown["type"] == "error"
        assert "difficulty" in unknown["data"]["message"]
        bad_form = await session.reset(observation_form="short")
        assert bad_form["type"] == "error"
        assert "observation_form must be one of cumulative, compact" in bad_form["data"]["message"]
        bad_allowance = await session.reset(error_allowance=-1)
        assert "error_allowance must be >= 0" in bad_allowance["data"]["message"]
        bad_variant = await session.reset(env_id="Wordle-v0")
        assert "Unknown Sudoku env id 'Wordle-v0'" in bad_variant["data"]["message"]
        # The session survives its bad requests.
        ok = await session.reset(seed=1, env_id="Sudoku-v0-easy", error_allowance=3)
        assert ok["data"]["observation"]["board"] == board_of_seed("Sudoku-v0-easy", 1)
        assert ok["data"]["observation"]["invalid_moves_left"] == 3


def test_bad_env_id_is_refused_at_startup(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SudokuOptionError, match="valid ids: .*Sudoku-v0-hard"):
        create_sudoku_app("Wordle-v0")
    with pytest.raises(SystemExit) as exited:
        cli_main(["--env-id", "Sudoku-v1"])
    assert exited.value.code == 2
    assert "Unknown Sudoku env id 'Sudoku-v1'" in capsys.readouterr().err
