"""Harbor's oracle and the do-nothing agent, without a container: what each reply calls, in
both tool forms (native ``tool_calls`` and ``<tool_call>`` text), and what each refuses. The
calls played in real containers are tests/cli/test_harbor_cli.py's."""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from envsdk.policies import (
    HarborOraclePolicy,
    NoopPolicy,
    ObservationParseError,
    PolicyError,
    make_policy,
)
from envsdk.schedulers.tools import TOOLS_SYSTEM_MESSAGE, parse_tool_calls
from envsdk.tools import ToolCall

HARBOR_TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "submit", "parameters": {"type": "object", "properties": {}}}},
]


@dataclass
class Task:
    name: str
    instruction: str
    solution_dir: Path | None


def _text_form(instruction: str, tools: list[dict[str, Any]] = HARBOR_TOOLS) -> list[dict[str, Any]]:
    """A conversation as the tool scheduler starts it for a policy without native tools."""
    listed = TOOLS_SYSTEM_MESSAGE.format(tools="\n".join(json.dumps(t) for t in tools))
    return [{"role": "system", "content": listed}, {"role": "user", "content": instruction}]


def _native(output: Any) -> list[ToolCall]:
    return [ToolCall.from_openai(call) for call in output.tool_calls or []]


@pytest.fixture
def tasks(tmp_path: Path) -> list[Task]:
    solved = tmp_path / "copy" / "solution"
    (solved / "lib").mkdir(parents=True)
    (solved / "solve.sh").write_text("set -e\ncp /solution/lib/data.bin /app/\n")
    (solved / "lib" / "data.bin").write_bytes(bytes(range(256)))
    helper = solved / "lib" / "run me.sh"
    helper.write_text("echo ünïcode\n")
    helper.chmod(0o755)
    return [
        Task("copy", "# Copy the data\n\nPut the data file in /app.\n", solved),
        Task("copy-more", "# Copy the data\n\nPut the data file in /app.\n\nAnd more.\n", None),
        Task("other", "# Something else\n", tmp_path / "missing"),
    ]


async def test_the_oracle_writes_its_solution_runs_solve_sh_and_submits_in_one_reply(tasks: list[Task]) -> None:
    oracle = HarborOraclePolicy(tasks)
    asked = [{"role": "user", "content": "# Copy the data\n\nPut the data file in /app.\n"}]
    native = _native(await oracle.act_ex(asked, tools=HARBOR_TOOLS))
    text = parse_tool_calls(await oracle.act(_text_form(asked[0]["content"])))
    assert [(c.name, c.arguments) for c in native] == [(c.name, c.arguments) for c in text]
    assert len({c.id for c in native}) == len(native)
    names = [c.name for c in native]
    assert names == ["write_file", "write_file", "bash", "submit"]
    written = {c.arguments["path"]: c.arguments["content"] for c in native if c.name == "write_file"}
    assert written == {"/solution/lib/run me.sh": "echo ünïcode\n", "/solution/solve.sh": "set -e\ncp /solution/lib/data.bin /app/\n"}
    command = native[2].arguments["command"].splitlines()
    # The file that is not text goes through base64, byte for byte; the executable keeps its bit.
    encoded = re.fullmatch(r"mkdir -p /solution/lib && printf %s (\S+) \| base64 -d > /solution/lib/data\.bin", command[0])
    assert encoded is not None and base64.b64decode(encoded.group(1)) == bytes(range(256))
    assert command[1:] == [f"chmod +x {shlex.quote('/solution/lib/run me.sh')}", "bash /solution/solve.sh"]
    # Once it has submitted, it calls nothing: the episode is over.
    later = [*asked, {"role": "assistant", "content": ""}, {"role": "tool", "content": "[episode over]"}]
    assert (await oracle.act_ex(later, tools=HARBOR_TOOLS)).tool_calls is None
    assert await oracle.act(later) == ""


async def test_the_oracle_picks_the_longest_instruction_quoted_and_says_what_it_cannot_do(tasks: list[Task]) -> None:
    oracle = HarborOraclePolicy(tasks)
    with pytest.raises(PolicyError, match="task copy-more: solution/solve.sh: missing"):
        await oracle.act(_text_form(tasks[1].instruction))
    with pytest.raises(PolicyError, match="task other: solution/solve.sh: missing"):
        await oracle.act(_text_form(tasks[2].instruction))
    with pytest.raises(ObservationParseError, match="no user message quotes the instruction of any of the 3 tasks"):
        await oracle.act(_text_form("# A task it was not given\n"))
    with pytest.raises(PolicyError, match="offers no submit"):
        await oracle.act(_text_form(tasks[0].instruction, HARBOR_TOOLS[:3]))
    with pytest.raises(ValueError, match="needs the tasks"):
        HarborOraclePolicy([])


async def test_the_do_nothing_agent_submits_at_once_where_it_can_and_else_replies_nothing() -> None:
    noop = make_policy("noop", "harbor")
    assert isinstance(noop, NoopPolicy)
    asked = [{"role": "user", "content": "# Any task\n"}]
    native = _native(await noop.act_ex(asked, tools=HARBOR_TOOLS))
    assert [(c.name, c.arguments) for c in native] == [("submit", {})]
    assert [(c.name, c.arguments) for c in parse_tool_calls(await noop.act(_text_form("# Any task\n")))] == [("submit", {})]
    # After that, and where no argument-free submit is offered (Sudoku, a tool env without one): nothing.
    later = [*asked, {"role": "assistant", "content": ""}, {"role": "tool", "content": "[episode over]"}]
    assert (await noop.act_ex(later, tools=HARBOR_TOOLS)).tool_calls is None
    assert await noop.act([{"role": "user", "content": "R1  . 8 . | ..."}]) == ""
    needs_answer = [{"type": "function", "function": {"name": "submit", "parameters": {"required": ["answer"]}}}]
    assert (await noop.act_ex(asked, tools=needs_answer)).tool_calls is None


def test_make_policy_plays_the_harbor_oracle_only_with_its_tasks(tasks: list[Task]) -> None:
    assert isinstance(make_policy("oracle", "HarborEnvironment", tasks=tasks), HarborOraclePolicy)
    assert isinstance(make_policy("auto", "harbor", tasks=tasks), HarborOraclePolicy)
    assert type(make_policy("auto", "harbor")).__name__ == "RandomPolicy"
    with pytest.raises(ValueError, match="give it the tasks"):
        make_policy("oracle", "harbor")
