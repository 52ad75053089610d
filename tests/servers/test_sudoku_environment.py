"""SudokuEnvironment called directly (no server): its own refusals, verdicts and board pool."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.games.sudoku import solve
from servers.sudoku import SudokuAction, SudokuEnvironment
from servers.sudoku.environment import default_board_pool
from servers.textarena.errors import GenerationTimeout

pytestmark = pytest.mark.timeout(60)


async def test_step_before_reset_is_refused() -> None:
    with pytest.raises(NotResetError, match="reset"):
        SudokuEnvironment().step(SudokuAction(message="[1 1 1]"))


async def test_step_after_done_is_refused_when_called_directly() -> None:
    env = SudokuEnvironment("Sudoku-v0-very-easy")
    obs = env.reset(seed=4, error_allowance=0)
    assert obs.invalid_moves_left == 0
    end = env.step(SudokuAction(message="nonsense"))
    assert end.done and end.reward == 0.0 and end.last_move.verdict == "bad_format"
    with pytest.raises(EpisodeDoneError) as refused:
        env.step(SudokuAction(message="[1 1 1]"))
    assert refused.value.code == "EPISODE_DONE"


async def test_unseeded_reset_reports_a_seed_that_replays_the_board() -> None:
    env = SudokuEnvironment()
    first = env.reset()
    seed = env.state.seed
    assert isinstance(seed, int)
    replay = SudokuEnvironment().reset(seed=seed)
    assert replay.board == first.board
    assert first.initial_filled == sum(1 for row in first.board for v in row if v)


async def test_valid_move_fills_the_cell_and_counts_a_turn() -> None:
    env = SudokuEnvironment()
    obs = env.reset(seed=9)
    solution = solve(obs.board)
    assert solution is not None
    r, c = next((r, c) for r in range(9) for c in range(9) if not obs.board[r][c])
    after = env.step(SudokuAction(message=f"[{r + 1} {c + 1} {solution[r][c]}]"))
    assert after.board[r][c] == solution[r][c]
    assert after.last_move.model_dump() == {
        "move": [r + 1, c + 1, solution[r][c]], "verdict": "valid", "reason": None}
    assert (after.step, after.turn, after.done, after.reward) == (1, 1, False, 0.0)


async def test_sessions_asking_for_one_seed_share_one_generation() -> None:
    pool = default_board_pool()
    futures = [pool.submit("Sudoku-v0", 555) for _ in range(4)]
    assert all(f is futures[0] for f in futures)
    # Variants with the same clue count share boards too (-train/-raw only change the text).
    assert pool.submit("Sudoku-v0-raw", 555) is futures[0]


def test_a_caller_that_gives_up_does_not_cancel_a_board_another_waits_for() -> None:
    pool = default_board_pool()
    with ThreadPoolExecutor(1) as threads:  # each waiter blocks, as a session's lane does
        other = threads.submit(pool.board, "Sudoku-v0-hard", 77, timeout_s=50)
        time.sleep(0.2)  # it waits first
        with pytest.raises(GenerationTimeout):
            pool.board("Sudoku-v0-hard", 77, timeout_s=0.01)
        board = other.result(timeout=60)
    assert len(board.puzzle) == 9 and sum(1 for row in board.puzzle for v in row if v) < 40
