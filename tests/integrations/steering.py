"""Steering a random tiny model into well-formed replies, for training tests.

The tiny model is random; to make it play, generation is steered with ``sequence_bias`` (a
generation setting TRL passes through ``GRPOConfig.generation_kwargs``): every prefix of a
few well-formed replies gets a bias growing with its length, so the model writes one of those
replies, and the model's own logits still choose which one.
"""

from __future__ import annotations

from typing import Any

# Moves into the top-left 3x3 corner with any digit: some are legal on any board, most not,
# so rewards differ within a group.
MOVES = [(r, c, n) for r in range(1, 4) for c in range(1, 4) for n in range(1, 10)]


def steering_bias(tokenizer: Any, replies: list[str]) -> dict[tuple[int, ...], float]:
    """``sequence_bias`` that makes a model write one of `replies`, then its EOS token."""
    bias: dict[tuple[int, ...], float] = {}
    for reply in replies:
        ids = [*tokenizer(reply, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        for k in range(1, len(ids) + 1):
            bias[tuple(ids[:k])] = 10.0 * k
    return bias
