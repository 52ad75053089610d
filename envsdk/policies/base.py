"""The policy contract: given the conversation so far, produce the next assistant reply.

A policy is anything with ``async act(messages) -> str``. Schedulers that need to know whether
a completion was cut by the length limit call ``act_ex``, which returns a `PolicyOutput`; its
default implementation wraps ``act`` and reports ``finish_reason="stop"`` (right for policies
that have no length limit, such as scripted ones). Model-backed policies override ``act_ex``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from envsdk.errors import EnvSDKError

__all__ = [
    "FinishReason",
    "Message",
    "PolicyOutput",
    "Policy",
    "PolicyError",
    "ObservationParseError",
    "message_text",
]

FinishReason = Literal["stop", "length"]
#: An OpenAI-style chat message: ``{"role": "user", "content": "…"}``.
Message = dict[str, Any]


@dataclass(frozen=True)
class PolicyOutput:
    """One reply and how it ended.

    ``finish_reason`` is ``"length"`` when the reply was cut by the token limit (a scheduler
    should not send it to the environment as a finished move) and ``"stop"`` otherwise. Token
    counts are given when the backend reports them.

    A policy asked for token-exact output (its ``token_exact`` attribute set true) also gives
    ``prompt_ids`` (the whole context it generated from), ``completion_ids`` (what it generated)
    and, where it can, ``logprobs`` (one per completion token); `envsdk.tokens` records them.

    ``reasoning`` is the model's reasoning when the backend returns it apart from the reply (an
    OpenAI-compatible server's ``reasoning_content``); ``text`` then holds the reply alone. When
    it is None, a scheduler splits a ``<think>…</think>`` block off ``text`` itself
    (`envsdk.reasoning.split_reasoning`): reasoning is recorded, never played as the action.
    ``tool_calls`` are the reply's native tool calls, in OpenAI's form (``[{"id": …, "type":
    "function", "function": {"name": …, "arguments": "<JSON text>"}}]``), from a policy asked
    with ``tools=``.
    """

    text: str
    finish_reason: FinishReason = "stop"
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None


class PolicyError(EnvSDKError):
    """A policy could not produce a reply."""


class ObservationParseError(PolicyError):
    """A scripted policy found nothing it can read (no board, no map) in the conversation."""


class Policy(abc.ABC):
    """Produces the next assistant reply from the conversation so far.

    Contract:

    * ``await act(messages)`` returns the reply text; `messages` is the whole conversation in
      OpenAI chat format and is not modified.
    * ``await act_ex(messages, tools=None)`` returns the same reply as a `PolicyOutput` with its
      finish reason; by default it wraps ``act``. `tools` is a list of OpenAI tool definitions
      (``{"type": "function", "function": {"name", "description", "parameters"}}``) for a
      policy whose ``supports_tools`` is true: it may then answer with
      `PolicyOutput.tool_calls`; a policy without tool support ignores it.
    * ``await aclose()`` releases what the policy holds (connections, models); idempotent. A
      policy is also an async context manager that closes itself on exit.
    * A policy may be called concurrently from many tasks.
    """

    #: Whether `act_ex` reads ``tools=`` and answers with native tool calls.
    supports_tools: bool = False

    @abc.abstractmethod
    async def act(self, messages: list[Message]) -> str:
        """The next assistant reply's text."""

    async def act_ex(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        """The next assistant reply with its finish reason (`tools`: see the class docstring)."""
        return PolicyOutput(text=await self.act(messages))

    async def aclose(self) -> None:
        """Release resources. Idempotent."""
        return None

    async def __aenter__(self) -> Policy:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def message_text(message: Message) -> str:
    """The text of a chat message: its ``content`` string, or the text parts of a content list
    (OpenAI's multi-part format) joined by newlines; ``""`` when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        ]
        return "\n".join(parts)
    return ""
