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

A model sees the tools in OpenAI's shape (`ToolSpec.openai`: ``{"type": "function",
"function": {"name", "description", "parameters"}}``), the form chat templates' ``tools=`` and
OpenAI-compatible servers take. Its calls come back as `ToolCall`s. `chat_template_messages`
readies OpenAI-form messages for a Hugging Face chat template (arguments as objects, not text).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "RESERVED_TOOL_NAMES", "ToolSpec", "ToolCall", "tool", "tool_methods", "is_tool_env", "chat_template_messages",
]

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

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI tool definition, what ``tools=`` of a chat completion request
        and of ``apply_chat_template`` take."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a model's reply: the tool's name and its arguments; ``id`` is the
    call's id in OpenAI's form (a native call; its result names it), None for a call written in
    the reply's text. ``error`` says why the call could not be read (arguments that are not a
    JSON object): such a call is answered with the error and never run."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    error: str | None = None

    @classmethod
    def from_openai(cls, call: Any) -> ToolCall:
        """From one entry of an assistant message's ``tool_calls`` (``{"id", "type":
        "function", "function": {"name", "arguments": "<JSON text>"}}``; arguments already
        an object are taken as they are)."""
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            given = json.dumps(call, default=str)[:200]
            return cls(name="", id=_call_id(call), error=f"not a function call with a name: {given}")
        name, arguments = function["name"], function.get("arguments")
        if arguments is None or arguments == "":
            return cls(name=name, id=_call_id(call))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                return cls(name=name, id=_call_id(call), error=f"arguments are not JSON ({exc}): {arguments[:200]}")
        if not isinstance(arguments, dict):
            return cls(name=name, id=_call_id(call), error=f"arguments must be a JSON object, got {type(arguments).__name__}")
        return cls(name=name, arguments=arguments, id=_call_id(call))


def _call_id(call: Any) -> str | None:
    found = call.get("id") if isinstance(call, dict) else None
    return found if isinstance(found, str) else None


def chat_template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as a Hugging Face chat template expects them: each assistant tool call's
    ``arguments`` an object rather than OpenAI's JSON text. Templates that write the arguments
    with ``tojson`` (Qwen2.5's) would otherwise print them as one quoted string, which is not
    what the model wrote. Arguments that are not a JSON object are left as text; the messages
    given are not changed."""
    ready: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            ready.append(message)
            continue
        converted = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    parsed = json.loads(function["arguments"] or "{}")
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    call = {**call, "function": {**function, "arguments": parsed}}
            converted.append(call)
        ready.append({**message, "tool_calls": converted})
    return ready


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
