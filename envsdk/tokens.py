"""Token-exact trajectories: the token ids a model read and wrote, turn by turn, and how to rebuild
the whole sequence and its loss mask from them.

A record's ``tokens`` (``envsdk rollout --tokens``) is a list with one entry per assistant turn:

* ``turn``: the turn number (1, 2, …);
* ``prompt_ids``: on the first turn, the whole prompt the model was given; on a later turn only
  when that turn's prompt did not continue the previous turn's tokens (the policy rebuilt its
  context, e.g. an OpenAI-compatible server re-templating the chat), so the sequence restarts;
* ``env_ids``: on a later turn whose prompt continues the previous one, the tokens the
  environment's reply added after the model's last token (its observation, rendered by the chat
  template, and the next generation prompt);
* ``completion_ids`` and ``logprobs``: what the model generated, with the log-probability of each
  token under the distribution it was sampled from (``logprobs`` null when the policy gives none).

`rebuild` turns this back into one sequence, a mask (1 = a model token, trained on; 0 = prompt or
environment token) and per-token logprobs, without re-tokenising any text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TOKENS", "token_turn", "TokenSequence", "rebuild"]

#: The record's key (and the trajectory's ``rollout_infos`` key while it runs).
TOKENS = "tokens"


def token_turn(
    previous: Sequence[Mapping[str, Any]],
    turn: int,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
) -> dict[str, Any]:
    """The ``tokens`` entry of a turn whose prompt was `prompt_ids`, given the entries of the
    turns before it (`previous`): ``env_ids`` when the prompt continues them, else ``prompt_ids``."""
    entry: dict[str, Any] = {"turn": turn}
    so_far = rebuild(previous).ids if previous else None
    if so_far is not None and len(prompt_ids) >= len(so_far) and list(prompt_ids[: len(so_far)]) == so_far:
        entry["env_ids"] = [int(i) for i in prompt_ids[len(so_far) :]]
    else:
        entry["prompt_ids"] = [int(i) for i in prompt_ids]
    entry["completion_ids"] = [int(i) for i in completion_ids]
    entry["logprobs"] = [float(x) for x in logprobs] if logprobs is not None else None
    return entry


@dataclass(frozen=True)
class TokenSequence:
    """A trajectory as one token sequence: ``ids``, ``mask`` (1 where the model generated the
    token) and ``logprobs`` (the model's for its tokens, 0.0 elsewhere or where none was given)."""

    ids: list[int]
    mask: list[int]
    logprobs: list[float]


def rebuild(tokens: Sequence[Mapping[str, Any]]) -> TokenSequence:
    """The sequence of the last context the model saw and what it generated from there: from the
    latest turn that gave ``prompt_ids`` on (each later turn adds its ``env_ids``, then its
    ``completion_ids``)."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for entry in tokens:
        if "prompt_ids" in entry:
            ids, mask, logprobs = list(entry["prompt_ids"]), [0] * len(entry["prompt_ids"]), [0.0] * len(entry["prompt_ids"])
        else:
            added = list(entry.get("env_ids") or [])
            ids += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
        completion = list(entry["completion_ids"])
        given = entry.get("logprobs")
        ids += completion
        mask += [1] * len(completion)
        logprobs += [float(x) for x in given] if given is not None else [0.0] * len(completion)
    return TokenSequence(ids, mask, logprobs)
