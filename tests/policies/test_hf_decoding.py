"""TransformersPolicy's decoding settings, chat template arguments and native tool calls, on
the tiny model with real generation on CPU.

Where a test needs the random model to write a given reply (a tool call, a reasoning block), it
asks ``generate`` for it with ``sequence_bias`` (a generation-config setting the policy passes
through): each prefix of the reply gets a bias larger than the one before, so greedy decoding
writes the reply and then ends its turn.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers", reason="needs transformers (envsdk[train])")
torch = pytest.importorskip("torch", reason="needs torch (envsdk[train])")

from envsdk.policies import SamplingError, make_policy  # noqa: E402
from envsdk.policies.hf import DEFAULT_MAX_TOKENS, TransformersPolicy, parse_tool_calls  # noqa: E402
from envsdk.tiny_model import CHAT_TEMPLATE, IM_END  # noqa: E402

pytestmark = pytest.mark.timeout(120)

MESSAGES = [
    {"role": "system", "content": "You play FrozenLake."},
    {"role": "user", "content": "P F H\nF F F\nH F G\nWhat is your move?"},
]
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "balance", "description": "the balance", "parameters": {
        "type": "object", "properties": {}}}},
]


def forcing(policy: TransformersPolicy, reply: str) -> list[list[Any]]:
    """``sequence_bias`` that makes greedy decoding write `reply`, then end the turn."""
    ids = policy.tokenizer(reply, add_special_tokens=False)["input_ids"] + [policy.tokenizer.convert_tokens_to_ids(IM_END)]
    return [[ids[: k + 1], 100.0 * (k + 1)] for k in range(len(ids))]


def with_template(model_dir: Path, target: Path, template: str) -> Path:
    """A copy of `model_dir` whose tokenizer has `template` as its chat template."""
    shutil.copytree(model_dir, target)
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(target)
    return target


def decoded_prompt(policy: TransformersPolicy, out: Any) -> str:
    assert out.prompt_ids is not None, "token_exact gives the prompt's ids"
    return str(policy.tokenizer.decode(out.prompt_ids))


# ---------------------------------------------------------------- decoding settings


async def test_greedy_decoding_is_deterministic_and_the_same_as_temperature_zero(tiny_model_dir: Path) -> None:
    greedy = TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=12)
    zero = make_policy("transformers", "frozen_lake", model_path=tiny_model_dir, temperature=0, max_tokens=12)
    replies = [await greedy.act(MESSAGES) for _ in range(2)] + [await zero.act(MESSAGES)]
    assert len(set(replies)) == 1 and replies[0]
    assert greedy.sampling_settings["greedy"] is True and greedy.sampling_settings["temperature"] == 0
    # Sampling from the same model (unseeded, T=1) does not keep to the one reply.
    sampled = TransformersPolicy(tiny_model_dir, max_tokens=12)
    assert {await sampled.act(MESSAGES) for _ in range(3)} != {replies[0]}


async def test_top_p_reaches_generate(tiny_model_dir: Path) -> None:
    greedy = await TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=10).act(MESSAGES)
    # Nucleus sampling that keeps only the most likely token is greedy decoding, at any temperature.
    narrow = TransformersPolicy(tiny_model_dir, temperature=1.5, top_p=1e-6, seed=3, max_tokens=10)
    assert [await narrow.act(MESSAGES) for _ in range(2)] == [greedy, greedy]
    wide = TransformersPolicy(tiny_model_dir, temperature=1.5, top_p=1.0, seed=3, max_tokens=10)
    assert await wide.act(MESSAGES) != greedy


async def test_max_tokens_is_the_reply_limit_and_the_default_is_not_hidden(tiny_model_dir: Path) -> None:
    policy = make_policy("transformers", "frozen_lake", model_path=tiny_model_dir, greedy=True, max_tokens=3)
    out = await policy.act_ex(MESSAGES)
    assert out.completion_tokens == 3 and out.finish_reason == "length"
    assert policy.sampling_settings["max_tokens"] == 3
    default = TransformersPolicy(tiny_model_dir, greedy=True)
    assert default.max_new_tokens == DEFAULT_MAX_TOKENS == 512
    assert default.sampling_settings["max_tokens"] == 512


def test_sampling_args_and_generate_kwargs_are_checked_before_the_model_loads(tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    with pytest.raises(SamplingError, match="did you mean 'repetition_penalty'"):
        make_policy("transformers", "x", model_path=missing, sampling_args={"presence_penalty": 0.5})
    with pytest.raises(SamplingError, match="max_new_tokens is set by the transformers policy: give max_tokens"):
        TransformersPolicy(missing, generate_kwargs={"max_new_tokens": 5})
    with pytest.raises(SamplingError, match="greedy decoding is temperature 0"):
        TransformersPolicy(missing, greedy=True, temperature=0.8)
    with pytest.raises(SamplingError, match="top_p"):
        TransformersPolicy(missing, top_p=0)
    with pytest.raises(SamplingError, match="name one limit"):
        TransformersPolicy(missing, max_tokens=4, max_new_tokens=5)


async def test_sampling_args_pass_generate_arguments_through(tiny_model_dir: Path) -> None:
    plain = TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=6, token_exact=True)
    first = (await plain.act_ex(MESSAGES)).completion_ids
    assert first
    policy = make_policy(
        "transformers", "x", model_path=tiny_model_dir, greedy=True, max_tokens=40, token_exact=True,
        sampling_args={"max_tokens": 6, "suppress_tokens": [first[0]]},
    )
    assert policy.sampling_settings["max_tokens"] == 6 and policy.generate_kwargs == {"suppress_tokens": [first[0]]}
    out = await policy.act_ex(MESSAGES)
    assert out.completion_tokens == 6
    # The token greedy decoding wrote first is suppressed: generate() was given the argument.
    assert out.completion_ids is not None and first[0] not in out.completion_ids


# ---------------------------------------------------------------- chat template arguments

THINKING_TEMPLATE = CHAT_TEMPLATE + (
    "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
)


async def test_chat_template_kwargs_reach_the_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = with_template(tiny_model_dir, tmp_path / "thinking", THINKING_TEMPLATE)
    off = TransformersPolicy(
        model_dir, greedy=True, max_tokens=2, token_exact=True, chat_template_kwargs={"enable_thinking": False}
    )
    on = TransformersPolicy(model_dir, greedy=True, max_tokens=2, token_exact=True)
    prompt_off = decoded_prompt(off, await off.act_ex(MESSAGES))
    prompt_on = decoded_prompt(on, await on.act_ex(MESSAGES))
    assert prompt_off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), prompt_off[-80:]
    assert prompt_on.endswith("<|im_start|>assistant\n")
    # Not token-exact: the same template arguments, so the same prompt length.
    plain = TransformersPolicy(model_dir, greedy=True, max_tokens=2, chat_template_kwargs={"enable_thinking": False})
    assert (await plain.act_ex(MESSAGES)).prompt_tokens == len(off.tokenizer(prompt_off, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------- native tools


async def test_tools_are_rendered_by_the_chat_template(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=2, token_exact=True)
    assert policy.supports_tools
    with_tools = decoded_prompt(policy, await policy.act_ex(MESSAGES, tools=TOOLS))
    assert "<tools>" in with_tools and json.dumps(TOOLS[0]) in with_tools
    assert "You play FrozenLake." in with_tools
    without = decoded_prompt(policy, await policy.act_ex(MESSAGES))
    assert "<tools>" not in without


# A template that, like Llama 3.1's, writes the arguments with `tojson`: it needs them as an object.
OBJECT_ARGUMENTS_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- set arguments = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson %}",
    "{%- set arguments = fn['arguments'] | tojson %}",
)


async def test_tool_turns_render_through_the_template_with_object_arguments(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert OBJECT_ARGUMENTS_TEMPLATE != CHAT_TEMPLATE
    model_dir = with_template(tiny_model_dir, tmp_path / "objects", OBJECT_ARGUMENTS_TEMPLATE)
    policy = TransformersPolicy(model_dir, greedy=True, max_tokens=2, token_exact=True)
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": "", "reasoning_content": "Add first.", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_0", "content": "5"},
    ]
    snapshot = json.dumps(conversation)
    prompt = decoded_prompt(policy, await policy.act_ex(conversation, tools=TOOLS))
    assert json.dumps(conversation) == snapshot, "the caller's messages were modified"
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in prompt, prompt
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in prompt


async def test_several_tool_calls_the_model_writes_are_read_and_reasoning_kept_apart(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=200)
    reply = (
        '<think>Maybe <tool_call>{"name": "balance", "arguments": {}}</tool_call>? No.</think>'
        'Adding.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
        '<tool_call>{"name": "balance", "arguments": {}}</tool_call>'
    )
    policy.generate_kwargs = {"sequence_bias": forcing(policy, reply)}
    out = await policy.act_ex(MESSAGES, tools=TOOLS)
    assert out.finish_reason == "stop", out
    assert out.reasoning == 'Maybe <tool_call>{"name": "balance", "arguments": {}}</tool_call>? No.'
    assert out.text == "Adding."
    assert out.tool_calls == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_1", "type": "function", "function": {"name": "balance", "arguments": "{}"}},
    ]
    # Without tools the same reply is text: no calls are read.
    plain = await policy.act_ex(MESSAGES)
    assert plain.tool_calls is None and "<tool_call>" in plain.text


def test_parse_tool_calls_reads_hermes_blocks_and_leaves_a_malformed_reply_as_text() -> None:
    calls, rest = parse_tool_calls('a<tool_call>\n{"name": "f", "parameters": {"x": "é"}}\n</tool_call>b')
    assert calls == [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"x": "é"}'}}]
    assert rest == "ab"
    assert parse_tool_calls("no calls") == (None, "no calls")
    for broken in ('<tool_call>{"name": "f"</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                   '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>[1]</tool_call>'):
        assert parse_tool_calls(broken) == (None, broken)


async def test_token_exact_continues_the_models_tokens_after_a_tool_call_turn(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, greedy=True, max_tokens=120, token_exact=True)
    policy.generate_kwargs = {"sequence_bias": forcing(policy, '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>')}
    first = await policy.act_ex(MESSAGES, tools=TOOLS)
    assert first.tool_calls is not None and first.prompt_ids is not None and first.completion_ids is not None
    # The conversation as a scheduler continues it: the reply as it appends it, then the tool's result.
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": first.text, "tool_calls": first.tool_calls},
        {"role": "tool", "tool_call_id": first.tool_calls[0]["id"], "content": "2"},
    ]
    policy.generate_kwargs = {}
    policy.max_new_tokens = 2
    second = await policy.act_ex(conversation, tools=TOOLS)
    assert second.prompt_ids is not None
    so_far = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(so_far)] == so_far, "the second turn re-tokenised the first reply"
    added = policy.tokenizer.decode(second.prompt_ids[len(so_far):])
    assert added == "\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n", added
