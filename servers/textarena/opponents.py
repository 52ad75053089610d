"""Built-in opponents for two-player TextArena games, so one agent can train against the server.

An opponent reads the game's board (never the transcript) and answers a move in the game's
own action format. ``"random"`` plays a uniformly random legal move; ``"scripted"`` wins when it
can, else blocks the agent's winning move, else takes the most central legal move (lowest index
on ties): weak, deterministic, and a baseline a learning agent should beat. Both draw only from
the ``random.Random`` they are given (seeded from the episode's seed by the server).

Games with opponents: `OPPONENT_GAMES` (TicTacToe and ConnectFour, every variant).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from textarena.envs.ConnectFour.env import ConnectFourEnv
from textarena.envs.TicTacToe.env import TicTacToeEnv

from servers.textarena.errors import TextArenaOptionError

__all__ = ["OPPONENT_GAMES", "Opponent", "make_opponent"]

_LINES_3X3: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6),
)


class Opponent(Protocol):
    """Chooses the move of `player_id` in `game` (the unwrapped TextArena game)."""

    def move(self, game: Any, player_id: int, rng: random.Random) -> str: ...


class _TicTacToe:
    """TicTacToe: cells 0-8, player 1 is X, player 0 is O; the move is ``[cell]``."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy

    def move(self, game: Any, player_id: int, rng: random.Random) -> str:
        board = [cell for row in game.state.game_state["board"] for cell in row]
        free = [i for i, cell in enumerate(board) if cell == ""]
        mine, theirs = ("X", "O") if player_id == 1 else ("O", "X")
        if self.strategy == "random":
            return f"[{rng.choice(free)}]"
        for symbol in (mine, theirs):  # win, else block
            for line in _LINES_3X3:
                values = [board[i] for i in line]
                if values.count(symbol) == 2 and values.count("") == 1:
                    return f"[{line[values.index('')]}]"
        preference = (4, 0, 2, 6, 8, 1, 3, 5, 7)
        return f"[{next(cell for cell in preference if cell in free)}]"


class _ConnectFour:
    """ConnectFour: columns 0..n-1, player 0 is X, player 1 is O; the move is ``[col c]``."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy

    def move(self, game: Any, player_id: int, rng: random.Random) -> str:
        board = game.state.game_state["board"]
        columns = len(board[0])
        free = [c for c in range(columns) if board[0][c] == "."]
        if self.strategy == "random":
            return f"[col {rng.choice(free)}]"
        mine, theirs = ("X", "O") if player_id == 0 else ("O", "X")
        for symbol in (mine, theirs):  # win, else block
            for column in free:
                if _connects_four(board, column, symbol):
                    return f"[col {column}]"
        centre = (columns - 1) / 2
        return f"[col {min(free, key=lambda c: (abs(c - centre), c))}]"


def _connects_four(board: list[list[str]], column: int, symbol: str) -> bool:
    rows, columns = len(board), len(board[0])
    row = max(r for r in range(rows) if board[r][column] == ".")
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < rows and 0 <= c < columns and board[r][c] == symbol:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


#: Game classes with a built-in opponent, and the opponent's constructor (given the strategy).
OPPONENT_GAMES: dict[type, Callable[[str], Opponent]] = {
    TicTacToeEnv: _TicTacToe,
    ConnectFourEnv: _ConnectFour,
}


def make_opponent(name: str, game: Any, env_id: str) -> Opponent:
    """The `name` ("random" or "scripted") opponent for the unwrapped `game`; raises
    ``TextArenaOptionError`` for a game without one."""
    factory = OPPONENT_GAMES.get(type(game))
    if factory is None:
        supported = ", ".join(sorted(k.__name__.removesuffix("Env") for k in OPPONENT_GAMES))
        raise TextArenaOptionError(
            f"{env_id} has no built-in opponent (games with one: {supported}); play every "
            "player from the session instead (self-play: omit `opponent`)"
        )
    return factory(name)
