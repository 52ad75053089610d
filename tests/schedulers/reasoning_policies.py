"""Scripted policies that answer the way reasoning models do, for ``envsdk rollout --policy
FILE.py:Class`` (a test copies this file into its temporary folder, as a user writes a policy).

A reasoning model thinks aloud before it answers (``<think>… Could [1 5 4] work? No … So
[1 5 9].</think> [1 5 9]``), and its thinking holds moves and code it then rejects; a model
can also run past its length limit mid-thought. Each policy here knows the right answer (the
Sudoku oracle, HumanEval's canonical solutions) and wraps it so: whatever a scheduler plays
from the thinking instead of the answer is wrong, and shows in the reward.
"""

from __future__ import annotations

from typing import Any

from envsdk.policies import PolicyOutput, SudokuOraclePolicy
from envsdk.policies.coding import CodingOraclePolicy

Message = dict[str, Any]


def _turn(messages: list[Message]) -> int:
    """The 1-based turn being asked for: the assistant replies so far, plus one."""
    return sum(1 for m in messages if m.get("role") == "assistant") + 1


def _rejected_move(messages: list[Message]) -> str:
    """A move a thinking model weighs and rejects: a new digit in the board's first filled cell,
    which the game refuses (an invalid move costs reward)."""
    board = SudokuOraclePolicy.read_board(messages)
    r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c])
    return f"[{r + 1} {c + 1} {board[r][c] % 9 + 1}]"


class ThinkingSudoku:
    """``<think>`` weighing a move it rejects, then the right move after ``</think>``."""

    def __init__(self) -> None:
        self.oracle = SudokuOraclePolicy()

    async def act(self, messages: list[Message]) -> str:
        right = await self.oracle.act(messages)
        wrong = _rejected_move(messages)
        return f"<think>Could {wrong} work? No: that cell is filled. So {right}.</think> {right}"


class CutSudoku:
    """The right move on the first turn; on the second, a completion the length limit cut in the
    middle of its thinking (``finish_reason="length"``), after it named a move."""

    def __init__(self) -> None:
        self.oracle = SudokuOraclePolicy()

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        right = await self.oracle.act(messages)
        if _turn(messages) == 1:
            return PolicyOutput(text=right)
        return PolicyOutput(text=f"<think>Row by row. Could {right} work? Let me check the column fir", finish_reason="length")

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text


class CutAfterMoveSudoku(CutSudoku):
    """`CutSudoku` whose second completion closed its thinking and named the right move before
    the limit cut it (in the words after the move)."""

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        right = await self.oracle.act(messages)
        if _turn(messages) == 1:
            return PolicyOutput(text=right)
        return PolicyOutput(text=f"<think>So {right}.</think> {right} because the column lac", finish_reason="length")


class GiveUpSudoku(CutSudoku):
    """`CutSudoku` whose second reply is whole and names no move: what a cut reply is ranked against."""

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        if _turn(messages) == 1:
            return PolicyOutput(text=await self.oracle.act(messages))
        return PolicyOutput(text="I cannot find a move.")


def _wrong_code(problem_prompt: str) -> str:
    return f"{problem_prompt}    return None\n"


class ThinkingCoder:
    """``<think>`` holding a wrong fenced draft, then the canonical solution in a fenced block."""

    async def act(self, messages: list[Message]) -> str:
        problem = CodingOraclePolicy.problem(messages)
        return (
            f"<think>A first draft:\n```python\n{_wrong_code(problem.prompt)}```\nNo, that returns nothing."
            f"</think>\n```python\n{problem.solution}```"
        )


class ThinkingBareCoder:
    """``<think>`` holding a wrong fenced draft, then the canonical solution written without a
    fence (the code after the thinking is the answer, not the draft in it)."""

    async def act(self, messages: list[Message]) -> str:
        problem = CodingOraclePolicy.problem(messages)
        return f"<think>A first draft:\n```python\n{_wrong_code(problem.prompt)}```\nNo.</think>\n{problem.solution}"


class CutCoder:
    """The canonical solution in a fenced block, then an explanation the length limit cut."""

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        problem = CodingOraclePolicy.problem(messages)
        return PolicyOutput(
            text=f"```python\n{problem.solution}```\nThis works because it walks the input on", finish_reason="length"
        )

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text
