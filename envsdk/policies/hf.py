"""A policy that generates in-process with transformers: for CPU runs, tests and small models.

On GPU machines prefer ``vllm serve`` with `OpenAIChatPolicy`: it batches concurrent requests,
this policy generates one reply at a time. Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any, Literal

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "TransformersPolicy needs torch and transformers: pip install torch transformers"
        " (or envsdk[train])"
    ) from exc

from envsdk.policies.base import FinishReason, Message, Policy, PolicyError, PolicyOutput

__all__ = ["TransformersPolicy"]

Device = Literal["cpu", "cuda", "auto"]


class TransformersPolicy(Policy):
    """Loads a causal LM and its tokenizer from a local directory (or an already downloaded
    hub id) and answers with ``generate`` on the chat-templated conversation.

    Loading happens in the constructor. `device` ``"auto"`` means CUDA when available, else
    CPU. One generation runs at a time (a lock), in a worker thread, so concurrent callers
    queue instead of blocking the event loop. With `do_sample`, `temperature` applies; with
    `seed`, the n-th call of this policy draws from ``seed + n`` without touching the
    process-wide torch generator, so a run is reproducible.

    ``finish_reason`` is ``"length"`` when `max_new_tokens` tokens were produced without an
    end-of-sequence token, ``"stop"`` otherwise. The tokenizer must have a chat template.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: Device | str = "cpu",
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        do_sample: bool = True,
        seed: int | None = None,
        dtype: str | torch.dtype = "auto",
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.do_sample = do_sample
        self.seed = seed
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        if self.tokenizer.chat_template is None:
            raise PolicyError(
                f"the tokenizer in {model_path} has no chat template; TransformersPolicy needs one"
            )
        # transformers' stubs type these calls loosely; the model is used through its duck type.
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
        model.to(self.device)
        model.eval()
        self.model: Any | None = model
        self._eos_ids = _eos_ids(model.generation_config.eos_token_id, self.tokenizer.eos_token_id)
        self._pad_id: int | None = self.tokenizer.pad_token_id
        if self._pad_id is None and self._eos_ids:
            # Without a pad id generate() warns on every call and pads with the EOS id anyway.
            self._pad_id = self._eos_ids[0]
        self._lock = threading.Lock()
        self._calls = 0

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        return await asyncio.to_thread(self._generate, messages)

    def _generate(self, messages: list[Message]) -> PolicyOutput:
        model = self.model
        if model is None:
            raise PolicyError("this TransformersPolicy is closed; build a new one")
        encoded: Any = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        inputs = encoded.to(self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "pad_token_id": self._pad_id,
        }
        if self._eos_ids:
            kwargs["eos_token_id"] = self._eos_ids
        if self.do_sample:
            kwargs["temperature"] = self.temperature
        with self._lock:
            call = self._calls
            self._calls += 1
            # Seeded: sample in a forked generator so the caller's global torch RNG is untouched.
            # Unseeded: use the global one as is (forking would replay the same draws each call).
            rng: contextlib.AbstractContextManager[Any] = (
                torch.random.fork_rng(devices=self._rng_devices())
                if self.seed is not None
                else contextlib.nullcontext()
            )
            with torch.inference_mode(), rng:
                if self.seed is not None:
                    torch.manual_seed(self.seed + call)
                output = model.generate(**inputs, **kwargs)
        prompt_len = int(inputs["input_ids"].shape[1])
        new_tokens = output[0, prompt_len:].tolist()
        hit_eos = bool(new_tokens) and new_tokens[-1] in self._eos_ids
        finish: FinishReason = "length" if len(new_tokens) >= self.max_new_tokens and not hit_eos else "stop"
        return PolicyOutput(
            text=str(self.tokenizer.decode(new_tokens, skip_special_tokens=True)),
            finish_reason=finish,
            prompt_tokens=prompt_len,
            completion_tokens=len(new_tokens),
        )

    def _rng_devices(self) -> list[int]:
        # fork_rng saves and restores the CUDA generators of the listed devices; on CPU, none.
        if self.device.type == "cuda":
            return [self.device.index if self.device.index is not None else torch.cuda.current_device()]
        return []

    async def aclose(self) -> None:
        """Drop the model (later calls raise `PolicyError`); its weights are freed once no
        other reference holds them."""
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _eos_ids(*candidates: int | list[int] | None) -> list[int]:
    ids: list[int] = []
    for value in candidates:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids
