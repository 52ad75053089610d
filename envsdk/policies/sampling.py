"""Decoding settings in one vocabulary for every model-backed policy.

``temperature``, ``top_p``, ``max_tokens`` and ``seed`` mean the same for `OpenAIChatPolicy` and
`TransformersPolicy` (OpenAI's names and ranges; temperature 0 is greedy decoding); ``greedy``
asks for temperature 0; ``chat_template_kwargs`` go to the chat template (``enable_thinking``).
`sampling_kwargs` turns them, with a vf-eval-style ``sampling_args`` object merged over them, into
one policy's constructor arguments: the named keys to their parameters, any other key to the
backend (request body fields for an OpenAI-compatible server, ``generate`` arguments for
transformers, which the policy checks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from envsdk.policies.base import PolicyError

__all__ = ["MODEL_POLICIES", "SAMPLING_KEYS", "SamplingError", "check_sampling", "sampling_kwargs", "settings_text"]

#: The keys of a ``sampling_args`` object that every model-backed policy reads itself.
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed")
#: The policies that decode, by their `make_policy` name.
MODEL_POLICIES = ("openai", "transformers")


class SamplingError(PolicyError, ValueError):
    """A decoding setting is out of range, of the wrong type, or one the backend cannot take."""


def check_sampling(
    *, temperature: float | None, top_p: float, max_tokens: int, greedy: bool = False, max_temperature: float | None = None
) -> float:
    """The temperature to decode with (0 with `greedy`, 1 when `temperature` is None);
    `SamplingError` naming the first setting out of its range: ``temperature`` >= 0 (and at
    most `max_temperature` when given), ``top_p`` in (0, 1], ``max_tokens`` >= 1, and for a
    temperature above 0 with `greedy`."""
    if greedy and temperature:
        raise SamplingError(f"greedy decoding is temperature 0; temperature {temperature:g} asks for sampling: give one of them")
    temperature = 0.0 if greedy else 1.0 if temperature is None else temperature
    if not math.isfinite(temperature) or temperature < 0 or (max_temperature is not None and temperature > max_temperature):
        bound = f"within [0, {max_temperature:g}]" if max_temperature is not None else ">= 0"
        raise SamplingError(f"temperature must be {bound} (0 is greedy), got {temperature}")
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise SamplingError(f"top_p must be within (0, 1], got {top_p}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise SamplingError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    return temperature


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(f"sampling_args: {key} must be a number, got {value!r}")
    return float(value)


def _integer(key: str, value: Any, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingError(f"sampling_args: {key} must be an integer{' or null' if nullable else ''}, got {value!r}")
    return value


def sampling_kwargs(
    policy: str,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    greedy: bool = False,
    sampling_args: Mapping[str, Any] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The constructor keyword arguments of the model-backed `policy` (``"openai"`` or
    ``"transformers"``) for these settings. Unset (None) ones are left out, so the policy's
    defaults apply.

    `sampling_args` is merged over the named settings: its ``temperature``, ``top_p``,
    ``max_tokens`` and ``seed`` (null: unseeded) replace theirs; every other key goes to the
    backend, as a request body field (``extra_body``) for ``"openai"`` and as a ``generate``
    argument (``generate_kwargs``, checked against what ``generate`` takes) for
    ``"transformers"``. ``greedy`` with a temperature above 0 is refused, as is any setting for
    a policy that does not decode: `SamplingError`, one line naming the setting."""
    if policy not in MODEL_POLICIES:
        raise SamplingError(f"policy {policy!r} does not decode: only {' and '.join(MODEL_POLICIES)} take sampling settings")
    args = dict(sampling_args or {})
    if "temperature" in args:
        temperature = _number("temperature", args.pop("temperature"))
    if "top_p" in args:
        top_p = _number("top_p", args.pop("top_p"))
    if "max_tokens" in args:
        max_tokens = _integer("max_tokens", args.pop("max_tokens"))
    seeded = "seed" in args
    if seeded:
        seed = _integer("seed", args.pop("seed"), nullable=True)
    if greedy and temperature:
        check_sampling(temperature=temperature, top_p=1.0, max_tokens=1, greedy=True)
    kwargs: dict[str, Any] = {
        key: value
        for key, value in (("temperature", temperature), ("top_p", top_p), ("max_tokens", max_tokens), ("seed", seed))
        if value is not None or (key == "seed" and seeded)
    }
    if greedy:
        kwargs["greedy"] = True
    if chat_template_kwargs:
        kwargs["chat_template_kwargs"] = dict(chat_template_kwargs)
    if args:
        kwargs["extra_body" if policy == "openai" else "generate_kwargs"] = args
    return kwargs


def settings_text(settings: Mapping[str, Any]) -> str:
    """``temperature=0 (greedy), top_p=1, max_tokens=64, seed=none, …``: a policy's effective
    decoding settings on one line, in the order given."""
    parts = []
    for key, value in settings.items():
        if key == "greedy":
            continue
        if key == "temperature" and settings.get("greedy"):
            parts.append(f"temperature={value:g} (greedy)")
        elif isinstance(value, (dict, list)):
            parts.append(f"{key}={json.dumps(value, sort_keys=True)}")
        elif isinstance(value, float):
            parts.append(f"{key}={value:g}")
        else:
            parts.append(f"{key}={'none' if value is None else value}")
    return ", ".join(parts)
