"""Scripted policies: random moves are well formed and seeded; oracles win real games."""

from __future__ import annotations

import time
from typing import Any

import pytest

from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeGame, parse_direction, shortest_path
from envsdk.games.sudoku import MOVE_RE, parse_board, render_board, solve
from envsdk.policies import (
    FrozenLakeOraclePolicy,
    ObservationParseError,
    PolicyError,
    PolicyOutput,
    RandomPolicy,
    SudokuOraclePolicy,
)
from envsdk.policies.scripted import canonical_env_name, parse_frozen_lake
from envsdk.registry import envs

# A valid, fully solved grid; puzzles below are made by blanking cells of it.
SOLVED = [
    [5, 3, 4, 6, 7, 8, 9, 1, 2],
    [6, 7, 2, 1, 9, 5, 3, 4, 8],
    [1, 9, 8, 3, 4, 2, 5, 6, 7],
    [8, 5, 9, 7, 6, 1, 4, 2, 3],
    [4, 2, 6, 8, 5, 3, 7, 9, 1],
    [7, 1, 3, 9, 2, 4, 8, 5, 6],
    [9, 6, 1, 5, 3, 7, 2, 8, 4],
    [2, 8, 7, 4, 1, 9, 6, 3, 5],
    [3, 4, 5, 2, 8, 6, 1, 7, 9],
]


def _puzzle(blank_every: int, offset: int = 0) -> list[list[int]]:
    return [
        [0 if (9 * r + c + offset) % blank_every == 0 else v for c, v in enumerate(row)]
        for r, row in enumerate(SOLVED)
    ]


def _user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


# --- RandomPolicy -------------------------------------------------------------------------


async def test_random_sudoku_moves_are_well_formed_and_in_range() -> None:
    policy = RandomPolicy("Sudoku-v0", seed=1)
    for _ in range(50):
        match = MOVE_RE.fullmatch(await policy.act([]))
        assert match is not None
        assert all(1 <= int(g) <= 9 for g in match.groups())


async def test_random_frozen_lake_moves_parse_as_directions() -> None:
    policy = RandomPolicy("frozen_lake", seed=1)
    seen = {parse_direction(await policy.act([])) for _ in range(60)}
    assert seen == {"up", "down", "left", "right"}


async def test_random_policy_same_seed_same_replies() -> None:
    a, b, c = RandomPolicy("sudoku", seed=7), RandomPolicy("sudoku", seed=7), RandomPolicy("sudoku", seed=8)
    replies_a = [await a.act([]) for _ in range(10)]
    assert replies_a == [await b.act([]) for _ in range(10)]
    assert replies_a != [await c.act([]) for _ in range(10)]


async def test_any_other_environment_gets_seeded_generic_replies() -> None:
    from envsdk.policies.scripted import GENERIC_REPLIES

    a, b = RandomPolicy("my_env", seed=3), RandomPolicy("my_env", seed=3)
    replies = [await a.act([]) for _ in range(20)]
    assert replies == [await b.act([]) for _ in range(20)]
    assert set(replies) <= set(GENERIC_REPLIES) and len(set(replies)) > 3


@pytest.mark.parametrize(
    ("spelling", "name"),
    [("Sudoku-v0", "sudoku"), ("sudoku-hard", "sudoku"), ("FrozenLake", "frozen_lake"), ("frozen-lake", "frozen_lake")],
)
def test_canonical_env_name_accepts_usual_spellings(spelling: str, name: str) -> None:
    assert canonical_env_name(spelling) == name


async def test_default_act_ex_wraps_act_with_stop() -> None:
    out = await RandomPolicy("sudoku", seed=0).act_ex([])
    assert isinstance(out, PolicyOutput)
    assert out.finish_reason == "stop" and MOVE_RE.fullmatch(out.text)


# --- SudokuOraclePolicy -------------------------------------------------------------------


@pytest.mark.parametrize(("blank_every", "offset"), [(2, 0), (3, 1), (5, 2), (7, 0), (81, 40)])
async def test_sudoku_oracle_move_is_correct_and_targets_an_empty_cell(blank_every: int, offset: int) -> None:
    board = _puzzle(blank_every, offset)
    reply = await SudokuOraclePolicy().act([_user("Game Board:\n" + render_board(board))])
    match = MOVE_RE.fullmatch(reply)
    assert match is not None
    r, c, n = (int(g) for g in match.groups())
    assert board[r - 1][c - 1] == 0
    solution = solve(board)
    assert solution is not None and solution[r - 1][c - 1] == n


async def test_sudoku_oracle_reads_a_structured_board_before_text() -> None:
    board = _puzzle(81, 0)  # only R1C1 is empty
    reply = await SudokuOraclePolicy().act([_user("no board drawn here", board=board)])
    assert reply == "[1 1 5]"


async def test_sudoku_oracle_uses_the_newest_board() -> None:
    old, new = _puzzle(81, 0), _puzzle(81, 1)  # empty R1C1 vs empty R9C9
    messages = [
        _user(render_board(old)),
        {"role": "assistant", "content": "[1 1 5]"},
        _user("Step 1. Progress: 1 cells filled.\n" + render_board(new)),
    ]
    assert await SudokuOraclePolicy().act(messages) == "[9 9 9]"


async def test_sudoku_oracle_solves_once_per_game() -> None:
    policy = SudokuOraclePolicy()
    board = _puzzle(3)
    for _ in range(5):
        reply = await policy.act([_user(render_board(board))])
        r, c, n = (int(g) for g in MOVE_RE.fullmatch(reply).groups())  # type: ignore[union-attr]
        board[r - 1][c - 1] = n
    assert len(policy._solutions) == 1


