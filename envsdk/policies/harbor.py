"""`HarborOraclePolicy`: plays a Harbor task's own solution through the task's tools, for checking
a Harbor server end to end without a model (every task must score 1.0).

Harbor's oracle runs ``solution/solve.sh`` in the task's machine. Here it goes through the tools a
model has, so the path a model's episode takes is the one checked: the first reply writes every
file of the task's ``solution/`` under ``/solution`` (``write_file``; a file that is not UTF-8 text
through ``bash`` and ``base64``; executable bits kept), runs ``bash /solution/solve.sh`` and calls
``submit``; any later reply calls nothing (the episode is over).
"""

from __future__ import annotations

import base64
import os
import shlex
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from envsdk.policies.base import (
    Message,
    ObservationParseError,
    Policy,
    PolicyError,
    PolicyOutput,
    message_text,
)
from envsdk.policies.scripted import offered_tools, tool_call_reply

__all__ = ["SOLUTION_DIR", "HarborOraclePolicy", "HarborTaskFolder"]

#: Where the oracle puts a task's ``solution/`` in the task's machine (as Harbor's oracle does).
SOLUTION_DIR = "/solution"
#: The tools the oracle calls.
_TOOLS = ("write_file", "bash", "submit")


class HarborTaskFolder(Protocol):
    """What the oracle reads of a task (`servers.harbor.tasks.HarborTask` has it): its name,
    its instruction (what the model is asked) and its ``solution/`` folder (None: it has none)."""

    @property
    def name(self) -> str: ...

    @property
    def instruction(self) -> str: ...

    @property
    def solution_dir(self) -> Path | None: ...


class HarborOraclePolicy(Policy):
    """Solves a Harbor task with its ``solution/solve.sh`` (see the module docstring).

    `tasks`: the tasks the server may play (``servers.harbor.tasks.load_tasks(DIR)``). The
    episode's task is the one whose instruction a user message quotes (the longest such, when
    one instruction holds another). Calls tools natively when given ``tools=``, else writes
    ``<tool_call>`` blocks. Raises `ObservationParseError` when no user message quotes a task's
    instruction, `PolicyError` when the task has no ``solution/solve.sh`` or the env offers
    not the tools it calls.
    """

    supports_tools = True

    def __init__(self, tasks: Iterable[HarborTaskFolder]) -> None:
        self._tasks = [(task.name, task.instruction.strip(), task.solution_dir) for task in tasks]
        if not self._tasks:
            raise ValueError("the Harbor oracle needs the tasks it plays: none given")

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn > 1:  # it submitted in its first reply
            return tool_call_reply([], native=tools is not None)
        offered = offered_tools(messages, tools)
        missing = [name for name in _TOOLS if name not in offered]
        if missing:
            raise PolicyError(
                f"the Harbor oracle calls {', '.join(_TOOLS)}; the env offers no {', '.join(missing)} "
                f"(it offers: {', '.join(sorted(offered)) or 'no tool'})"
            )
        return tool_call_reply(self.calls(messages), native=tools is not None, turn=turn)

    def calls(self, messages: list[Message]) -> list[tuple[str, dict[str, Any]]]:
        """The first reply's tool calls for the task the conversation asks for."""
        name, folder = self.task(messages)
        if folder is None or not (folder / "solve.sh").is_file():
            raise PolicyError(f"task {name}: solution/solve.sh: missing, so the oracle has nothing to run")
        calls: list[tuple[str, dict[str, Any]]] = []
        commands: list[str] = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            target = str(PurePosixPath(SOLUTION_DIR, *path.relative_to(folder).parts))
            data = path.read_bytes()
            try:
                calls.append(("write_file", {"path": target, "content": data.decode("utf-8")}))
            except UnicodeDecodeError:
                quoted = shlex.quote(target)
                commands.append(
                    f"mkdir -p {shlex.quote(str(PurePosixPath(target).parent))} && "
                    f"printf %s {base64.b64encode(data).decode()} | base64 -d > {quoted}"
                )
            if os.access(path, os.X_OK):
                commands.append(f"chmod +x {shlex.quote(target)}")
        commands.append(f"bash {SOLUTION_DIR}/solve.sh")
        return [*calls, ("bash", {"command": "\n".join(commands)}), ("submit", {})]

    def task(self, messages: list[Message]) -> tuple[str, Path | None]:
        """The name and solution folder of the task whose instruction a user message quotes."""
        quoted = "\n".join(message_text(m) for m in messages if m.get("role") == "user")
        found = [(len(instruction), name, folder) for name, instruction, folder in self._tasks
                 if instruction and instruction in quoted]
        if not found:
            raise ObservationParseError(
                f"no user message quotes the instruction of any of the {len(self._tasks)} tasks the oracle knows "
                "(give it the tasks folder the server serves)"
            )
        _, name, folder = max(found, key=lambda item: item[0])
        return name, folder
