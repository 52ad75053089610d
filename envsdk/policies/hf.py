"""A policy that generates in-process with transformers: for CPU runs, tests and small models.

On GPU machines prefer ``vllm serve`` with `OpenAIChatPolicy`: it batches concurrent requests,
this policy generates one reply at a time. Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "TransformersPolicy needs torch and transformers: pip install torch transformers"
        " (or pip install -e '.[train]' in the envsdk clone)"
    ) from exc

from envsdk.policies.base import FinishReason, Message, Policy, PolicyError, PolicyOutput
from envsdk.policies.chat_tokens import chat_ids, continuation_ids

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

    With `token_exact` (``envsdk rollout --tokens``), each reply also gives its context and
    completion ids and per-token logprobs (of the distribution sampled from, after temperature),
    and a conversation that continues one of this policy's replies is continued from that
    reply's own tokens plus the ids of the messages added since (`continuation_ids`), never
    from a re-tokenised transcript. At most `max_contexts` such conversations are remembered.
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
        token_exact: bool = False,
        max_contexts: int = 4096,
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
        self.token_exact = token_exact
        self.max_contexts = max_contexts
        # A finished reply's conversation (as JSON) -> the ids the model had seen and generated.
        self._contexts: OrderedDict[str, list[int]] = OrderedDict()

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message]) -> PolicyOutput:
        return await asyncio.to_thread(self._generate, messages)

    def _generate(self, messages: list[Message]) -> PolicyOutput:
        model = self.model
        if model is None:
            raise PolicyError("this TransformersPolicy is closed; build a new one")
        if self.token_exact:
            context = self._context_ids(messages)
            ids_tensor = torch.tensor([context], dtype=torch.long)
            inputs: Any = {"input_ids": ids_tensor.to(self.device), "attention_mask": torch.ones_like(ids_tensor).to(self.device)}
        else:
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
        if self.token_exact:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
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
                logprobs: list[float] | None = None
                if self.token_exact:
                    scores = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True)
                    output = output.sequences
                    logprobs = [float(x) for x in scores[0].tolist()]
        prompt_len = int(inputs["input_ids"].shape[1])
        new_tokens = output[0, prompt_len:].tolist()
        hit_eos = bool(new_tokens) and new_tokens[-1] in self._eos_ids
        finish: FinishReason = "length" if len(new_tokens) >= self.max_new_tokens and not hit_eos else "stop"
        text = str(self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        if not self.token_exact:
            return PolicyOutput(text=text, finish_reason=finish, prompt_tokens=prompt_len, completion_tokens=len(new_tokens))
        prompt_ids = [int(i) for i in inputs["input_ids"][0].tolist()]
        self._remember([*messages, {"role": "assistant", "content": text}], prompt_ids + new_tokens)
        return PolicyOutput(
            text=text,
            finish_reason=finish,
            prompt_tokens=prompt_len,
            completion_tokens=len(new_tokens),
            prompt_ids=prompt_ids,
            completion_ids=[int(i) for i in new_tokens],
            logprobs=logprobs,
        )

    def _context_ids(self, messages: list[Message]) -> list[int]:
        """The ids to generate from: a remembered reply's ids plus what was added after it, or,
        for a conversation this policy did not answer before, the templated messages."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is not None:
            with self._lock:
                known = self._contexts.pop(_conversation_key(messages[: last + 1]), None)
            if known is not None:
                return known + continuation_ids(self.tokenizer, messages[last + 1 :], self._eos_ids)
        return chat_ids(self.tokenizer, messages, add_generation_prompt=True)

    def _remember(self, conversation: list[Message], ids: list[int]) -> None:
        with self._lock:
            self._contexts[_conversation_key(conversation)] = ids
            while len(self._contexts) > self.max_contexts:
                self._contexts.popitem(last=False)

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


def _conversation_key(messages: list[Message]) -> str:
    return json.dumps([{"role": m.get("role"), "content": m.get("content")} for m in messages], sort_keys=True, default=str)


def _eos_ids(*candidates: int | list[int] | None) -> list[int]:
    ids: list[int] = []
    for value in candidates:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids
