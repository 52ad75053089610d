"""Sudoku logic with no I/O: the solver, TextArena's board text both ways, and reading a move."""

from __future__ import annotations

import pytest
from textarena.envs.Sudoku.env import SudokuEnv

from envsdk.games.sudoku import (
    candidates,
    count_filled,
    parse_board,
    parse_move,
    render_board,
    solve,
)

# A puzzle the fewest-candidates-first search cannot solve without undoing a guess.
NEEDS_BACKTRACKING = "100007090030020008009600500005300900010080002600004000300000010040000007007000300"


def _board(digits: str) -> list[list[int]]:
    return [[int(digits[9 * r + c]) for c in range(9)] for r in range(9)]


def _is_solution(solution: list[list[int]], puzzle: list[list[int]]) -> bool:
    """Every row, column and box holds 1-9 once, and every given of `puzzle` is kept."""
    units = [
        *solution,
        *([solution[r][c] for r in range(9)] for c in range(9)),
        *([solution[r][c] for r in range(br, br + 3) for c in range(bc, bc + 3)] for br in (0, 3, 6) for bc in (0, 3, 6)),
    ]
    givens_kept = all(puzzle[r][c] in (0, solution[r][c]) for r in range(9) for c in range(9))
    return givens_kept and all(sorted(unit) == list(range(1, 10)) for unit in units)


def test_the_solver_undoes_a_wrong_guess_and_solves_a_hard_puzzle() -> None:
    puzzle = _board(NEEDS_BACKTRACKING)
    given = [row[:] for row in puzzle]
    solution = solve(puzzle)
    assert solution is not None and _is_solution(solution, puzzle)
    assert puzzle == given  # the caller's board is left as it was


def test_the_solver_fills_an_empty_board() -> None:
    solution = solve(_board("0" * 81))
    assert solution is not None and _is_solution(solution, _board("0" * 81))


def test_a_board_with_no_solution_gets_none() -> None:
    # Row 1 lacks only a 9 at C9, and column 9 already holds a 9 lower down.
    board = _board(NEEDS_BACKTRACKING)
    board[0] = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    board[8][8] = 9
    assert candidates(board)[(0, 8)] == set()
    assert solve(board) is None


def test_a_solved_board_is_its_own_solution() -> None:
    solution = solve(_board(NEEDS_BACKTRACKING))
    assert solution is not None
    assert solve(solution) == solution and count_filled(solution) == 81


def test_count_filled_counts_every_cell_that_is_not_zero() -> None:
    board = _board(NEEDS_BACKTRACKING)
    assert count_filled(board) == sum(ch != "0" for ch in NEEDS_BACKTRACKING)
    board[0][1] = 12  # not a digit, but a filled cell
    assert count_filled(board) == sum(ch != "0" for ch in NEEDS_BACKTRACKING) + 1


@pytest.mark.parametrize("digits", [NEEDS_BACKTRACKING, "0" * 81, "123456789" * 9])
def test_the_board_is_drawn_as_textarena_draws_it(digits: str) -> None:
    board = _board(digits)
    assert render_board(board) == SudokuEnv._get_grid_string_with_indices(None, board)


def test_a_cell_outside_one_to_nine_is_drawn_as_its_value() -> None:
    board = _board(NEEDS_BACKTRACKING)
    board[4][4] = 12
    row = render_board(board).splitlines()[1 + 4 + 1]  # the header, R1-R3, a separator
    assert row.startswith("R5 ") and row.replace("|", "").split()[1:] == [".", "1", ".", ".", "12", ".", ".", ".", "2"]


def test_the_last_complete_board_in_a_text_is_read() -> None:
    first, second = _board(NEEDS_BACKTRACKING), _board("0" * 81)
    text = f"Game Board:\n{render_board(first)}\nYou played [1 2 3].\n{render_board(second)}\nYour move."
    assert parse_board(text) == second
    # A board cut off before R9 is not a board: the complete one before it is read.
    cut = "\n".join(render_board(second).splitlines()[:9])
    assert parse_board(f"{render_board(first)}\n{cut}") == first
    assert parse_board(cut) is None and parse_board("no board here") is None
    # Rows before any R1 (a board scrolled off the top), and an R9 with rows missing, are no board.
    lines = render_board(first).splitlines()
    assert parse_board("\n".join(lines[3:]) + "\n" + render_board(second)) == second
    without_r5 = "\n".join(line for line in lines if not line.startswith("R5"))
    assert parse_board(without_r5) is None
    assert parse_board(f"{render_board(second)}\n{without_r5}") == second


@pytest.mark.parametrize(
    ("reply", "move"),
    [
        ("[3 4 7]", (3, 4, 7)),
        # Text and numbers before the move: the bracketed move wins over the first integers.
        ("Step 12: row 3 has two gaps, so [3 4 7]", (3, 4, 7)),
        ("I count 81 cells and 30 clues. " * 40 + "My move is [9 1 5]. Then maybe [1 1 1].", (9, 1, 5)),
        ("[10 2 3]", (10, 2, 3)),
        # No bracketed move: the first three integers.
        ("3 4 7", (3, 4, 7)),
        ("row 5, column 6, digit 7, then 8 and 9", (5, 6, 7)),
        ("[1  2 3]", (1, 2, 3)),
    ],
)
def test_a_move_is_read_from_a_reply(reply: str, move: tuple[int, int, int]) -> None:
    assert parse_move(reply) == move


@pytest.mark.parametrize("reply", ["", "no move", "[1 2]", "row 1 column 2", "[a b c]"])
def test_a_reply_without_three_numbers_has_no_move(reply: str) -> None:
    assert parse_move(reply) is None
