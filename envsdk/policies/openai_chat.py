"""A policy backed by any OpenAI-compatible chat completions server.

``vllm serve MODEL`` on a GPU machine, ``transformers serve DIR`` on a CPU one, or a hosted API:
all answer ``POST /v1/chat/completions``. Needs the ``openai`` extra (httpx).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("OpenAIChatPolicy needs httpx: pip install 'envsdk[openai]'") from exc

from envsdk.policies.base import Message, Policy, PolicyError, PolicyOutput

__all__ = [
    "OpenAIChatPolicy",
    "InferenceError",
    "InferenceServerError",
    "InferenceConnectionError",
    "InferenceResponseError",
    "chat_completions_url",
]

# An error body can be a whole HTML page; enough of it to act on goes into the message.
_BODY_EXCERPT = 2000


class InferenceError(PolicyError):
    """The inference server could not give a reply."""


class InferenceServerError(InferenceError):
    """The server answered with a non-2xx status; `status_code` and `body` say what it said."""

    def __init__(self, url: str, status_code: int, body: str) -> None:
        super().__init__(
            f"POST {url} answered HTTP {status_code}: {body[:_BODY_EXCERPT]}"
        )
        self.url = url
        self.status_code = status_code
        self.body = body


class InferenceConnectionError(InferenceError):
    """The server could not be reached, or did not answer within the timeout."""


class InferenceResponseError(InferenceError):
    """The server answered 2xx with a body that is not a chat completion."""


def chat_completions_url(base_url: str) -> str:
    """``{base}/v1/chat/completions`` for a base URL given with or without its ``/v1``."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/chat/completions"


class OpenAIChatPolicy(Policy):
    """Asks an OpenAI-compatible server for each reply (non-streaming chat completions).

    Every request sends `model`, the messages, ``temperature``, ``top_p``, ``max_tokens`` and,
    when given, ``seed``; `extra_body` is merged in last (for server-specific fields such as
    vLLM's ``top_k`` or ``chat_template_kwargs``). At most `concurrency` requests are in
    flight at once; `timeout` bounds each request in seconds.

    ``finish_reason`` is ``"length"`` when the server reports the reply was cut by
    ``max_tokens`` and ``"stop"`` for every other ending. Errors: `InferenceServerError`
    (non-2xx, with status and body), `InferenceConnectionError` (unreachable, timed out),
    `InferenceResponseError` (a 2xx body that is not a chat completion).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 512,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.url = chat_completions_url(base_url)
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self.concurrency = concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One connection per concurrent request is all the semaphore ever lets through.
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self._semaphore = asyncio.Semaphore(concurrency)

    def request_body(self, messages: list[Message]) -> dict[str, Any]:
        """The JSON body sent for `messages`."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        body.update(self.extra_body)
        return body

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        body = self.request_body(messages)
        async with self._semaphore:
            try:
                response = await self._client.post(self.url, json=body)
            except httpx.TimeoutException as exc:
                raise InferenceConnectionError(
                    f"POST {self.url} timed out ({type(exc).__name__}); raise `timeout` or check the server"
                ) from exc
            except httpx.TransportError as exc:
                raise InferenceConnectionError(
                    f"POST {self.url} failed: {type(exc).__name__}: {exc}; is the server running?"
                ) from exc
        if not response.is_success:
            raise InferenceServerError(self.url, response.status_code, response.text)
        return _parse_completion(self.url, response.text)

    async def aclose(self) -> None:
        await self._client.aclose()


def _parse_completion(url: str, text: str) -> PolicyOutput:
    try:
        payload = json.loads(text)
        choice = payload["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise InferenceResponseError(
            f"POST {url} answered a body that is not a chat completion: {text[:_BODY_EXCERPT]}"
        ) from exc
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return PolicyOutput(
        # A reply made only of tool calls or cut before any text has content null.
        text=content if isinstance(content, str) else "",
        finish_reason="length" if finish == "length" else "stop",
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None
