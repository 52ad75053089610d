"""A policy that generates in-process with transformers: for CPU runs, tests and small models.

On GPU machines prefer ``vllm serve`` with `OpenAIChatPolicy`: it batches concurrent requests,
this policy generates one reply at a time. Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import re
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
from envsdk.policies.sampling import SamplingError, check_sampling
from envsdk.reasoning import split_reasoning

__all__ = ["DEFAULT_MAX_TOKENS", "TransformersPolicy", "parse_tool_calls"]

Device = Literal["cpu", "cuda", "auto"]

#: The reply length limit when none is given (the same as `OpenAIChatPolicy`'s).
DEFAULT_MAX_TOKENS = 512

# `generate` arguments the policy sets itself, with what to give instead.
_OWN_GENERATE_KWARGS = {
    "max_new_tokens": "give max_tokens",
    "max_length": "give max_tokens (the reply's length, the prompt not counted)",
    "do_sample": "give greedy, or temperature 0, for greedy decoding",
    "temperature": "give temperature",
    "top_p": "give top_p",
    "num_return_sequences": "the policy gives one reply per call",
    "pad_token_id": "the policy sets it from the tokenizer",
    "eos_token_id": "the policy sets it from the model and tokenizer",
    "output_scores": "the policy asks for scores itself with token_exact",
    "return_dict_in_generate": "the policy sets it",
}
# OpenAI request fields a vf-eval user may carry over, with their transformers counterpart.
_OPENAI_NAMES = {
    "stop": "stop_strings",
    "frequency_penalty": "repetition_penalty",
    "presence_penalty": "repetition_penalty",
}
# A Hermes/Qwen tool call, as their chat templates ask the model to write it.
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class TransformersPolicy(Policy):
    """Loads a causal LM and its tokenizer from a local directory (or an already downloaded
    hub id) and answers with ``generate`` on the chat-templated conversation.

    Loading happens in the constructor. `device` ``"auto"`` means CUDA when available, else
    CPU. One generation runs at a time (a lock), in a worker thread, so concurrent callers
    queue instead of blocking the event loop.

    Decoding takes `OpenAIChatPolicy`'s settings (`envsdk.policies.sampling`): `temperature`
    (default 1; 0, `greedy`, or ``do_sample=False`` decode greedily), `top_p`, `max_tokens` (the
    reply's length limit, default 512; `max_new_tokens` is its transformers name) and `seed`:
    the n-th call of this policy draws from ``seed + n`` without touching the process-wide torch
    generator, so a run is reproducible. `generate_kwargs` are passed to ``generate`` as they
    are (``top_k``, ``min_p``, ``repetition_penalty``, ``stop_strings``, …); a name ``generate``
    does not take, or one the policy sets itself, is a `SamplingError` before the model loads.
    The generation config of the model supplies what is not given (a Qwen model's ``top_k``).
    `chat_template_kwargs` go to every ``apply_chat_template`` call (``{"enable_thinking":
    False}`` turns Qwen3's thinking off).

    ``finish_reason`` is ``"length"`` when the limit was reached without an end-of-sequence
    token, ``"stop"`` otherwise. The tokenizer must have a chat template.

    A reply's ``<think>…</think>`` block is returned as `PolicyOutput.reasoning`
    (`envsdk.reasoning.split_reasoning`), the rest as its text. Native tools (``act_ex(messages,
    tools=[...])``): the chat template renders them (``apply_chat_template(messages,
    tools=tools)``), and the reply's Hermes/Qwen ``<tool_call>{"name": …, "arguments":
    {…}}</tool_call>`` blocks (several allowed; not those inside the reasoning) become
    `PolicyOutput.tool_calls` in OpenAI's form, with ids ``call_0``, ``call_1``, … in the reply,
    and the text left around them its text (`parse_tool_calls`). Messages are rendered as the
    template expects them: an assistant's ``tool_calls`` with their ``arguments`` as an object
    (JSON text is parsed), ``tool`` messages and any ``reasoning_content`` as they are.

    With `token_exact` (``envsdk rollout --tokens``), each reply also gives its context and
    completion ids and per-token logprobs (of the distribution sampled from, after temperature),
    and a conversation that continues one of this policy's replies is continued from that
    reply's own tokens plus the ids of the messages added since (`continuation_ids`), never
    from a re-tokenised transcript. At most `max_contexts` such conversations are remembered.
    """

    supports_tools = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: Device | str = "cpu",
        max_tokens: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float = 1.0,
        do_sample: bool = True,
        greedy: bool = False,
        seed: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        generate_kwargs: dict[str, Any] | None = None,
        dtype: str | torch.dtype = "auto",
        token_exact: bool = False,
        max_contexts: int = 4096,
    ) -> None:
        if max_tokens is not None and max_new_tokens is not None and max_tokens != max_new_tokens:
            raise SamplingError(f"max_tokens={max_tokens} and max_new_tokens={max_new_tokens} name one limit: give one")
        limit = max_tokens if max_tokens is not None else max_new_tokens if max_new_tokens is not None else DEFAULT_MAX_TOKENS
        temperature = check_sampling(temperature=temperature, top_p=top_p, max_tokens=limit, greedy=greedy)
        self.generate_kwargs = _checked_generate_kwargs(generate_kwargs or {})
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.max_new_tokens = limit
        self.do_sample = do_sample and not greedy and temperature > 0
        self.temperature = temperature if self.do_sample else 0.0
        self.top_p = top_p
        self.seed = seed
        self.chat_template_kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
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

    @property
    def sampling_settings(self) -> dict[str, Any]:
        """The decoding settings of every call (`envsdk.policies.sampling.settings_text` prints
        them), the ``generate`` arguments last."""
        settings: dict[str, Any] = {
            "temperature": self.temperature, "greedy": not self.do_sample, "top_p": self.top_p,
            "max_tokens": self.max_new_tokens, "seed": self.seed,
        }
        if self.chat_template_kwargs:
            settings["chat_template_kwargs"] = self.chat_template_kwargs
        return {**settings, **self.generate_kwargs}

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        return await asyncio.to_thread(self._generate, messages, tools or None)

    def _template_kwargs(self, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {**self.chat_template_kwargs, "tools": tools} if tools else dict(self.chat_template_kwargs)

    def _generate(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        model = self.model
        if model is None:
            raise PolicyError("this TransformersPolicy is closed; build a new one")
        template_kwargs = self._template_kwargs(tools)
        if self.token_exact:
            context = self._context_ids(messages, template_kwargs)
            ids_tensor = torch.tensor([context], dtype=torch.long)
            inputs: Any = {"input_ids": ids_tensor.to(self.device), "attention_mask": torch.ones_like(ids_tensor).to(self.device)}
        else:
            encoded: Any = self.tokenizer.apply_chat_template(
                template_messages(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True,
                **template_kwargs,
            )
            inputs = encoded.to(self.device)
        kwargs: dict[str, Any] = {
            **self.generate_kwargs,
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "pad_token_id": self._pad_id,
        }
        if "stop_strings" in kwargs:
            kwargs["tokenizer"] = self.tokenizer  # generate() needs it to find the strings
        if self._eos_ids:
            kwargs["eos_token_id"] = self._eos_ids
        if self.do_sample:
            kwargs["temperature"] = self.temperature
            kwargs["top_p"] = self.top_p
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
        decoded = str(self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        reasoning, text = split_reasoning(decoded)
        calls = None
        if tools:
            calls, text = parse_tool_calls(text)
        if not self.token_exact:
            return PolicyOutput(
                text=text, finish_reason=finish, reasoning=reasoning, tool_calls=calls, prompt_tokens=prompt_len,
                completion_tokens=len(new_tokens),
            )
        prompt_ids = [int(i) for i in inputs["input_ids"][0].tolist()]
        # The assistant message as the scheduler appends it, so that the next turn finds these ids.
        reply: Message = {"role": "assistant", "content": text}
        if reasoning is not None:
            reply["reasoning_content"] = reasoning
        if calls:
            reply["tool_calls"] = calls
        self._remember([*messages, reply], prompt_ids + new_tokens)
        return PolicyOutput(
            text=text,
            finish_reason=finish,
            reasoning=reasoning,
            tool_calls=calls,
            prompt_tokens=prompt_len,
            completion_tokens=len(new_tokens),
            prompt_ids=prompt_ids,
            completion_ids=[int(i) for i in new_tokens],
            logprobs=logprobs,
        )

    def _context_ids(self, messages: list[Message], template_kwargs: dict[str, Any]) -> list[int]:
        """The ids to generate from: a remembered reply's ids plus what was added after it, or,
        for a conversation this policy did not answer before, the templated messages."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is not None:
            with self._lock:
                known = self._contexts.pop(_conversation_key(messages[: last + 1]), None)
            if known is not None:
                added = template_messages(messages[last + 1 :])
                return known + continuation_ids(self.tokenizer, added, self._eos_ids, **template_kwargs)
        return chat_ids(self.tokenizer, template_messages(messages), add_generation_prompt=True, **template_kwargs)

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
    fields = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id")
    return json.dumps([{key: m.get(key) for key in fields} for m in template_messages(messages)], sort_keys=True, default=str)


def template_messages(messages: list[Message]) -> list[Message]:
    """`messages` as chat templates take them: an assistant's ``tool_calls`` with their
    ``arguments`` as an object (OpenAI's JSON text parsed; text that is not a JSON object
    stays text). Other messages are passed as they are; nothing is modified in place."""
    rendered: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            rendered.append(message)
            continue
        rendered.append({**message, "tool_calls": [_template_call(call) for call in calls]})
    return rendered


def _template_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def parse_tool_calls(text: str) -> tuple[list[dict[str, Any]] | None, str]:
    """``(tool_calls, rest)`` of a reply that writes its calls as Hermes/Qwen templates ask,
    ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (several allowed): the calls in
    OpenAI's form with ids ``call_0``, ``call_1``, … and ``arguments`` as JSON text, and the
    text around them, stripped. As vLLM's Hermes parser does, a reply with a block that is not
    such a call (not JSON, no name) has no calls: ``(None, text)``, for the environment to
    judge as text."""
    blocks = list(_TOOL_CALL.finditer(text))
    if not blocks:
        return None, text
    calls: list[dict[str, Any]] = []
    for n, block in enumerate(blocks):
        try:
            payload = json.loads(block.group(1))
        except ValueError:
            return None, text
        name = payload.get("name") if isinstance(payload, dict) else None
        if not isinstance(name, str) or not name.strip():
            return None, text
        arguments = payload.get("arguments", payload.get("parameters", {}))
        arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append({"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": arguments_text}})
    return calls, _TOOL_CALL.sub("", text).strip()


def _checked_generate_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` when ``generate`` takes every one of them and the policy sets none of them
    itself; else `SamplingError` naming the first such key and what to give instead."""
    from transformers import GenerationConfig

    defaults = GenerationConfig()  # type: ignore[no-untyped-call]
    known = set(defaults.to_dict()) - {"transformers_version", "_from_model_config"}
    for key in kwargs:
        if key in _OWN_GENERATE_KWARGS:
            raise SamplingError(f"sampling_args: {key} is set by the transformers policy: {_OWN_GENERATE_KWARGS[key]}")
        if key not in known:
            hint = _OPENAI_NAMES.get(key) or next(iter(difflib.get_close_matches(key, sorted(known), n=1)), None)
            said = f"; did you mean {hint!r}?" if hint else ""
            raise SamplingError(
                f"sampling_args: transformers' generate() takes no {key!r}{said} (it takes temperature, top_p, "
                "max_tokens, seed and generation-config names such as top_k, min_p, repetition_penalty, stop_strings)"
            )
    return dict(kwargs)


def _eos_ids(*candidates: int | list[int] | None) -> list[int]:
    ids: list[int] = []
    for value in candidates:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids
