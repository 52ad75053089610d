"""Reasoning blocks: a reasoning model's scratch work is recorded, never played as its move.

Reasoning models (Qwen3, DeepSeek-R1 and their kin) write ``<think>…</think>`` before the
reply. A chat template that opens the block in the prompt (Qwen3's with thinking on) leaves the
completion starting inside it, so only the closing tag appears. `split_reasoning` takes either
form apart; a completion whose block never closes (cut by the length limit) is all reasoning
and has no reply.
"""

from __future__ import annotations

import re

__all__ = ["THINK_CLOSE", "THINK_OPEN", "split_reasoning"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_LEADING_OPEN = re.compile(r"\A\s*<think>", re.IGNORECASE)
_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, reply)`` of a completion: the reasoning is what stands inside a leading
    ``<think>…</think>`` block, or before the first ``</think>`` when the completion starts
    inside the block; the reply is what follows, stripped of surrounding blank space. A
    completion that opens ``<think>`` and never closes it is all reasoning (reply ``""``). One
    with no reasoning block is returned as ``(None, text)`` unchanged."""
    opened = _LEADING_OPEN.match(text)
    body = text[opened.end():] if opened else text
    closed = _CLOSE.search(body)
    if closed is None:
        if opened:
            return body.strip(), ""
        return None, text
    return body[: closed.start()].strip(), body[closed.end():].strip()
