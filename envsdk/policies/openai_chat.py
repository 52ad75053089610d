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
from envsdk.policies.sampling import SamplingError, check_sampling

__all__ = [
    "OpenAIChatPolicy",
    "InferenceError",
    "InferenceServerError",
    "InferenceConnectionError",
    "InferenceTimeoutError",
    "InferenceResponseError",
    "InferenceResponseTooLargeError",
    "InferenceToolCallError",
    "chat_completions_url",
    "wire_messages",
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


class InferenceToolCallError(InferenceResponseError):
    """The answer's ``message.tool_calls`` is not a list of OpenAI function calls (each an
    object with a ``function`` holding a ``name`` and ``arguments``)."""

    def __init__(self, url: str, problem: str, tool_calls: Any) -> None:
        shown = json.dumps(tool_calls, default=str)
        super().__init__(f"POST {url} answered malformed tool_calls: {problem}: {shown[:_BODY_EXCERPT]}")
        self.url = url
        self.tool_calls = tool_calls


def chat_completions_url(base_url: str) -> str:
    """``{base}/v1/chat/completions`` for a base URL given with or without its ``/v1``."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/chat/completions"


class OpenAIChatPolicy(Policy):
    """Asks an OpenAI-compatible server for each reply (non-streaming chat completions).

    Every request sends `model`, the messages, ``temperature``, ``top_p``, ``max_tokens``,
    ``chat_template_kwargs`` when given (vLLM and SGLang pass them to the chat template:
    ``{"enable_thinking": false}`` turns Qwen3's thinking off) and, with a `seed`, ``seed + n``
    on the policy's n-th request (so repeated requests of one prompt, a group's rollouts, do not
    all draw the same reply); `extra_body` is merged in last (server-specific fields such as
    vLLM's ``top_k``). The sampling options follow OpenAI's conventions and ranges:
    ``temperature`` in [0, 2] (default 1; 0 is greedy, which `greedy` asks for), ``top_p`` in
    (0, 1], ``max_tokens`` >= 1. `api_key` is sent as ``Authorization: Bearer <key>``; None (the
    default) reads ``$OPENAI_API_KEY``, ``""`` sends no key. At most `concurrency` requests are
    in flight at once; `timeout` is the total deadline of one request in seconds and
    `max_response_bytes` the largest body read (see the module docstring).

    Reasoning a server returns apart from the reply (vLLM's and SGLang's ``--reasoning-parser``:
    ``message.reasoning_content``, or ``message.reasoning`` from vLLM 0.11 on) becomes
    `PolicyOutput.reasoning`, and ``content`` alone the reply. Native tools: ``act_ex(messages,
    tools=[...])`` sends them as ``tools`` with ``tool_choice: "auto"``, and the reply's
    ``message.tool_calls`` (several allowed; ``content`` may then be null: the text is ``""``)
    become `PolicyOutput.tool_calls`, in OpenAI's form (an ``arguments`` object some servers
    return is turned into its JSON text; a call without an id gets ``call_<n>``). Arguments
    that are not valid JSON are the model's mistake and are passed on as they are; a
    ``tool_calls`` that is not a list of such calls is `InferenceToolCallError`. The
    conversation is sent as OpenAI's API takes it (`wire_messages`): an assistant message keeps
    its ``tool_calls`` (``arguments`` as JSON text), a ``tool`` message its ``tool_call_id``,
    and the ``reasoning_content`` a record keeps on an assistant message is not sent back
    (OpenAI refuses unknown message fields, DeepSeek's API refuses that one, and the templates
    that read it, Qwen3's, drop earlier turns' reasoning anyway).

    ``finish_reason`` is ``"length"`` when the server reports the reply was cut by
    ``max_tokens`` and ``"stop"`` for every other ending. Errors: `InferenceServerError`
    (non-2xx, with status and the start of the body), `InferenceConnectionError` (unreachable)
    and its `InferenceTimeoutError` (past `timeout`), `InferenceResponseError` (a 2xx body that
    is not a chat completion) and its `InferenceResponseTooLargeError` (over
    `max_response_bytes`) and `InferenceToolCallError`. A bad option is a `ValueError`
    (`SamplingError` for a decoding setting) naming it.

    With `token_exact` true (``envsdk rollout --tokens``) each request also asks for
    ``logprobs`` and vLLM's ``return_token_ids``; a reply whose body carries
    ``prompt_token_ids`` and the choice's ``token_ids`` gives them as `PolicyOutput.prompt_ids`
    and ``completion_ids`` (with ``logprobs``, one per token, when the lengths agree). A server
    that returns no ids (most hosted APIs) gives none, and its records have no tokens; one that
    refuses the field (``transformers serve`` answers 422) is asked without it from then on.
    """

    supports_tools = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float | None = None,
        top_p: float = 1.0,
        max_tokens: int = 512,
        seed: int | None = None,
        greedy: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        temperature = check_sampling(
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, greedy=greedy, max_temperature=2.0
        )
        extra_body = dict(extra_body or {})
        if extra_body.get("stream"):
            raise SamplingError("extra_body: stream is not supported; this policy reads whole (non-streamed) completions")
        if extra_body.get("n", 1) != 1:
            raise SamplingError(f"extra_body: n={extra_body['n']!r}; this policy reads one choice per request: leave n out")
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
        self.greedy = temperature == 0
        self.chat_template_kwargs: dict[str, Any] | None = dict(chat_template_kwargs) if chat_template_kwargs else None
        self.extra_body: dict[str, Any] = extra_body
        self.token_exact = False
        self._requests = 0
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

    @property
    def sampling_settings(self) -> dict[str, Any]:
        """The decoding settings every request carries (`envsdk.policies.sampling.settings_text`
        prints them), the extra body fields last."""
        settings: dict[str, Any] = {
            "temperature": self.temperature, "greedy": self.greedy, "top_p": self.top_p,
            "max_tokens": self.max_tokens, "seed": self.seed,
        }
        if self.chat_template_kwargs:
            settings["chat_template_kwargs"] = self.chat_template_kwargs
        return {**settings, **self.extra_body}

    def request_body(
        self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None, request: int = 0
    ) -> dict[str, Any]:
        """The JSON body sent for `messages` (as `wire_messages` makes them) and `tools` as the
        policy's `request`-th request (0 first: it sends ``seed + request``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages(messages),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed + request
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if self.token_exact:
            body["logprobs"] = True
            if self._ask_token_ids:
                body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        request = self._requests
        self._requests += 1
        return await self._complete(messages, tools, request)

    async def _complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, request: int) -> PolicyOutput:
        body = self.request_body(messages, tools=tools, request=request)
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
                return await self._complete(messages, tools, request)
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


