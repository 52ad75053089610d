"""A policy backed by any OpenAI-compatible chat completions server.

``vllm serve MODEL`` on a GPU machine, ``transformers serve DIR`` on a CPU one, or a hosted API:
all answer ``POST /v1/chat/completions``. Needs the ``openai`` extra (httpx).

Every request is bounded in seconds and bytes: `timeout` is a total deadline for the whole
request (connecting, sending and reading the entire body), not a per-read timeout a server can
defeat by trickling a byte at a time; a body longer than `max_response_bytes` is refused as soon
as it declares or reaches that size, so it is never held whole.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("OpenAIChatPolicy needs httpx: pip install httpx (or pip install -e '.[openai]' in the envsdk clone)") from exc

from envsdk.policies.base import Message, Policy, PolicyError, PolicyOutput

__all__ = [
    "OpenAIChatPolicy",
    "InferenceError",
    "InferenceServerError",
    "InferenceConnectionError",
    "InferenceTimeoutError",
    "InferenceResponseError",
    "InferenceResponseTooLargeError",
    "chat_completions_url",
    "DEFAULT_MAX_RESPONSE_BYTES",
]

# An error body can be a whole HTML page; enough of it to act on goes into the message.
_BODY_EXCERPT = 2000
# What is kept of a non-2xx body: any error message fits, and a huge one is not read on.
_ERROR_BODY_BYTES = 64 << 10

#: The default `max_response_bytes`: a long completion with logprobs is a few MiB at most.
DEFAULT_MAX_RESPONSE_BYTES = 16 << 20


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


class InferenceTimeoutError(InferenceConnectionError):
    """The whole request (connect, send, every byte of the answer) took longer than `timeout`
    seconds."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(
            f"POST {url} gave no complete answer within {timeout} s (the total deadline of one"
            " request); raise `timeout` or check the server"
        )
        self.url = url
        self.timeout = timeout


class InferenceResponseError(InferenceError):
    """The server answered 2xx with a body that is not a chat completion."""


class InferenceResponseTooLargeError(InferenceResponseError):
    """The answer's body declares or reaches more than `limit` bytes (``max_response_bytes``)."""

    def __init__(self, url: str, limit: int, declared: int | None = None) -> None:
        size = f"declares {declared} bytes" if declared is not None else f"passed {limit} bytes"
        super().__init__(
            f"POST {url} answered a body that {size}, over max_response_bytes={limit}; lower"
            " max_tokens or raise max_response_bytes"
        )
        self.url = url
        self.limit = limit
        self.declared = declared


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
    vLLM's ``top_k`` or ``chat_template_kwargs``). The sampling options follow OpenAI's
    conventions and ranges: ``temperature`` in [0, 2] (0 is greedy), ``top_p`` in (0, 1],
    ``max_tokens`` >= 1. `api_key` is sent as ``Authorization: Bearer <key>``; None (the
    default) reads ``$OPENAI_API_KEY``, ``""`` sends no key. At most `concurrency` requests are
    in flight at once; `timeout` is the total deadline of one request in seconds and
    `max_response_bytes` the largest body read (see the module docstring).

    ``finish_reason`` is ``"length"`` when the server reports the reply was cut by
    ``max_tokens`` and ``"stop"`` for every other ending. Errors: `InferenceServerError`
    (non-2xx, with status and the start of the body), `InferenceConnectionError` (unreachable)
    and its `InferenceTimeoutError` (past `timeout`), `InferenceResponseError` (a 2xx body that
    is not a chat completion) and its `InferenceResponseTooLargeError` (over
    `max_response_bytes`). A bad option is a `ValueError` naming it.

    With `token_exact` true (``envsdk rollout --tokens``) each request also asks for
    ``logprobs`` and vLLM's ``return_token_ids``; a reply whose body carries
    ``prompt_token_ids`` and the choice's ``token_ids`` gives them as `PolicyOutput.prompt_ids`
    and ``completion_ids`` (with ``logprobs``, one per token, when the lengths agree). A server
    that returns no ids (most hosted APIs) gives none, and its records have no tokens; one that
    refuses the field (``transformers serve`` answers 422) is asked without it from then on.
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
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0.0 <= temperature <= 2.0:
            raise ValueError(f"temperature must be within [0, 2] (0 is greedy), got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be within (0, 1], got {top_p}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout}")
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY")
        self.url = chat_completions_url(base_url)
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self.token_exact = False
        self._ask_token_ids = True
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One connection per concurrent request is all the semaphore ever lets through. httpx's
        # timeout bounds each read only; `act_ex` puts the total deadline around the request.
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
        if self.token_exact:
            body["logprobs"] = True
            if self._ask_token_ids:
                body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        body = self.request_body(messages)
        async with self._semaphore:
            try:
                status, text = await asyncio.wait_for(self._post(body), self.timeout)
            except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
                raise InferenceTimeoutError(self.url, self.timeout) from exc
            except httpx.TransportError as exc:
                raise InferenceConnectionError(
                    f"POST {self.url} failed: {type(exc).__name__}: {exc}; is the server running?"
                ) from exc
        if not 200 <= status < 300:
            if "return_token_ids" in body and status in (400, 422) and "return_token_ids" in text:
                # A server without vLLM's token ids (transformers serve) refuses the field: ask once more
                # without it, and never again.
                self._ask_token_ids = False
                return await self.act_ex(messages)
            raise InferenceServerError(self.url, status, text)
        return _parse_completion(self.url, text)

    async def _post(self, body: dict[str, Any]) -> tuple[int, str]:
        """``(status, body text)``, reading at most `max_response_bytes` of a 2xx body (else
        `InferenceResponseTooLargeError`) and the first bytes of any other."""
        async with self._client.stream("POST", self.url, json=body) as response:
            success = response.is_success
            limit = self.max_response_bytes if success else _ERROR_BODY_BYTES
            declared = response.headers.get("content-length")
            if success and declared is not None and declared.isdigit() and int(declared) > limit:
                raise InferenceResponseTooLargeError(self.url, limit, int(declared))
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    if success:
                        raise InferenceResponseTooLargeError(self.url, limit)
                    del data[limit:]
                    break
            encoding = response.encoding or "utf-8"
            return response.status_code, data.decode(encoding, errors="replace")

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
    prompt_ids, completion_ids = _ids_or_none(payload.get("prompt_token_ids")), _ids_or_none(choice.get("token_ids"))
    return PolicyOutput(
        # A reply made only of tool calls or cut before any text has content null.
        text=content if isinstance(content, str) else "",
        finish_reason="length" if finish == "length" else "stop",
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        prompt_ids=prompt_ids if completion_ids is not None else None,
        completion_ids=completion_ids if prompt_ids is not None else None,
        logprobs=_token_logprobs(choice.get("logprobs"), completion_ids),
    )


def _ids_or_none(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return [int(i) for i in value]
    return None


def _token_logprobs(value: Any, ids: list[int] | None) -> list[float] | None:
    """The per-token logprobs of an OpenAI ``logprobs`` object, when there is one per id."""
    content = value.get("content") if isinstance(value, dict) else None
    if ids is None or not isinstance(content, list) or len(content) != len(ids):
        return None
    found: list[float] = []
    for entry in content:
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
            return None
        found.append(float(logprob))
    return found


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None