@pytest.mark.parametrize("cache_size", [256, 2])
async def test_sudoku_oracle_keeps_interleaved_games_apart(cache_size: int) -> None:
    """Boards of three games with different solutions, one move of each in turn: every reply is
    right for its own game, whatever the cache keeps (a game dropped from it is solved again)."""
    relabel = [(1, 2, 3, 4, 5, 6, 7, 8, 9), (2, 3, 4, 5, 6, 7, 8, 9, 1), (9, 8, 7, 6, 5, 4, 3, 2, 1)]
    solutions = [[[digits[v - 1] for v in row] for row in SOLVED] for digits in relabel]
    boards = [[[0 if (9 * r + c + g) % 4 == 0 else v for c, v in enumerate(row)] for r, row in enumerate(sol)]
              for g, sol in enumerate(solutions)]
    policy = SudokuOraclePolicy(cache_size=cache_size)
    for _ in range(6):
        for board, solution in zip(boards, solutions):
            reply = await policy.act([_user(render_board(board))])
            r, c, n = (int(g) for g in MOVE_RE.fullmatch(reply).groups())  # type: ignore[union-attr]
            assert board[r - 1][c - 1] == 0 and n == solution[r - 1][c - 1], reply
            board[r - 1][c - 1] = n
    assert len(policy._solutions) == min(cache_size, 3)


async def test_sudoku_oracle_without_a_board_raises_a_parse_error() -> None:
    with pytest.raises(ObservationParseError, match="no Sudoku board"):
        await SudokuOraclePolicy().act([_user("hello"), {"role": "assistant", "content": render_board(SOLVED)}])


async def test_sudoku_oracle_on_a_contradictory_board_raises() -> None:
    board = _puzzle(2)
    board[0][1] = board[0][0] = 9  # two 9s in row 1
    with pytest.raises(PolicyError, match="no solution"):
        await SudokuOraclePolicy().act([_user(render_board(board))])


async def test_sudoku_oracle_wins_a_textarena_game() -> None:
    ta = pytest.importorskip("textarena")
    env = ta.make("Sudoku-v0")
    env.reset(num_players=1, seed=11)
    policy = SudokuOraclePolicy()
    messages: list[dict[str, Any]] = []
    _, observation = env.get_observation()
    empty_at_start = sum(v == 0 for row in parse_board(observation) or [] for v in row)
    assert empty_at_start > 0
    done, moves = False, 0
    while not done and moves < 81:
        messages.append(_user(observation))
        reply = await policy.act(messages)
        messages.append({"role": "assistant", "content": reply})
        done, _ = env.step(reply)
        moves += 1
        _, observation = env.get_observation()
    rewards, _ = env.close()
    assert done and rewards[0] == 1
    assert moves == empty_at_start  # every move was accepted: no retries


# --- FrozenLakeOraclePolicy ---------------------------------------------------------------


async def _play_frozen_lake(seed: int, size: int) -> tuple[float, bool, int, int]:
    env = envs["frozen_lake"]({"size": size})
    observation, _, system = await env.reset(RolloutRequest(data_dict={"env_config": {"seed": seed}}))
    game = env.game
    optimal = len(shortest_path(game.grid, game.start, game.goal) or [])
    policy = FrozenLakeOraclePolicy()
    messages = [{"role": "system", "content": system}, _user(observation)]
    reward, done, steps = 0.0, False, 0
    while not done and steps < size * size:
        messages.append({"role": "assistant", "content": await policy.act(messages)})
        observation, reward, done, _ = await env.step(messages)
        messages.append(_user(observation))
        steps += 1
    await env.close()
    return reward, done, steps, optimal


@pytest.mark.parametrize(("seed", "size"), [(0, 4), (1, 4), (2, 5), (3, 6), (4, 8), (5, 4)])
async def test_frozen_lake_oracle_reaches_the_goal_in_the_shortest_path_length(seed: int, size: int) -> None:
    reward, done, steps, optimal = await _play_frozen_lake(seed, size)
    assert done and reward == 1.0
    assert steps == optimal


def test_parse_frozen_lake_reads_player_and_goal_from_the_render() -> None:
    game = FrozenLakeGame(["SFH", "FHF", "FFG"], start=(0, 0), goal=(2, 2))
    game.move("down")
    view = parse_frozen_lake(f"You moved down.\n{game.render()}\nWhat is your move?")
    assert view is not None
    assert view.position == (1, 0) and view.goal == (2, 2)
    assert view.grid == ["SFH", "FHF", "FFG"]


def test_parse_frozen_lake_takes_the_last_map_and_skips_finished_games() -> None:
    first = FrozenLakeGame(["SF", "FG"], start=(0, 0), goal=(1, 1))
    second = FrozenLakeGame(["SF", "GF"], start=(0, 0), goal=(1, 0))
    text = f"{first.render()}\nthen\n{second.render()}"
    view = parse_frozen_lake(text)
    assert view is not None and view.goal == (1, 0)
    second.move("down")  # onto the goal: the map no longer shows G
    assert parse_frozen_lake(second.render()) is None


async def test_frozen_lake_oracle_without_a_map_raises_a_parse_error() -> None:
    with pytest.raises(ObservationParseError, match="no FrozenLake map"):
        await FrozenLakeOraclePolicy().act([_user("You reached the goal!")])


def test_a_long_line_that_only_looks_like_a_board_row_is_read_in_linear_time() -> None:
    # Boards are parsed out of transcripts that repeat the agent's own moves: a row label
    # followed by a run of spaces once took quadratic time (8,000 spaces: 1.2 s). 200,000 spaces
    # would take minutes that way; read in one pass they take milliseconds.
    text = "R1" + " " * 200_000 + "x"
    started = time.perf_counter()
    assert parse_board(text) is None
    assert time.perf_counter() - started < 2.0
