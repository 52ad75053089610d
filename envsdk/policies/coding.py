"""`CodingOraclePolicy`: answers a HumanEval problem with its canonical solution (or, with
``wrong=True``, with a body that fails every problem's tests), for checking the coding server
end to end without a model."""

from __future__ import annotations

from envsdk.games.humaneval import Problem, humaneval
from envsdk.policies.base import Message, ObservationParseError, Policy, message_text

__all__ = ["CodingOraclePolicy", "CodingWrongPolicy"]


class CodingOraclePolicy(Policy):
    """Finds the problem whose prompt the user messages quote (newest first) and replies with
    its canonical solution in a fenced block. Raises `ObservationParseError` when no message
    quotes a HumanEval prompt."""

    def __init__(self, wrong: bool = False) -> None:
        self.wrong = wrong

    async def act(self, messages: list[Message]) -> str:
        problem = self.problem(messages)
        if self.wrong:
            code = f"{problem.prompt}    raise NotImplementedError('deliberately wrong')\n"
        else:
            code = problem.solution
        return f"```python\n{code}```"

    @staticmethod
    def problem(messages: list[Message]) -> Problem:
        for message in reversed(messages):
            if message.get("role") != "user":
                continue
            text = message_text(message)
            for problem in humaneval():
                if problem.prompt.strip() in text:
                    return problem
        raise ObservationParseError("no user message quotes a HumanEval problem's prompt")


class CodingWrongPolicy(CodingOraclePolicy):
    """`CodingOraclePolicy` with ``wrong=True``, made with no arguments (for ``--policy
    envsdk.policies.coding:CodingWrongPolicy``): every reply fails its problem's tests."""

    def __init__(self) -> None:
        super().__init__(wrong=True)
