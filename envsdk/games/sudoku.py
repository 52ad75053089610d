"""Sudoku logic with no I/O: reading TextArena's board text, candidates, and a solver.

A board is a 9×9 list of lists of ints, 0 for an empty cell; rows and columns are 0-based here
and 1-based on the wire (TextArena's ``[r c n]``).
"""

from __future__ import annotations

import re
from itertools import chain

__all__ = [
    "Board",
    "parse_board",
    "render_board",
    "candidates",
    "empty_cells",
    "digits_of",
    "solve",
    "count_filled",
    "MOVE_RE",
    "parse_move",
]

Board = list[list[int]]

# A board row: ``R`` and its number, white space, then exactly nine cells (a digit or ``.``) among
# any other characters; one match reads the whole row. One ``\s``, not ``\s+``: the gaps already
# take further spaces, and two ways to split a run of spaces make a failing line quadratic.
_ROW_RE = re.compile(r"R([1-9])\s" + r"[^1-9.]*([1-9.])" * 9 + r"[^1-9.]*")
MOVE_RE = re.compile(r"\[(\d+)\s(\d+)\s(\d+)\]")
_INT_RE = re.compile(r"\d+")
_cell_value = {".": 0, **{str(d): d for d in range(1, 10)}}.__getitem__
_ALL_DIGITS = sum(1 << d for d in range(1, 10))  # bits 1-9
#: A digit's bit in the masks of `empty_cells` (no entry: not a digit 1-9).
_digit_bit = {d: 1 << d for d in range(1, 10)}.get
#: Each row's cells' box numbers.
_BOX_OF = tuple(tuple(3 * (r // 3) + c // 3 for c in range(9)) for r in range(9))
_DIGITS_OF = tuple(tuple(d for d in range(1, 10) if mask >> d & 1) for mask in range(1 << 10))
_HEADER = "   C1 C2 C3   C4 C5 C6   C7 C8 C9  "
_ROW_FORMAT = "R{}  {}  {}  {} |  {}  {}  {} |  {}  {}  {}"
_SEPARATOR = "   - - - - - - - - - - - - - - - - "


class _CellText(dict[object, str]):
    """A cell's text: ``.`` for 0, the digit for 1-9, and ``str(value)`` for anything else
    (made when asked, not kept)."""

    def __missing__(self, value: object) -> str:
        return str(value)


_cell_text = _CellText({0: ".", **{d: str(d) for d in range(1, 10)}}).__getitem__
# The whole board as one format string (81 cells), filled in one call.
_BOARD_FORMAT = "\n".join(
    [_HEADER]
    + [
        line
        for r in range(9)
        for line in ([_ROW_FORMAT.format(r + 1, *["{}"] * 9)] + ([_SEPARATOR] if r in (2, 5) else []))
    ]
)


def parse_board(text: str) -> Board | None:
    """The last complete board drawn in TextArena's text (rows ``R1 … R9``), or None."""
    rows: dict[int, list[int]] = {}
    last_complete: Board | None = None
    for line in text.splitlines():
        if "R" not in line:  # most lines of a message: skipped before the row pattern is tried
            continue
        match = _ROW_RE.fullmatch(line.strip())
        if not match:
            continue
        groups = match.groups()
        idx = int(groups[0])
        if idx == 1:
            rows = {}
        rows[idx] = list(map(_cell_value, groups[1:]))
        if idx == 9 and len(rows) == 9:
            last_complete = [rows[i] for i in range(1, 10)]
    return last_complete


def render_board(board: Board) -> str:
    """TextArena's rendering: a column header, ``R1  4  8  . |  9 …`` rows and separators."""
    return _BOARD_FORMAT.format(*map(_cell_text, chain.from_iterable(board)))


def empty_cells(board: Board) -> list[tuple[int, int, int]]:
    """Each empty cell as ``(row, column, allowed)``, 0-based, in row-major order, where bit
    ``d`` of ``allowed`` is set when its row, column and box allow the digit ``d`` (1-9).

    The digits each row, column and box holds are gathered once per board, as bit masks: this
    runs for every hint and every oracle move, and sets per cell cost twice as much. A digit's
    bit comes from a table, so a cell costs one lookup before anything is compared."""
    rows: list[int] = []
    columns = [0] * 9
    boxes = [0] * 9
    empty: list[tuple[int, int, int]] = []
    for r, row in enumerate(board):
        row_mask = 0
        box_of = _BOX_OF[r]
        c = 0
        for value in row:
            bit = _digit_bit(value)
            if bit:
                row_mask |= bit
                columns[c] |= bit
                boxes[box_of[c]] |= bit
            elif not value:
                empty.append((r, c, box_of[c]))
            # any other value fills its cell and rules out no digit
            c += 1
        rows.append(row_mask)
    return [(r, c, _ALL_DIGITS & ~(rows[r] | columns[c] | boxes[b])) for r, c, b in empty]


def digits_of(allowed: int) -> tuple[int, ...]:
    """The digits (ascending) whose bits are set in an `empty_cells` mask."""
    return _DIGITS_OF[allowed]


def candidates(board: Board) -> dict[tuple[int, int], set[int]]:
    """For each empty cell (0-based row, column), the digits its row, column and box allow."""
    return {(r, c): set(_DIGITS_OF[allowed]) for r, c, allowed in empty_cells(board)}


def solve(board: Board) -> Board | None:
    """A solution of `board` (fewest-candidates-first backtracking), or None if none exists."""
    grid = [row[:] for row in board]

    def search() -> bool:
        cands = candidates(grid)
        if not cands:
            return True
        (r, c), options = min(cands.items(), key=lambda item: len(item[1]))
        for digit in sorted(options):
            grid[r][c] = digit
            if search():
                return True
        grid[r][c] = 0
        return False

    return grid if search() else None


def count_filled(board: Board) -> int:
    # Cells hold ints, so a cell is filled exactly when it is not 0: counted in C, row by row.
    return sum(len(row) - row.count(0) for row in board)


def parse_move(text: str) -> tuple[int, int, int] | None:
    """The move ``[r c n]`` in a reply (1-based), falling back to its first three integers."""
    match = MOVE_RE.search(text)
    if match:
        r, c, n = (int(g) for g in match.groups())
        return r, c, n
    ints = _INT_RE.findall(text)
    if len(ints) >= 3:
        r, c, n = (int(x) for x in ints[:3])
        return r, c, n
    return None
