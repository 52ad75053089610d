"""Policies: how the next action (assistant reply) is produced.

* scripted, no model: `RandomPolicy`, `NoopPolicy` (the do-nothing agent), `SudokuOraclePolicy`,
  `FrozenLakeOraclePolicy`, `HarborOraclePolicy` (a Harbor task's ``solution/solve.sh``);
* `OpenAIChatPolicy`: any OpenAI-compatible server (``vllm serve``, ``transformers serve``);
  needs the ``openai`` extra;
* `TransformersPolicy`: in-process transformers generation; needs torch and transformers.

The model-backed classes are imported on first use, so ``import envsdk.policies`` works on the
base install. `make_policy` builds any of them by name. Both model-backed policies take the same
decoding settings (`envsdk.policies.sampling`): ``temperature``, ``top_p``, ``max_tokens``,
``seed``, ``greedy``, ``chat_template_kwargs`` and a vf-eval-style ``sampling_args`` object.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envsdk.policies.base import (
    FinishReason,
    Message,
    ObservationParseError,
    Policy,
    PolicyError,
    PolicyOutput,
    message_text,
)
from envsdk.policies.harbor import HarborOraclePolicy
from envsdk.policies.sampling import SamplingError, sampling_kwargs
from envsdk.policies.scripted import (
    FrozenLakeOraclePolicy,
    NoopPolicy,
    RandomPolicy,
    SudokuOraclePolicy,
    canonical_env_name,
)

if TYPE_CHECKING:
    from envsdk.policies.hf import TransformersPolicy
    from envsdk.policies.openai_chat import (
        InferenceConnectionError,
        InferenceError,
        InferenceResponseError,
        InferenceServerError,
        InferenceToolCallError,
        OpenAIChatPolicy,
    )

__all__ = [
    "FinishReason",
    "Message",
    "Policy",
    "PolicyOutput",
    "PolicyError",
    "ObservationParseError",
    "message_text",
    "RandomPolicy",
    "NoopPolicy",
    "SudokuOraclePolicy",
    "FrozenLakeOraclePolicy",
    "HarborOraclePolicy",
    "OpenAIChatPolicy",
    "InferenceError",
    "InferenceServerError",
    "InferenceConnectionError",
    "InferenceResponseError",
    "InferenceToolCallError",
    "TransformersPolicy",
    "SamplingError",
    "sampling_kwargs",
    "POLICY_NAMES",
    "make_policy",
]

_LAZY = {
    "OpenAIChatPolicy": "envsdk.policies.openai_chat",
    "InferenceError": "envsdk.policies.openai_chat",
    "InferenceServerError": "envsdk.policies.openai_chat",
    "InferenceConnectionError": "envsdk.policies.openai_chat",
    "InferenceResponseError": "envsdk.policies.openai_chat",
    "InferenceToolCallError": "envsdk.policies.openai_chat",
    "TransformersPolicy": "envsdk.policies.hf",
}

#: The names `make_policy` accepts.
POLICY_NAMES = ("auto", "oracle", "random", "openai", "transformers", "noop")
# `make_policy`'s decoding keywords, read by `sampling_kwargs` for the model-backed policies.
_DECODING = ("temperature", "top_p", "max_tokens", "seed", "greedy", "sampling_args", "chat_template_kwargs")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def make_policy(name: str, env_name: str, **kwargs: Any) -> Policy:
    """Build a policy by name.

    * ``"oracle"``: the solver for `env_name` (``sudoku``, ``frozen_lake``, ``coding`` or
      ``harbor``, any usual spelling such as ``Sudoku-v0``); `kwargs` go to its constructor
      (Harbor's: ``tasks``, the tasks whose solutions it plays);
    * ``"random"``: `RandomPolicy(env_name, **kwargs)` (e.g. ``seed=3``); any env;
    * ``"noop"``: `NoopPolicy()`, the do-nothing agent; any env;
    * ``"auto"``: the oracle when one knows `env_name` (Harbor's when given ``tasks``), else
      ``"random"`` (works for any env);
    * ``"openai"``: `OpenAIChatPolicy(**kwargs)` (``base_url``, ``model``, …);
    * ``"transformers"``: `TransformersPolicy(**kwargs)` (``model_path``, …).

    For the two model-backed policies the decoding keywords (``temperature``, ``top_p``,
    ``max_tokens``, ``seed``, ``greedy``, ``chat_template_kwargs``, and ``sampling_args``, a
    JSON-like object merged over them whose other keys go to the backend) are read by
    `sampling_kwargs`; a scripted policy given one of them (but a random policy's ``seed``) is
    refused with `SamplingError`. `env_name` is ignored by the model-backed policies. Raises
    `ValueError` for an unknown policy name or, for ``"oracle"``, an environment no oracle knows.
    """
    if name in ("openai", "transformers"):
        decoding = {key: kwargs.pop(key) for key in _DECODING if key in kwargs}
        for key, value in sampling_kwargs(name, **decoding).items():
            given = kwargs.get(key)
            # A backend's own fields given both ways: those of `sampling_args` win.
            kwargs[key] = {**given, **value} if isinstance(given, dict) and isinstance(value, dict) else value
    else:
        # A random policy's own `seed` seeds its replies.
        refused = next((key for key in _DECODING if key in kwargs and key != "seed"), None)
        if refused is not None:
            raise SamplingError(f"policy {name!r} does not decode: {refused} is read only by the openai and transformers policies")
    if name == "auto":
        try:
            known = canonical_env_name(env_name)
        except ValueError:
            known = None
        if known is None or (known == "harbor" and kwargs.get("tasks") is None):
            kwargs.pop("tasks", None)
            return RandomPolicy(env_name, **kwargs)
        return make_policy("oracle", env_name, **kwargs)
    if name == "oracle":
        env = canonical_env_name(env_name)
        if env == "harbor":
            if kwargs.get("tasks") is None:
                raise ValueError("the Harbor oracle plays each task's solution/solve.sh: give it the tasks (tasks=...)")
            return HarborOraclePolicy(**kwargs)
        if env == "sudoku":
            return SudokuOraclePolicy(**kwargs)
        if env == "coding":
            from envsdk.policies.coding import CodingOraclePolicy

            return CodingOraclePolicy(**kwargs)
        return FrozenLakeOraclePolicy(**kwargs)
    if name == "random":
        return RandomPolicy(env_name, **kwargs)
    if name == "noop":
        return NoopPolicy(**kwargs)
    if name == "openai":
        from envsdk.policies.openai_chat import OpenAIChatPolicy

        return OpenAIChatPolicy(**kwargs)
    if name == "transformers":
        from envsdk.policies.hf import TransformersPolicy

        return TransformersPolicy(**kwargs)
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
