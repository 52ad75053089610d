"""What the documentation's blocks run against: the README reader's folder and servers (the CLI
tests' fixtures), a scripted OpenAI-compatible endpoint, and the one substitution a block may
need to run here (a port or a model named in the text, replaced by what the test started)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from envsdk.testing import running_server
from tests.cli.conftest import ENVSDK, folder, serve, user_env

__all__ = ["folder", "on_path", "openai_endpoint", "run_shell", "serve", "substitute"]


def substitute(text: str, replacements: dict[str, str]) -> str:
    """`text` with each key replaced by its value; every key must occur (a page that stopped
    saying it would otherwise be run unchanged and prove nothing about the new text)."""
    for old, new in replacements.items():
        assert old in text, f"{old!r} is no longer in the documented block:\n{text}"
        text = text.replace(old, new)
    return text


def on_path() -> dict[str, str]:
    """A user's environment with the installed ``envsdk`` (and its interpreter) on PATH."""
    return {**user_env(), "PATH": f"{ENVSDK.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_shell(script: str, cwd: Path, timeout: float = 500) -> subprocess.CompletedProcess[str]:
    """``bash -e -c script`` in `cwd` as the reader runs it (`on_path`), output captured."""
    return subprocess.run(
        ["bash", "-e", "-c", script], check=False, cwd=cwd, env=on_path(), capture_output=True, text=True, timeout=timeout
    )


class ScriptedModel:
    """An OpenAI-compatible chat endpoint serving one model id. It answers every request with
    `reply`: a text, or a function of the request body returning the assistant message (for
    tool calls or a reasoning field); it keeps each request body (a real model's text cannot
    show what was sent)."""

    def __init__(self, model: str, reply: str | Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.model, self.reply = model, reply
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.get("/v1/models")(self._models)
        self.app.post("/v1/chat/completions")(self._complete)

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

    async def _complete(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        self.requests.append(body)
        message = {"role": "assistant", "content": self.reply} if isinstance(self.reply, str) else self.reply(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {"id": "c", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


@pytest.fixture
def openai_endpoint() -> Iterator[Any]:
    """``start(model, reply) -> (base_url, ScriptedModel)``: scripted endpoints on free ports,
    stopped at teardown."""
    stack: list[Any] = []

    def start(model: str, reply: str | Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[str, ScriptedModel]:
        scripted = ScriptedModel(model, reply)
        context = running_server(scripted.app)
        url = context.__enter__()
        stack.append(context)
        return url, scripted

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)
