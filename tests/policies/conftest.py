"""Shared fixtures for policy tests: one tiny model per session, one thread for torch, and a
scripted OpenAI-compatible server.

HF_HUB_OFFLINE is set before anything imports transformers so that no test can reach a hub.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 checkpoint with its tokenizer (skipped without the model extras)."""
    pytest.importorskip("transformers", reason="needs transformers (envsdk[train]) for a model")
    torch = pytest.importorskip("torch", reason="needs torch (envsdk[train]) for a model")
    # Two cores are shared by everyone's tests.
    torch.set_num_threads(1)
    from envsdk.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), seed=0)


class ScriptedChatServer:
    """A small OpenAI-compatible chat completions server on loopback, for what `transformers
    serve` cannot show: it answers each ``POST /v1/chat/completions`` with the next message of
    `replies` (as the assistant message; ``reasoning_content``, ``reasoning`` and ``tool_calls``
    included as given, ``tool_calls`` as raw as a test wants them), then with `default`, and
    keeps every request body in `bodies`. ``GET /v1/models`` lists `model` (the rollout
    command's pre-flight check reads it)."""

    def __init__(self, replies: list[dict[str, Any]] | None = None, *, model: str = "m", default: str = "ok") -> None:
        self.replies = list(replies or [])
        self.model = model
        self.default = default
        self.bodies: list[dict[str, Any]] = []
        self.base_url = ""

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            self.bodies.append(body)
            reply = self.replies.pop(0) if self.replies else {"content": self.default}
            message = {"role": "assistant", "content": None, **reply}
            finish = "tool_calls" if reply.get("tool_calls") else "stop"
            return JSONResponse({
                "id": f"chatcmpl-{len(self.bodies)}", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            })

        return Starlette(routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", complete, methods=["POST"]),
        ])


@pytest.fixture
def chat_server() -> Iterator[ScriptedChatServer]:
    """A running `ScriptedChatServer` (its ``base_url`` set); stopped after the test."""
    from envsdk.testing import running_server

    server = ScriptedChatServer()
    with running_server(server.app()) as base_url:
        server.base_url = base_url
        yield server
