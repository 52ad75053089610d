"""OpenAIChatPolicy with reasoning models and native tools, against a real HTTP server on
loopback (`ScriptedChatServer`) that answers what vLLM answers with ``--reasoning-parser`` and
``--enable-auto-tool-choice``: the reasoning apart from the reply, several tool calls in one reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from envsdk.policies import InferenceToolCallError, SamplingError, make_policy
from envsdk.policies.openai_chat import InferenceResponseError, OpenAIChatPolicy
from tests.policies.conftest import ScriptedChatServer

pytestmark = pytest.mark.timeout(60)

MESSAGES = [
    {"role": "system", "content": "You play Sudoku."},
    {"role": "user", "content": "R1  4  8  . |  9  5  7 |  2  .  1\nYour move?"},
]
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "balance", "description": "the balance", "parameters": {
        "type": "object", "properties": {}}}},
]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_returned_apart_from_the_reply_is_read(chat_server: ScriptedChatServer, field: str) -> None:
    chat_server.replies = [{"content": "[1 5 9]", field: "Could [1 5 4] work? No, 4 is in the row."}]
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        out = await policy.act_ex(MESSAGES)
    assert out.text == "[1 5 9]"
    assert out.reasoning == "Could [1 5 4] work? No, 4 is in the row."
    assert out.tool_calls is None


async def test_a_reply_without_a_reasoning_field_leaves_reasoning_to_the_scheduler(chat_server: ScriptedChatServer) -> None:
    chat_server.replies = [{"content": "<think>hmm</think>[1 5 9]"}]
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        out = await policy.act_ex(MESSAGES)
    # No parser on the server: the block stays in the text, for `split_reasoning` to take apart.
    assert out.reasoning is None and out.text == "<think>hmm</think>[1 5 9]"


async def test_chat_template_kwargs_are_sent_with_every_request(chat_server: ScriptedChatServer) -> None:
    async with OpenAIChatPolicy(chat_server.base_url, "m", chat_template_kwargs={"enable_thinking": False}) as policy:
        await policy.act(MESSAGES)
        await policy.act(MESSAGES)
    assert [body["chat_template_kwargs"] for body in chat_server.bodies] == [{"enable_thinking": False}] * 2
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        await policy.act(MESSAGES)
    assert "chat_template_kwargs" not in chat_server.bodies[-1]


async def test_tools_are_sent_and_several_tool_calls_are_read(chat_server: ScriptedChatServer) -> None:
    chat_server.replies = [{
        "content": None,
        "reasoning_content": "I need both.",
        "tool_calls": [
            {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "balance", "arguments": "{}"}},
        ],
    }]
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        assert policy.supports_tools
        out = await policy.act_ex(MESSAGES, tools=TOOLS)
    body = chat_server.bodies[-1]
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto"
    assert out.text == "" and out.reasoning == "I need both." and out.finish_reason == "stop"
    assert out.tool_calls == [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "balance", "arguments": "{}"}},
    ]


async def test_no_tools_are_sent_when_none_are_given(chat_server: ScriptedChatServer) -> None:
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        await policy.act_ex(MESSAGES)
        await policy.act_ex(MESSAGES, tools=[])
    assert all("tools" not in body and "tool_choice" not in body for body in chat_server.bodies)


async def test_calls_without_ids_or_with_object_arguments_are_put_in_openai_form(chat_server: ScriptedChatServer) -> None:
    chat_server.replies = [{"content": "", "tool_calls": [
        {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
        {"id": "call_0", "function": {"name": "balance", "arguments": "{}"}},
        {"id": "", "function": {"name": "balance", "arguments": "{not json"}},
    ]}]
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        out = await policy.act_ex(MESSAGES, tools=TOOLS)
    assert out.tool_calls is not None
    ids = [call["id"] for call in out.tool_calls]
    assert len(set(ids)) == 3 and "call_0" in ids, ids
    assert all(call["type"] == "function" for call in out.tool_calls)
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    # Arguments that are not JSON are the model's mistake: passed on for the environment to judge.
    assert out.tool_calls[2]["function"]["arguments"] == "{not json"


@pytest.mark.parametrize(
    ("tool_calls", "needle"),
    [
        ("add(1, 2)", "expected a list of calls"),
        ([{"id": "c1", "type": "function"}], "call 0 has no function object"),
        ([{"id": "c1", "function": {"name": "add", "arguments": "{}"}}, {"id": "c2", "function": {"arguments": "{}"}}],
         "call 1 names no function"),
        ([{"id": "c1", "function": {"name": "add", "arguments": 12}}], "neither JSON text nor an object"),
        ([{"id": "c1", "type": "custom", "custom": {"name": "add", "input": "x"}}], "call 0 has no function object"),
        ([{"id": "c1", "type": "custom", "function": {"name": "add", "arguments": "{}"}}], "not a function call"),
    ],
)
async def test_malformed_tool_calls_are_a_typed_error(
    chat_server: ScriptedChatServer, tool_calls: Any, needle: str
) -> None:
    chat_server.replies = [{"content": None, "tool_calls": tool_calls}]
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        with pytest.raises(InferenceToolCallError, match="malformed tool_calls") as caught:
            await policy.act_ex(MESSAGES, tools=TOOLS)
    assert needle in str(caught.value)
    assert isinstance(caught.value, InferenceResponseError)
    assert "\n" not in str(caught.value)


async def test_the_conversation_is_sent_as_openais_api_takes_it(chat_server: ScriptedChatServer) -> None:
    conversation: list[dict[str, Any]] = [
        *MESSAGES,
        # As a scheduler appends a reply: reasoning kept beside it, calls with JSON-text or object arguments.
        {"role": "assistant", "content": "", "reasoning_content": "Add first.", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "call_1", "function": {"name": "balance", "arguments": {}}},
        ]},
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"},
        {"role": "tool", "tool_call_id": "call_1", "content": "100"},
        {"role": "assistant", "content": "[1 5 9]", "reasoning_content": "Done.", "tool_calls": []},
        {"role": "user", "content": "Next?", "loss": False},
    ]
    snapshot = json.dumps(conversation)
    async with OpenAIChatPolicy(chat_server.base_url, "m") as policy:
        await policy.act_ex(conversation, tools=TOOLS)
    assert json.dumps(conversation) == snapshot, "the caller's messages were modified"
    sent = chat_server.bodies[-1]["messages"]
    assert sent[:2] == MESSAGES
    assert sent[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_1", "type": "function", "function": {"name": "balance", "arguments": "{}"}},
    ]}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    assert sent[4] == {"role": "tool", "tool_call_id": "call_1", "content": "100"}
    assert sent[5] == {"role": "assistant", "content": "[1 5 9]"}
    assert sent[6] == {"role": "user", "content": "Next?"}


async def test_a_seed_counts_up_per_request_so_repeated_prompts_differ(chat_server: ScriptedChatServer) -> None:
    async with OpenAIChatPolicy(chat_server.base_url, "m", seed=5) as policy:
        for _ in range(3):
            await policy.act(MESSAGES)
    assert [body["seed"] for body in chat_server.bodies] == [5, 6, 7]


async def test_greedy_sends_temperature_zero_and_refuses_a_sampling_temperature(chat_server: ScriptedChatServer) -> None:
    async with OpenAIChatPolicy(chat_server.base_url, "m", greedy=True) as policy:
        await policy.act(MESSAGES)
        assert policy.sampling_settings["greedy"] is True
    assert chat_server.bodies[-1]["temperature"] == 0
    with pytest.raises(SamplingError, match="greedy decoding is temperature 0"):
        OpenAIChatPolicy(chat_server.base_url, "m", greedy=True, temperature=0.7)


async def test_sampling_args_merge_over_the_named_settings_and_pass_the_rest_through(chat_server: ScriptedChatServer) -> None:
    policy = make_policy(
        "openai", "sudoku", base_url=chat_server.base_url, model="m", temperature=0.3, max_tokens=7,
        sampling_args={"max_tokens": 9, "seed": 4, "top_k": 20, "min_p": 0.1}, chat_template_kwargs={"enable_thinking": False},
    )
    async with policy:
        await policy.act(MESSAGES)
    body = chat_server.bodies[-1]
    assert (body["temperature"], body["max_tokens"], body["seed"], body["top_k"], body["min_p"]) == (0.3, 9, 4, 20, 0.1)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"sampling_args": {"temperature": "hot"}}, "temperature must be a number"),
        ({"sampling_args": {"max_tokens": 1.5}}, "max_tokens must be an integer"),
        ({"sampling_args": {"stream": True}}, "stream"),
        ({"sampling_args": {"n": 4}}, "one choice per request"),
        ({"sampling_args": {"temperature": 0.5}, "greedy": True}, "greedy decoding is temperature 0"),
    ],
)
def test_bad_sampling_args_are_refused_naming_the_key(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(SamplingError, match=needle):
        make_policy("openai", "sudoku", base_url="http://127.0.0.1:9", model="m", **kwargs)


@pytest.mark.parametrize("key", ["temperature", "greedy", "sampling_args", "chat_template_kwargs"])
def test_scripted_policies_refuse_decoding_settings(key: str) -> None:
    value: Any = {"temperature": 0.5, "greedy": True, "sampling_args": {"top_k": 2}, "chat_template_kwargs": {"x": 1}}[key]
    with pytest.raises(SamplingError, match=f"does not decode: {key}"):
        make_policy("random", "sudoku", **{key: value})
