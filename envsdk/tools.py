"""Tool environments: an `Environment` whose methods marked with `tool` are tools, served over MCP.

A tool is a method with annotated parameters and a docstring; its JSON schema comes from
the annotations, its description from the docstring. The server lists and calls tools
through MCP (``POST /mcp``, ``WS /mcp``, ``{"type": "mcp"}`` on ``/ws``, and the step actions
``{"type": "list_tools"}`` / ``{"type": "call_tool", "tool_name": …, "arguments": {…}}``),
as it does for an OpenEnv ``MCPEnvironment``. A tool call is an env call: it runs where the
env's other calls run (a plain method on the session's thread, an ``async def`` on the event
loop), under the tool deadline (a ``tool_timeout_s`` class attribute, else the step's), and
counts in ``/metrics``. Every route calls the tool method itself, step actions included (the
env's ``step`` takes its own action type, not a tool call): such a reply carries no reward and
does not end the episode; the env scores through its own ``step`` or its state's ``reward``.

::

    class Ledger(Environment[Action, Observation, State]):
        @tool
        def deposit(self, amount: int) -> int:
            \"\"\"Add `amount` to the balance; return the new balance.\"\"\"
            ...

The names ``reset``, ``step``, ``state`` and ``close`` are reserved (as in OpenEnv).
This module needs no MCP library; the server builds the MCP side (`envsdk.server.mcp`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["RESERVED_TOOL_NAMES", "ToolSpec", "tool", "tool_methods", "is_tool_env"]

RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
"""Names no tool may take: they are the environment's own calls."""

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__envsdk_tool__"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as a server lists it: its name, description and JSON schema of its arguments."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, payload: dict[str, Any]) -> ToolSpec:
        """From a ``tools/list`` entry (MCP's ``inputSchema`` or OpenEnv's ``input_schema``)."""
        schema = payload.get("inputSchema", payload.get("input_schema")) or {}
        return cls(name=str(payload["name"]), description=str(payload.get("description") or ""), input_schema=dict(schema))


def tool(fn: F) -> F:
    """Mark an environment method as a tool. Its name is the tool's name (not a reserved one)."""
    if not callable(fn):
        raise TypeError(f"@tool marks methods; got {type(fn).__name__}")
    if fn.__name__ in RESERVED_TOOL_NAMES:
        raise ValueError(
            f"Tool name {fn.__name__!r} is reserved: {sorted(RESERVED_TOOL_NAMES)} are the environment's own calls"
        )
    setattr(fn, _MARK, True)
    return fn


def tool_methods(env_class: type) -> dict[str, Callable[..., Any]]:
    """The tools `env_class` declares with `tool`, by name, in definition order (base classes first)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(env_class.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, _MARK, False):
                found[name] = value
            elif name in found:  # overridden without the mark: no longer a tool
                del found[name]
    return found


def is_tool_env(env: Any) -> bool:
    """Whether `env` (an instance or a class) has tools: envsdk `tool` methods, or an OpenEnv
    ``MCPEnvironment`` (its FastMCP server in ``mcp_server``)."""
    env_class = env if isinstance(env, type) else type(env)
    if tool_methods(env_class):
        return True
    return any(klass.__name__ == "MCPEnvironment" for klass in env_class.__mro__) or (
        not isinstance(env, type) and getattr(env, "mcp_server", None) is not None
    )


def tool_signature(method: Callable[..., Any]) -> inspect.Signature:
    """The signature of a bound tool method, annotations resolved (a string annotation from
    ``from __future__ import annotations`` becomes the type it names)."""
    return inspect.signature(method, eval_str=True)
