"""Small scripted policies for the scheduler tests (the policy under test is the scheduler)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envsdk.games.sudoku import parse_board


class ScriptedPolicy:
    """Replies with `replies[turn]` (turn = number of assistant messages so far)."""

    def __init__(self, replies: list[str] | Callable[[int, list[dict[str, Any]]], str], delay_s: float = 0.0) -> None:
        self.replies = replies
        self.delay_s = delay_s

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if callable(self.replies):
            return self.replies(turn, messages)
        return self.replies[turn]


@dataclass
class Output:
    text: str
    finish_reason: str | None = None


class LengthCutPolicy:
    """Normal replies, then one reported as cut by length on `cut_on_turn` (1-based)."""

    def __init__(self, cut_on_turn: int) -> None:
        self.cut_on_turn = cut_on_turn

    async def act(self, messages: list[dict[str, Any]]) -> Output:
        turn = sum(1 for m in messages if m["role"] == "assistant") + 1
        return Output("partial rep", "length") if turn == self.cut_on_turn else Output("reply", "stop")


class CountingPolicy:
    """Tracks how many trajectories are inside `act` at once (one call per trajectory turn)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.active = 0
        self.peak = 0

    async def act(self, messages: list[dict[str, Any]]) -> str:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.active -= 1
        return "x"


def last_board(messages: list[dict[str, Any]]) -> list[list[int]]:
    board = parse_board(messages[-1]["content"])
    assert board is not None, "the scheduler's user message must show the board"
    return board


class SolutionScript:
    """Plays a script of move kinds against the board shown in the last user message:
    ``"good"`` (a correct digit in the first empty cell), ``"filled"`` (overwrite the first
    filled cell: invalid), ``"first"`` (repeat the first move played), ``"junk"`` (no move).
    """

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.first: str | None = None

    async def act(self, messages: list[dict[str, Any]]) -> str:
        from envsdk.games.sudoku import solve

        turn = sum(1 for m in messages if m["role"] == "assistant")
        kind = self.kinds[turn] if turn < len(self.kinds) else "good"
        board = last_board(messages)
        if kind == "junk":
            return "I am not sure what to play."
        if kind == "first" and self.first is not None:
            return self.first
        if kind == "filled":
            r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c])
            return f"[{r + 1} {c + 1} {board[r][c]}]"
        solution = solve(board)
        assert solution is not None
        r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c] == 0)
        move = f"Let me place it: [{r + 1} {c + 1} {solution[r][c]}]"
        self.first = self.first or move
        return move


async def play_both_ways(
    scheduler_cls: type[Any], rows: list[Any], policy: Any, status: str, **options: Any
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Play `rows` (one episode) with `scheduler_cls` giving its rollout infos every turn, then
    once at the end (`infos_each_turn` False): the two full records (timings, uuid and step
    durations left out) and each run's turn results."""
    results: list[list[dict[str, Any]]] = []

    class Seen(scheduler_cls):  # type: ignore[misc,valid-type]
        async def on_turn_end(self, trajectory: Any, response_text: str, turn: int) -> Any:
            result = await super().on_turn_end(trajectory, response_text, turn)
            results[-1].append(result)
            return result

    records = []
    for each_turn in (True, False):
        results.append([])
        scheduler = Seen(**options)
        scheduler.infos_each_turn = each_turn
        [traj] = await scheduler.run(rows, policy)
        assert traj.status == status, traj.reason
        record = traj.to_dict("full")
        record.pop("timings"), record.pop("uuid")  # a row without a uuid gets a random one
        for step in record.get("steps", []):
            step.pop("duration_s", None)
        records.append(record)
    return records, results
