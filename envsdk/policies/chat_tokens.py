"""Chat-template token ids that continue a model's own tokens, without re-tokenising its replies.

Decoding a model's completion and encoding the text again does not give back the same ids (a
tokenizer has many ways to spell a string and picks one; special tokens can vanish in the
decode), and templates may rewrite earlier turns (drop reasoning, trim whitespace). So a
multi-turn context is kept as ids: the model's tokens as generated, and after them only the
ids of what came since (the environment's messages and the next generation prompt).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = ["chat_ids", "continuation_ids"]

# A one-message conversation the new messages are rendered after, so that they come out as they
# do mid-conversation (never as the template's first turn, which may add a system prompt).
_DUMMY_TURN: list[dict[str, Any]] = [{"role": "user", "content": "x"}]


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool, **template_kwargs: Any) -> list[int]:
    """The chat template's token ids of `messages`."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **template_kwargs
    )
    return [int(i) for i in ids]


def continuation_ids(
    tokenizer: Any, new_messages: list[dict[str, Any]], eos_ids: Collection[int], **template_kwargs: Any
) -> list[int]:
    """Token ids of `new_messages` as they follow a finished turn, plus the generation prompt.

    Rendered after a one-message dummy conversation cut at its end-of-sequence token (as TRL
    renders tool results), so they continue the model's own tokens, which end there. Raises
    `ValueError` for a template that does not render a conversation as an extension of its
    beginning."""
    prefix = chat_ids(tokenizer, _DUMMY_TURN, add_generation_prompt=False, **template_kwargs)
    eos_positions = [i for i, t in enumerate(prefix) if t in eos_ids]
    if eos_positions:
        prefix = prefix[: eos_positions[-1] + 1]
    full = chat_ids(tokenizer, _DUMMY_TURN + list(new_messages), add_generation_prompt=True, **template_kwargs)
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "the chat template does not render a conversation as an extension of its beginning; "
            "environment turns cannot be appended as tokens"
        )
    return full[len(prefix) :]
