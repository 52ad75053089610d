"""A small OpenAI-compatible chat server for the tests, answering with native tool calls.

``POST /v1/chat/completions`` answers each request with the reply a scripted strategy chooses
from what the request holds, as a tool-calling model behind vLLM or OpenAI would: the ``tools``
it was sent and the conversation so far, ``tool`` turns included. ``GET /v1/models`` lists
its one model. Requests are checked where OpenAI's API refuses them (HTTP 400 with OpenAI's
error body): ``tools`` must be function definitions, every ``tool_call_id`` an assistant
message asks for must be answered by a ``tool`` message before any other message, and a
``tool`` message must answer such an id. Every request body is kept (`ToolChatServer.requests`).

`ledger_strategy` plays examples/ledger_tools.py: its first reply makes two calls (the second
only valid after the first), the next one reads the balance off the last tool turn.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["ToolChatServer", "Strategy", "ledger_strategy", "ledger_plan", "MODEL"]

MODEL = "scripted-tool-caller"

#: A strategy: (tools sent, messages so far) -> the assistant message to answer with, in
#: OpenAI's form (``content`` and, for calls, ``tool_calls`` with ``arguments`` as objects;
#: the server writes them as JSON text and gives each call its id).
Strategy = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]

_LEDGER = re.compile(r"The ledger holds (\d+)\. Bring it to exactly (\d+)")


def ledger_plan(start: int, target: int) -> list[tuple[str, dict[str, Any]]]:
    """The calls of the ledger strategy's first reply for a ledger at `start` with `target`."""
    gap = target - start
    if gap > 0:  # over the target, then back: the withdrawal is valid only once the deposit is in
        return [("deposit", {"amount": gap + 5}), ("withdraw", {"amount": 5})]
    if gap < 0:
        return [("withdraw", {"amount": -gap}), ("balance", {})]
    return [("balance", {})]


def ledger_strategy(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Balance the ledger with the tools it was sent: the plan's calls first, then a closing
    remark read off the last tool turn. Without the ledger's tools it says so in text."""
    names = {t["function"]["name"] for t in tools}
    if not {"deposit", "withdraw", "balance"} <= names:
        return {"role": "assistant", "content": "I was given no ledger tools to call."}
    found = next((_LEDGER.search(str(m.get("content"))) for m in messages if m.get("role") == "user"), None)
    if found is None:
        return {"role": "assistant", "content": "I cannot find the ledger's balance and target."}
    start, target = int(found.group(1)), int(found.group(2))
    if not any(m.get("role") == "assistant" for m in messages):
        calls = [{"name": name, "arguments": arguments} for name, arguments in ledger_plan(start, target)]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    last = next(m for m in reversed(messages) if m.get("role") == "tool")
    if last["content"] == str(target):
        return {"role": "assistant", "content": f"The ledger is balanced at {target}."}
    return {"role": "assistant", "content": f"The ledger reads {last['content']}, not {target}."}


class ToolChatServer:
    """The ASGI app (`app`) of an OpenAI-compatible chat server answering through `strategy`."""

    def __init__(self, strategy: Strategy = ledger_strategy) -> None:
        self.strategy = strategy
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "tests"}]})

    async def _complete(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _invalid("the body is not JSON", None)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _invalid("'messages' is a required property", "messages")
        with self._lock:
            self.requests.append(body)
        tools = body.get("tools") or []
        refused = _check_tools(tools) or _check_tool_turns(body["messages"])
        if refused is not None:
            return _invalid(*refused)
        reply = dict(self.strategy(tools, body["messages"]))
        finish = "stop"
        if reply.get("tool_calls"):
            reply["tool_calls"] = [
                {"id": f"call_{next(self._ids)}", "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
                for call in reply["tool_calls"]
            ]
            finish = "tool_calls"
        return JSONResponse({
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": 0, "model": body.get("model"),
            "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


def _invalid(message: str, param: str | None) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return JSONResponse({"error": error}, status_code=400)


def _check_tools(tools: Any) -> tuple[str, str] | None:
    if not isinstance(tools, list):
        return "'tools' must be an array", "tools"
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tools[{index}] is not a function definition", f"tools[{index}]"
        if not isinstance(function.get("parameters", {}), dict):
            return f"tools[{index}].function.parameters must be an object", f"tools[{index}].function.parameters"
    return None


def _check_tool_turns(messages: list[Any]) -> tuple[str, str] | None:
    """OpenAI's rule for tool turns: each call id answered by a ``tool`` message right after
    its assistant message, and no ``tool`` message that answers nothing."""
    waiting: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            if message.get("tool_call_id") not in waiting:
                said = f"messages[{index}]: messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
                return said, f"messages.[{index}].role"
            waiting.remove(message["tool_call_id"])
            continue
        if waiting:
            said = (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(waiting)}"
            )
            return said, f"messages.[{index}].role"
        if role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                arguments = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
                if not isinstance(arguments, str):
                    return f"messages[{index}]: a tool call's arguments must be a JSON string", f"messages.[{index}]"
                waiting.append(call.get("id"))
    return None