#: The fields OpenAI's chat API takes on a message of each role; a message of another role is
#: sent as it is.
_WIRE_FIELDS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


def wire_messages(messages: list[Message]) -> list[Message]:
    """`messages` as OpenAI's chat API takes them: each message of a known role keeps only the
    fields that role has there (a record's ``reasoning_content`` and any field of envsdk's own
    are left out), and an assistant's ``tool_calls`` carry ``type: "function"`` and their
    ``arguments`` as JSON text (an ``arguments`` object, as chat templates take it, is dumped)."""
    sent: list[Message] = []
    for message in messages:
        fields = _WIRE_FIELDS.get(str(message.get("role")))
        if fields is None:
            sent.append(message)
            continue
        kept = {key: message[key] for key in fields if key in message}
        calls = kept.get("tool_calls")
        if isinstance(calls, list) and calls:
            kept["tool_calls"] = [_wire_call(call) for call in calls]
        elif "tool_calls" in kept:  # null or empty: OpenAI refuses an empty list
            del kept["tool_calls"]
        sent.append(kept)
    return sent


def _wire_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments") or {})
    return {**call, "type": call.get("type") or "function", "function": function}


def _parse_completion(url: str, text: str) -> PolicyOutput:
    try:
        payload = json.loads(text)
        choice = payload["choices"][0]
        message = choice["message"]
        content = message.get("content")
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise InferenceResponseError(
            f"POST {url} answered a body that is not a chat completion: {text[:_BODY_EXCERPT]}"
        ) from exc
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    prompt_ids, completion_ids = _ids_or_none(payload.get("prompt_token_ids")), _ids_or_none(choice.get("token_ids"))
    # `reasoning_content` is vLLM's name before 0.11 and SGLang's; `reasoning` vLLM's since.
    reasoning = next((r for r in (message.get("reasoning_content"), message.get("reasoning")) if isinstance(r, str) and r), None)
    return PolicyOutput(
        # A reply made only of tool calls or cut before any text has content null.
        text=content if isinstance(content, str) else "",
        finish_reason="length" if finish == "length" else "stop",
        reasoning=reasoning,
        tool_calls=_tool_calls(url, message.get("tool_calls")),
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        prompt_ids=prompt_ids if completion_ids is not None else None,
        completion_ids=completion_ids if prompt_ids is not None else None,
        logprobs=_token_logprobs(choice.get("logprobs"), completion_ids),
    )


def _tool_calls(url: str, value: Any) -> list[dict[str, Any]] | None:
    """A reply's ``tool_calls`` in OpenAI's form, or None when it has none;
    `InferenceToolCallError` for one that is not a list of function calls."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise InferenceToolCallError(url, f"expected a list of calls, got {type(value).__name__}", value)
    ids = {call.get("id") for call in value if isinstance(call, dict)}
    calls: list[dict[str, Any]] = []
    for n, call in enumerate(value):
        where = f"call {n}"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise InferenceToolCallError(url, f"{where} has no function object", value)
        kind = call.get("type", "function")
        if kind != "function":
            raise InferenceToolCallError(url, f"{where} is of type {kind!r}, not a function call", value)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InferenceToolCallError(url, f"{where} names no function", value)
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        if not isinstance(arguments, str):
            raise InferenceToolCallError(url, f"{where} ({name}) has arguments that are neither JSON text nor an object", value)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = next(f"call_{k}" for k in range(n, n + len(value) + 1) if f"call_{k}" not in ids)
            ids.add(call_id)
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


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
