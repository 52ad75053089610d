"""An ms-swift inference engine whose "model" is a policy: the scripted stand-in for vLLM.

ms-swift's schedulers call ``infer_engine.infer_async(request, request_config)`` for each turn
and read ``choices[0]`` (text, ``finish_reason``, ``token_ids``) and ``infer_engine.tokenizer``.
`ScriptedEngine` answers with a policy's reply (envsdk's oracles, or a fixed list), tokenised
by a real tokenizer so that ms-swift's token bookkeeping (ID-backed assistant messages) runs
as it does with vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swift.infer_engine.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    RequestConfig,
    RolloutInferRequest,
    RolloutOutput,
    UsageInfo,
)
from swift.template.utils import get_token_backed_response_ids

from envsdk.policies import Policy


class ReplyScript(Policy):
    """Answers the given replies in order; raises once they run out."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.asked = 0

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if self.asked >= len(self.replies):
            raise AssertionError(f"the script has only {len(self.replies)} replies")
        reply = self.replies[self.asked]
        self.asked += 1
        return reply


class ScriptedEngine:
    """``infer_async`` answers `policy`'s reply; ``finish_reasons[i]`` (default ``"stop"``) is
    the finish reason of the i-th call. `conversations` records what each call was shown."""

    def __init__(self, policy: Policy, tokenizer: Any, finish_reasons: Sequence[str] = ()) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.finish_reasons = list(finish_reasons)
        self.conversations: list[list[dict[str, Any]]] = []

    def _as_text(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A real engine's template decodes ID-backed assistant turns; the policy reads text.
        out = []
        for message in messages:
            ids = get_token_backed_response_ids(message.get("content"))
            content = self.tokenizer.decode(ids) if ids is not None else message.get("content")
            out.append({**message, "content": content})
        return out

    async def infer_async(
        self, infer_request: RolloutInferRequest, request_config: RequestConfig, **kwargs: Any
    ) -> ChatCompletionResponse:
        messages = self._as_text(infer_request.messages)
        self.conversations.append(messages)
        call = len(self.conversations) - 1
        text = await self.policy.act(messages)
        finish_reason = self.finish_reasons[call] if call < len(self.finish_reasons) else "stop"
        token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        choice = ChatCompletionResponseChoice(
            index=0,
            message=ChatMessage(role="assistant", content=text),
            finish_reason=finish_reason,  # type: ignore[arg-type]
            token_ids=token_ids,
        )
        return ChatCompletionResponse(
            model="scripted", choices=[choice], usage=UsageInfo(0, len(token_ids), len(token_ids))
        )

    def rollout_fn(self, requests: list[RolloutInferRequest], request_config: RequestConfig) -> list[RolloutOutput]:
        """One turn for a batch, synchronously: what ms-swift's colocate loop calls each turn."""
        import asyncio

        async def turn() -> list[RolloutOutput]:
            responses = await asyncio.gather(*(self.infer_async(r, request_config) for r in requests))
            return [RolloutOutput(response=r) for r in responses]

        return asyncio.run(turn())
