"""The offline TextArena games the TextArena server tests play, with well-formed moves for each.

A player draws its moves from the game's list with a seeded ``random.Random``; the lists use
each game's own action format (read from its prompt), so many moves are legal and episodes end
by the game's rules, its turn limit or its invalid-move rule.
"""

from __future__ import annotations

import random

#: Every game that resets and steps offline with textarena 0.7.4 (the multi-player ones with
#: the player count they need), and the moves a random player draws from.
OFFLINE_GAMES: dict[str, tuple[int, list[str]]] = {
    "2048-v0": (1, ["[Up]", "[Down]", "[Left]", "[Right]"]),
    "Bandit-v0": (1, ["[red]", "[blue]", "[green]", "[yellow]", "[purple]"]),
    "Blackjack-v0": (1, ["[Hit]", "[Stand]"]),
    "Countdown-v0": (1, [f"[{i} {j} {op}]" for i in range(3) for j in range(3) if i != j for op in "+-*"]),
    "Crosswords-v0": (1, [f"[{r} {c} {ch}]" for r in range(3) for c in range(3) for ch in "AEST"]),
    "Cryptarithm-v0": (1, [f"[{ch} {d}]" for ch in "SENDMORY" for d in range(10)]),
    "FifteenPuzzle-v0": (1, ["[up]", "[down]", "[left]", "[right]"]),
    "FrozenLake-v0": (1, ["[up]", "[down]", "[left]", "[right]"]),
    "GuessTheNumber-v0": (1, [f"[{n}]" for n in range(1, 21)]),
    "LightsOut-v0": (1, [f"[{r} {c}]" for r in range(5) for c in range(5)]),
    "LogicPuzzle-v0": (1, ["[park Alice X]", "[park Alice O]", "[0 0 X]", "[1 1 O]"]),
    "MarketEntryGame-v0": (4, ["[E]", "[S]"]),
    "Mastermind-v0": (1, ["[1 2 3 4]", "[2 1 4 5]", "[3 4 5 6]", "[6 5 4 3]"]),
    "Minesweeper-v0": (1, [f"[{r} {c}]" for r in range(8) for c in range(8)]),
    "PegJump-v0": (1, [f"[{a} {b}]" for a in range(1, 16) for b in range(1, 16) if a != b]),
    "PublicGoodsGame-v0": (3, ["[0]", "[5]", "[10]", "[20]"]),
    "QuantumTicTacToe-v0": (1, [f"[{a},{b}]" for a in range(9) for b in range(9) if a != b]),
    "RushHour-v0": (1, [f"[{car}{d}]" for car in "XABCDE" for d in "+-"]),
    "Secretary-v0": (1, ["[accept]", "[continue]", "[continue]"]),
    "Set-v0": (1, [f"[{a}, {b}, {c}]" for a in range(12) for b in range(a + 1, 12) for c in range(b + 1, 12)]),
    "Slitherlink-v0": (1, [f"[{k} {r} {c}]" for k in "hv" for r in range(5) for c in range(5)]),
    "Sokoban-v0": (1, ["[w]", "[a]", "[s]", "[d]"]),
    "SpiteAndMalice-v0": (1, ["[draw]", "[discard A♠ 0]", "[play A♠ 0]"]),
    "Sudoku-v0": (1, [f"[{r} {c} {n}]" for r in range(1, 10) for c in range(1, 10) for n in range(1, 10)]),
    "ThreeCardMonte-v0": (1, ["[0]", "[1]", "[2]"]),
    "TowerOfHanoi-v0": (1, [f"[{a} {b}]" for a in "ABC" for b in "ABC" if a != b]),
}

#: Every episode of the games above ends within this many steps with these players.
MAX_STEPS = 600


def random_moves(env_id: str, seed: int) -> list[str]:
    """The moves a random player plays in `env_id`, in order (more than any episode needs)."""
    rng = random.Random(seed)
    moves = OFFLINE_GAMES[env_id][1]
    return [rng.choice(moves) for _ in range(MAX_STEPS)]
