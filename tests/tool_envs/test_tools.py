"""Declaring tools with `envsdk.tools.tool`, and the results envsdk sends for them: the same
MCP results FastMCP itself produces for the same functions."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import httpx
import pytest
from fastmcp import FastMCP
from pydantic import BaseModel

from envsdk.server import create_app
from envsdk.server.mcp import _result_payload
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from envsdk.tools import is_tool_env, tool, tool_methods
from examples.ledger_tools import LedgerEnvironment

from .envs import TallyMCPEnvironment


class Point(BaseModel):
    x: int
    y: int


def text(word: str) -> str:
    """A string."""
    return word.upper()


def number(n: int) -> int:
    """An int."""
    return n * 2


def ratio(n: int) -> float:
    """A float."""
    return n / 4


def flag(n: int) -> bool:
    """A bool."""
    return n > 1


def mapping(n: int) -> dict[str, int]:
    """A dict."""
    return {"n": n}


def items(n: int) -> list[int]:
    """A list."""
    return list(range(n))


def nothing(n: int) -> None:
    """Nothing."""


def point(n: int) -> Point:
    """A model."""
    return Point(x=n, y=-n)


FUNCTIONS = [text, number, ratio, flag, mapping, items, nothing, point]


def _method(fn: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    sig = inspect.signature(fn, eval_str=True)
    method.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *sig.parameters.values()]
    )
    method.__annotations__ = {p.name: p.annotation for p in sig.parameters.values()} | {"return": sig.return_annotation}
    return tool(method)


ShapesEnvironment = type("ShapesEnvironment", (EchoEnvironment,), {fn.__name__: _method(fn) for fn in FUNCTIONS})


def test_tool_refuses_reserved_names_and_an_override_without_the_mark_is_no_tool() -> None:
    with pytest.raises(ValueError, match="reserved"):

        @tool
        def step(self: Any) -> None: ...

    class Quieter(LedgerEnvironment):
        def withdraw(self, amount: int) -> int:  # no longer a tool
            return 0

    assert list(tool_methods(LedgerEnvironment)) == ["deposit", "withdraw", "balance"]
    assert list(tool_methods(Quieter)) == ["deposit", "balance"]
    assert is_tool_env(LedgerEnvironment) and is_tool_env(TallyMCPEnvironment) and is_tool_env(LedgerEnvironment())
    assert not is_tool_env(EchoEnvironment)


def test_native_tool_results_are_what_fastmcp_gives_for_the_same_functions() -> None:
    reference = FastMCP("reference")
    for fn in FUNCTIONS:
        reference.tool(fn)
    app = create_app(ShapesEnvironment, EchoAction, EchoObservation)
    with running_server(app) as url:
        handle = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "openenv/session/create"}).json()["result"]["session_id"]
        listed = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {"session_id": handle}}).json()
        ours_tools = {t["name"]: t for t in listed["result"]["tools"]}
        theirs_tools = {t.name: t.to_mcp_tool().model_dump(mode="json") for t in asyncio.run(reference.list_tools())}
        for name in theirs_tools:
            assert ours_tools[name]["inputSchema"] == theirs_tools[name]["inputSchema"], name
            assert ours_tools[name]["outputSchema"] == theirs_tools[name]["outputSchema"], name
        for fn in FUNCTIONS:
            args = {"word": "hi"} if fn is text else {"n": 3}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": fn.__name__, "arguments": args, "session_id": handle}}
            ours = httpx.post(f"{url}/mcp", json=body, timeout=10).json()["result"]
            theirs = _result_payload(asyncio.run(reference.call_tool(fn.__name__, args)))
            assert ours == theirs, fn.__name__
        httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "openenv/session/close", "params": {"session_id": handle}})


def test_json_rpc_error_codes_are_mcps() -> None:
    from mcp import types

    from envsdk.server import mcp as server_mcp

    assert (server_mcp.PARSE_ERROR, server_mcp.INVALID_REQUEST, server_mcp.METHOD_NOT_FOUND, server_mcp.INVALID_PARAMS,
            server_mcp.INTERNAL_ERROR) == (types.PARSE_ERROR, types.INVALID_REQUEST, types.METHOD_NOT_FOUND,
                                           types.INVALID_PARAMS, types.INTERNAL_ERROR)
