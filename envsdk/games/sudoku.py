"""Sudoku logic with no I/O: reading TextArena's board text, candidates, and a solver.

A board is a 9×9 list of lists of ints, 0 for an empty cell; rows and columns are 0-based here
and 1-based on the wire (TextArena's ``[r c n]``).
"""

from __future__ import annotations

import re

__all__ = [
    "Board",
    "parse_board",
    "render_board",
    "candidates",
    "solve",
    "count_filled",
    "MOVE_RE",
    "parse_move",
]

Board = list[list[int]]

_ROW_RE = re.compile(r"^R([1-9])\s+(.*)$")
MOVE_RE = re.compile(r"\[(\d+)\s(\d+)\s(\d+)\]")
_INT_RE = re.compile(r"\d+")


def parse_board(text: str) -> Board | None:
    """The last complete board drawn in TextArena's text (rows ``R1 … R9``), or None."""
    rows: dict[int, list[int]] = {}
    last_complete: Board | None = None
    for line in text.splitlines():
        match = _ROW_RE.match(line.strip())
        if not match:
            continue
        idx = int(match.group(1))
        cells = [0 if tok == "." else int(tok) for tok in re.findall(r"[1-9.]", match.group(2))]
        if len(cells) != 9:
            continue
        if idx == 1:
            rows = {}
        rows[idx] = cells
        if idx == 9 and len(rows) == 9:
            last_complete = [rows[i] for i in range(1, 10)]
    return last_complete


def render_board(board: Board) -> str:
    """TextArena's rendering: a column header, ``R1  4  8  . |  9 …`` rows and separators."""
    lines = ["   C1 C2 C3   C4 C5 C6   C7 C8 C9  "]
    for r in range(9):
        cells = [str(v) if v else "." for v in board[r]]
        groups = ["  ".join(cells[i : i + 3]) for i in (0, 3, 6)]
        lines.append(f"R{r + 1}  " + " |  ".join(groups))
        if r in (2, 5):
            lines.append("   - - - - - - - - - - - - - - - - ")
    return "\n".join(lines)


def candidates(board: Board) -> dict[tuple[int, int], set[int]]:
    """For each empty cell (0-based row, column), the digits its row, column and box allow."""
    result: dict[tuple[int, int], set[int]] = {}
    for r in range(9):
        for c in range(9):
            if board[r][c]:
                continue
            used = set(board[r]) | {board[i][c] for i in range(9)}
            br, bc = 3 * (r // 3), 3 * (c // 3)
            used |= {board[i][j] for i in range(br, br + 3) for j in range(bc, bc + 3)}
            result[(r, c)] = set(range(1, 10)) - used
    return result


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
    return sum(1 for row in board for v in row if v)


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
