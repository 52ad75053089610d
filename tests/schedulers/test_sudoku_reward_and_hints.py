"""Pure parts of the Sudoku scheduler: hints and the five reward components."""

from __future__ import annotations

import random

import pytest

from envsdk.games.sudoku import candidates, count_filled, parse_board, render_board
from envsdk.schedulers.sudoku import SudokuReward, SudokuScheduler, move_components, sudoku_hints

# A valid solved grid built from the canonical pattern, then shuffled by digit relabelling.
_BASE = [[(3 * (r % 3) + r // 3 + c) % 9 + 1 for c in range(9)] for r in range(9)]


def _puzzle(seed: int, holes: int) -> list[list[int]]:
    rng = random.Random(seed)
    relabel = list(range(1, 10))
    rng.shuffle(relabel)
    grid = [[relabel[v - 1] for v in row] for row in _BASE]
    for idx in rng.sample(range(81), holes):
        grid[idx // 9][idx % 9] = 0
    return grid


def _independent_candidates(board: list[list[int]]) -> dict[tuple[int, int], set[int]]:
    """Candidates by a different route: precomputed row, column and box digit sets."""
    rows = [set(board[r]) - {0} for r in range(9)]
    cols = [{board[r][c] for r in range(9)} - {0} for c in range(9)]
    boxes = [set() for _ in range(9)]
    for r in range(9):
        for c in range(9):
            if board[r][c]:
                boxes[(r // 3) * 3 + c // 3].add(board[r][c])
    return {
        (r + 1, c + 1): set(range(1, 10)) - rows[r] - cols[c] - boxes[(r // 3) * 3 + c // 3]
        for r in range(9)
        for c in range(9)
        if board[r][c] == 0
    }


BOARDS = [_puzzle(seed, holes) for seed, holes in [(1, 21), (2, 40), (3, 55), (4, 5), (5, 64)]]


@pytest.mark.parametrize("board", BOARDS, ids=[f"holes{81 - count_filled(b)}" for b in BOARDS])
def test_hinted_cells_carry_exactly_their_candidates(board: list[list[int]]) -> None:
    expected = _independent_candidates(board)
    hints = sudoku_hints(board)
    assert len(hints.guaranteed) <= 5 and len(hints.options) <= 5
    for r, c, digit in hints.guaranteed:
        assert expected[(r, c)] == {digit}
    for r, c, digits in hints.options:
        assert set(digits) == expected[(r, c)]
        assert 2 <= len(digits) <= 3
    # Hints come from the 10 cells with the fewest candidates.
    cutoff = sorted(len(v) for v in expected.values())[: 10][-1]
    for r, c, *_ in [*hints.guaranteed, *hints.options]:
        assert len(expected[(r, c)]) <= cutoff
    singles = sorted(k for k, v in expected.items() if len(v) == 1)
    assert [(r, c) for r, c, _ in hints.guaranteed] == singles[: min(5, len(singles), 10)]


def test_hints_equal_an_independent_ranking_on_many_boards() -> None:
    """Every hint, in order: the 10 empty cells with the fewest candidates (ties by row, then
    column), single-candidate ones first five as guaranteed, 2-3-candidate ones first five as
    options; checked on 300 random puzzles from nearly full to nearly empty."""
    rng = random.Random(7)
    for _ in range(300):
        board = _puzzle(rng.randrange(1 << 30), rng.randint(1, 75))
        expected = _independent_candidates(board)
        ranked = sorted(expected, key=lambda cell: (len(expected[cell]), cell))[:10]
        hints = sudoku_hints(board, [(1, 1, 1), (1, 1, 1)])
        assert hints.tried == ((1, 1, 1),)
        assert hints.guaranteed == tuple((r, c, min(expected[(r, c)])) for r, c in ranked if len(expected[(r, c)]) == 1)[:5]
        assert hints.options == tuple(
            (r, c, tuple(sorted(expected[(r, c)]))) for r, c in ranked if 2 <= len(expected[(r, c)]) <= 3
        )[:5]


@pytest.mark.parametrize("board", BOARDS, ids=[f"holes{81 - count_filled(b)}" for b in BOARDS])
def test_candidates_and_rendering_agree_with_an_independent_route(board: list[list[int]]) -> None:
    expected = _independent_candidates(board)
    assert candidates(board) == {(r - 1, c - 1): digits for (r, c), digits in expected.items()}
    rows = [" ".join(str(v) if v else "." for v in row) for row in board]
    # TextArena's layout, rebuilt cell by cell: the row label, then cells in boxes of three.
    drawn = [line for line in render_board(board).splitlines() if line.startswith("R")]
    assert [line.replace("|", "").split()[1:] for line in drawn] == [row.split() for row in rows]
    assert parse_board(render_board(board)) == board


def test_candidates_ignore_values_outside_one_to_nine() -> None:
    board = _puzzle(9, 30)
    odd = [row[:] for row in board]
    r, c = next((r, c) for r in range(9) for c in range(9) if odd[r][c])
    odd[r][c] = 12  # a filled cell whose value rules out no digit
    expected = _independent_candidates(odd)
    expected = {k: v - {12} for k, v in expected.items()}
    assert candidates(odd) == {(r - 1, c - 1): digits for (r, c), digits in expected.items()}


def test_summary_total_equals_total_for_many_episodes() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 30)
        reward = SudokuReward(
            empty_cell=[rng.choice([1.0, -1.0]) for _ in range(n)],
            valid_move=[rng.choice([1.0, 0.0, -0.5]) for _ in range(n)],
            repetition=[-float(rng.choice([0, 1, 2, 4, 8, 10])) for _ in range(n)],
            progress=rng.random(),
            correct=rng.choice([0.0, 1.0, rng.random()]),
            format_penalty=rng.choice([0.0, -1.0]),
        )
        assert reward.summary()["total_reward"] == reward.total  # bit for bit


def test_hints_render_the_three_lines() -> None:
    board = BOARDS[0]
    text = sudoku_hints(board, [(1, 1, 5), (1, 1, 5), (2, 2, 3)]).render()
    lines = text.splitlines()
    assert lines[0] == "MOVES REJECTED (do not repeat): [1 1 5], [2 2 3]"
    assert lines[1].startswith("GUARANTEED MOVES (only one option): [")
    assert all(part.count(" ") == 2 for part in lines[1].split(": ", 1)[1].split(", "))
    hints = sudoku_hints(board, [(1, 1, 5), (2, 2, 3)])
    assert hints.render("rejected") == lines[0] and hints.render("none") == ""


def test_moves_off_the_board_are_drawn_as_written_and_not_kept() -> None:
    from envsdk.schedulers.sudoku import _MOVE_TEXT

    known = len(_MOVE_TEXT)
    moves = [(10, 1, 5), (0, 0, 0), (123456789, 2, 3), (1, 1, 5)]
    text = sudoku_hints(BOARDS[0], moves).render()
    assert text.splitlines()[0] == "MOVES REJECTED (do not repeat): [10 1 5], [0 0 0], [123456789 2 3], [1 1 5]"
    # A reply's odd move is drawn when asked: the table of on-board moves does not grow with replies.
    assert len(_MOVE_TEXT) == known == 9 * 9 * 9


def test_other_options_line_formats_cells_and_digits() -> None:
    board = BOARDS[2]  # 55 holes: plenty of 2- and 3-candidate cells
    hints = sudoku_hints(board)
    assert hints.options, "this board should have 2-3 candidate cells among its 10 tightest"
    line = next(l for l in hints.render().splitlines() if l.startswith("Other options: "))
    r, c, digits = hints.options[0]
    assert f"({r},{c})->{','.join(map(str, digits))}" in line
    assert line.count(" | ") == len(hints.options) - 1


def test_no_tried_line_before_any_move() -> None:
    assert "MOVES REJECTED" not in sudoku_hints(BOARDS[0]).render()


def test_move_components_for_each_verdict() -> None:
    board = BOARDS[0]
    empty = next((r + 1, c + 1) for r in range(9) for c in range(9) if board[r][c] == 0)
    filled = next((r + 1, c + 1) for r in range(9) for c in range(9) if board[r][c] != 0)
    assert move_components(board, (*empty, 4), 0, "valid") == {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0}
    assert move_components(board, (*filled, 4), 0, "invalid") == {"empty_cell": -1.0, "valid_move": -0.5, "repetition": 0.0}
    assert move_components(board, (*empty, 4), 0, None)["valid_move"] == 0.0
    assert move_components(board, (10, 1, 4), 0, "invalid")["empty_cell"] == -1.0


@pytest.mark.parametrize("n, penalty", [(1, -2.0), (2, -4.0), (3, -8.0), (4, -10.0), (5, -10.0), (9, -10.0)])
def test_repetition_penalty_doubles_up_to_ten(n: int, penalty: float) -> None:
    assert move_components(BOARDS[0], (1, 1, 1), n, "invalid")["repetition"] == penalty


def test_a_repeated_valid_move_gets_no_valid_credit() -> None:
    board = BOARDS[0]
    empty = next((r + 1, c + 1) for r in range(9) for c in range(9) if board[r][c] == 0)
    assert move_components(board, (*empty, 4), 1, "valid")["valid_move"] == 0.0


def test_total_is_means_plus_progress_plus_correct() -> None:
    reward = SudokuReward(empty_cell=[1, -1, 1], valid_move=[1, -0.5, 1], repetition=[0, 0, -2], progress=0.5, correct=0.0)
    assert reward.total == pytest.approx(1 / 3 + 1.5 / 3 - 2 / 3 + 0.5)
    perfect = SudokuReward(empty_cell=[1.0] * 21, valid_move=[1.0] * 21, repetition=[0.0] * 21, progress=1.0, correct=1.0)
    assert perfect.total == 4.0
    assert SudokuReward(format_penalty=-1.0).total == -1.0


def test_parse_action_normalises_the_move_and_refuses_none() -> None:
    sched = SudokuScheduler()
    assert sched.parse_action("I think row 3, col 4 gets 5") == {"message": "[3 4 5]"}
    assert sched.parse_action("```\n[1 2 3]\n```") == {"message": "[1 2 3]"}
    with pytest.raises(ValueError, match="no move"):
        sched.parse_action("no idea")


def test_format_observation_without_episode_shows_board_and_hints() -> None:
    board = BOARDS[0]
    text = SudokuScheduler(hints="all").format_observation({"board": board})
    assert parse_board(text) == board
    assert "GUARANTEED MOVES" in text
    assert render_board(board) in text
    assert SudokuScheduler().format_observation({"board": board}).endswith(render_board(board))
    with pytest.raises(ValueError, match="'none', 'rejected', 'all'"):
        SudokuScheduler(hints="some")


class _Row(list):  # type: ignore[type-arg]
    """A list subclass: not the plain lists JSON gives."""


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ([[v for v in row] for row in _puzzle(3, 40)], _puzzle(3, 40)),  # plain ints: copied
        ([[True] + [0] * 8] + [[0] * 9] * 8, [[1] + [0] * 8] + [[0] * 9] * 8),  # bools as ints
        ([[None, "", 5.0] + [0] * 6] + [[0] * 9] * 8, [[0, 0, 5] + [0] * 6] + [[0] * 9] * 8),
        ([_Row([2] * 9)] + [[0] * 9] * 8, [[2] * 9] + [[0] * 9] * 8),
        ([[0] * 9] * 8, None),  # 8 rows
        ([[0] * 9] * 8 + [[0] * 8], None),  # a short row
        ([[0] * 9] * 8 + [(0,) * 9], None),  # a tuple row
        ({"r": [0] * 9}, None),
    ],
)
def test_a_board_field_is_read_as_a_fresh_nine_by_nine_of_ints(given: object, read: object) -> None:
    from envsdk.schedulers.sudoku import _structured_board

    board = _structured_board(given)
    assert board == read
    if board is not None:
        assert all(type(row) is list for row in board) and all(type(v) is int for row in board for v in row)
        assert not any(row is given_row for row, given_row in zip(board, given))  # type: ignore[call-overload]


def test_a_board_read_after_the_last_one_is_the_board_read_whole() -> None:
    """Each step's board is read against the last one (only changed rows checked and counted):
    it must give what reading it whole gives, filled count included, with no row of the
    observation's own in it, for changed rows of every kind a server may send."""
    from envsdk.schedulers.sudoku import _next_board, _structured_board

    rng = random.Random(7)
    odd_rows: list[object] = [[None, "", 5.0] + [0] * 6, [True] + [0] * 8, [0] * 8, (0,) * 9, _Row([2] * 9), "row"]
    checked = 0
    for trial in range(400):
        known = _puzzle(trial % 5, rng.randrange(20, 70))
        given: list[object] = [list(row) for row in known]
        for _ in range(rng.randrange(0, 3)):
            r, c = rng.randrange(9), rng.randrange(9)
            row = list(given[r])  # type: ignore[call-overload]
            row[c] = rng.choice([0, 1, 9, 1.0, True, None])
            given[r] = row
        if rng.random() < 0.3:
            given[rng.randrange(9)] = rng.choice(odd_rows)
        whole = _structured_board(given)
        following = _next_board(given, known, count_filled(known))
        if following is None:
            continue  # a row that is not 9 plain ints: read whole instead
        checked += 1
        board, filled = following
        assert board == whole and filled == count_filled(board)
        assert all(type(v) is int for row in board for v in row)
        assert not any(row is given_row for row, given_row in zip(board, given))
    assert checked > 100
    assert _next_board([[0] * 9] * 8, _puzzle(0, 30), 30) is None
    assert _next_board({"r": [0] * 9}, _puzzle(0, 30), 30) is None


@pytest.mark.parametrize(
    "sent",
    [
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5, "correct": 0.0},
        {"empty_cell": 1, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5, "correct": 0.0},  # an int
        {"empty_cell": 1.0, "valid_move": None, "repetition": 0.0, "progress": 0.5, "correct": 0.0},
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5},  # four
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5, "correct": 0.0, "x": 2.0},
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5, "correct": 0.0, "x": "bad"},
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": float("inf"), "correct": 0.0},
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 1e308, "correct": 1e308},
        {"empty_cell": 1.0, "valid_move": 1.0, "repetition": 0.0, "progress": 0.5, "bonus": 0.0},
    ],
)
def test_the_server_parts_are_read_as_the_general_reading_reads_them(sent: dict[str, object]) -> None:
    """The scheduler reads the server's five parts through a check done in C; what it reads, or
    refuses, is what reading them with `components_from` gives."""
    from envsdk.rewards.parts import components_from
    from envsdk.schedulers.sudoku import SUDOKU_COMPONENTS
    from envsdk.types import StepResult

    result = StepResult(observation={}, reward=0.0, done=False, metadata={"reward_components": sent})

    def expected() -> dict[str, float] | None:
        parts = components_from(result.metadata)
        if parts is None or any(parts.get(name) is None for name in SUDOKU_COMPONENTS):
            return None
        return {name: float(parts[name]) for name in SUDOKU_COMPONENTS}  # type: ignore[arg-type]

    try:
        want: object = expected()
    except ValueError:
        with pytest.raises(ValueError):
            SudokuScheduler()._server_parts(result)
        return
    got = SudokuScheduler()._server_parts(result)
    assert got == want
    if got is not None:
        assert list(got) == list(SUDOKU_COMPONENTS) and all(type(v) is float for v in got.values())
