"""`CodingScheduler`: a model writes Python, the coding server runs it and scores it with tests.

What the model reads: at reset, the problem (the function's signature and docstring) and how
to answer (a fenced Python block); after each step, the exit code, what the code printed and
the test verdict. What is sent: the last fenced code block of the reply (```` ```python ````
or a bare fence), else the whole reply, as ``{"code": ...}``: OpenEnv's ``CodeAction``.
Success: the problem's tests passed.
"""

from __future__ import annotations

import re
from typing import Any

from envsdk.schedulers.base import Trajectory
from envsdk.schedulers.openenv import OpenEnvScheduler

__all__ = ["CodingScheduler", "extract_code", "render_code_observation", "CODE_INSTRUCTIONS"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)

CODE_INSTRUCTIONS = (
    "Complete the Python function below. Reply with the whole function (and its imports) in one "
    "```python code block. Your code runs in a persistent interpreter; the problem's tests run "
    "once the function is defined."
)
#: Most characters of a stream shown back to the model.
SHOWN_CHARS = 2000


def extract_code(text: str) -> str:
    """The code of a reply: its last fenced block tagged python (or untagged), else its last
    fenced block of any tag, else the whole text."""
    blocks: list[tuple[str, str]] = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    for tag, body in reversed(blocks):
        if tag in ("", "python", "py", "python3"):
            return body
    return blocks[-1][1] if blocks else text


def _tail(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else "…" + text[-SHOWN_CHARS:]


def render_code_observation(obs: dict[str, Any], previous: dict[str, Any] | None = None) -> str:
    """The user message for a coding observation (the reset's problem, or a step's result)."""
    meta = obs.get("metadata") or {}
    if previous is None:
        return f"{CODE_INSTRUCTIONS}\n\n```python\n{meta.get('prompt', '')}```"
    lines = [f"exit code: {obs.get('exit_code', 0)}"]
    if obs.get("stdout"):
        lines.append(f"stdout:\n{_tail(str(obs['stdout']))}")
    if obs.get("stderr"):
        lines.append(f"stderr:\n{_tail(str(obs['stderr']))}")
    tests = meta.get("tests")
    if isinstance(tests, dict):
        lines.append("tests: passed" if tests.get("passed") else f"tests: failed\n{_tail(str(tests.get('output', '')))}")
    else:
        lines.append(f"tests: not run ({meta.get('entry_point', 'the function')} is not defined yet)")
    return "\n".join(lines)


class CodingScheduler(OpenEnvScheduler):
    """Episodes of the coding server (`servers.coding`): see the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 4)
        kwargs.setdefault("formatter", render_code_observation)
        super().__init__(**kwargs)

    def parse_action(self, text: str) -> dict[str, Any]:
        return {"code": extract_code(text)}

    def is_success(self, trajectory: Trajectory) -> bool | None:
        if not trajectory.steps:
            return False
        tests = (trajectory.steps[-1].observation.get("metadata") or {}).get("tests")
        return bool(isinstance(tests, dict) and tests.get("passed"))
