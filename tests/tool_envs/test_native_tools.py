"""`ToolScheduler` in its two forms: native (``tools=`` given to the policy, its ``tool_calls``
run in order, each result a ``tool`` message with its call's id) and text (tools in the system
message, ``<tool_call>`` blocks, results in ``<tool_response>`` blocks), on the ledger served
by envsdk; the calls are counted by the server."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from typing import Any

import httpx
import pytest

from envsdk.env import RolloutRequest
from envsdk.policies.base import Policy, PolicyOutput
from envsdk.schedulers.tools import ToolFormatError, ToolScheduler, parse_tool_calls
from envsdk.tools import ToolCall, chat_template_messages

from .openai_tool_server import ledger_plan, ledger_strategy

pytestmark = pytest.mark.timeout(60)


def _ledger(seed: int) -> tuple[int, int]:
    """The ledger's (start, target) for `seed`, drawn as its reset draws them."""
    rng = random.Random(seed)
    return rng.randint(0, 20) * 5, rng.randint(0, 20) * 5


def _seeds(want: str, n: int = 3) -> list[int]:
    """Seeds whose ledger starts below (``"up"``), above (``"down"``) or at its target."""
    def kind(seed: int) -> str:
        start, target = _ledger(seed)
        return "up" if target > start else "down" if target < start else "level"

    return [s for s in range(500) if kind(s) == want][:n]


def _tool_calls_served(url: str) -> int:
    found = re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{url}/metrics").text, re.MULTILINE)
    assert found
    return int(found.group(1))


class NativeLedgerPolicy(Policy):
    """The ledger strategy of the tests' OpenAI server, as a policy that takes ``tools=`` and
    answers with OpenAI-form ``tool_calls``; keeps the tools it was given each turn."""

    supports_tools = True

    def __init__(self) -> None:
        self.given: list[list[dict[str, Any]] | None] = []
        self._ids = itertools.count(1)

    async def act(self, messages: list[dict[str, Any]]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        self.given.append(tools)
        reply = ledger_strategy(tools or [], messages)
        calls = [
            {"id": f"call_{next(self._ids)}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for c in reply.get("tool_calls") or []
        ]
        return PolicyOutput(text=reply.get("content") or "", tool_calls=calls or None)


class TextLedgerPolicy(Policy):
    """The same plan written as ``<tool_call>`` blocks, all in the first reply."""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        if any(m["role"] == "assistant" for m in messages):
            return "Done."
        start, target = (int(n) for n in re.findall(r"\d+", messages[1]["content"])[:2])
        return "\n".join(
            f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
            for name, arguments in ledger_plan(start, target)
        )


class ReplyPolicy(Policy):
    """Answers with the given `PolicyOutput`s in turn, then plain text."""

    supports_tools = True

    def __init__(self, *outputs: PolicyOutput) -> None:
        self.outputs = list(outputs)

    async def act(self, messages: list[dict[str, Any]]) -> str:
        return "Done."

    async def act_ex(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        return self.outputs.pop(0) if self.outputs else PolicyOutput(text="Done.")


def _requests(seeds: list[int]) -> list[RolloutRequest]:
    return [RolloutRequest(data_dict={"env_config": {"seed": s}}) for s in seeds]


async def test_native_calls_run_in_order_and_each_result_is_a_tool_message_with_its_id(ledger_url: str) -> None:
    seeds = _seeds("up") + _seeds("down")
    policy = NativeLedgerPolicy()
    before = _tool_calls_served(ledger_url)
    done = await ToolScheduler(base_url=ledger_url, max_turns=4).run(_requests(seeds), policy)
    # The policy was given the ledger's tools as OpenAI tool definitions, with the server's schemas.
    tools = policy.given[0]
    assert tools is not None and {t["function"]["name"] for t in tools} == {"deposit", "withdraw", "balance"}
    deposit = next(t for t in tools if t["function"]["name"] == "deposit")
    assert deposit["type"] == "function" and deposit["function"]["description"].startswith("Add money to the ledger.")
    assert deposit["function"]["parameters"]["properties"]["amount"]["type"] == "integer"
    for trajectory, seed in zip(done, seeds):
        start, target = _ledger(seed)
        user, assistant, *results, closing = trajectory.messages
        # No tool is listed by hand: the prompt is the env's own text, the tools go through tools=.
        assert user == {"role": "user", "content": f"The ledger holds {start}. Bring it to exactly {target} with the deposit and withdraw tools."}
        calls = assistant["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            (name, arguments) for name, arguments in ledger_plan(start, target)
        ]
        assert len(calls) == 2  # several calls in one reply
        # One tool message per call, in the call order, naming its call's id; the tool's value as text.
        assert [(r["role"], r["tool_call_id"], r["name"]) for r in results] == [
            ("tool", c["id"], c["function"]["name"]) for c in calls
        ]
        # Run in order on the session: an up-ledger's withdrawal is only valid after its deposit.
        expected = [str(target + 5), str(target)] if target > start else [str(target), str(target)]
        assert [r["content"] for r in results] == expected
        assert closing == {"role": "assistant", "content": f"The ledger is balanced at {target}."}
        assert trajectory.status == "done" and trajectory.reason == "no tool call" and trajectory.turns == 2
        assert trajectory.total_reward == 1.0
        record = trajectory.to_dict()
        assert record["messages"] == trajectory.messages
        assert record["infos"]["tool_format"] == "native" and record["infos"]["tools"] == tools
    assert _tool_calls_served(ledger_url) - before == 2 * len(seeds)


async def test_the_text_form_lists_the_tools_and_answers_every_call_in_a_tool_response_block(ledger_url: str) -> None:
    seeds = _seeds("up")
    before = _tool_calls_served(ledger_url)
    done = await ToolScheduler(base_url=ledger_url, max_turns=3).run(_requests(seeds), TextLedgerPolicy())
    for trajectory, seed in zip(done, seeds):
        start, target = _ledger(seed)
        system, user, reply, results, closing = trajectory.messages
        assert "<tools>" in system["content"] and '"name": "withdraw"' in system["content"]
        assert user["content"].startswith(f"The ledger holds {start}.")
        assert reply["content"].count("<tool_call>") == 2 and "tool_calls" not in reply
        # Both results in one user message, in order, as a Qwen template renders two tool turns.
        assert results == {
            "role": "user",
            "content": f"<tool_response>\n{target + 5}\n</tool_response>\n<tool_response>\n{target}\n</tool_response>",
        }
        assert closing["content"] == "Done." and trajectory.total_reward == 1.0
        assert trajectory.rollout_infos["tool_format"] == "text" and "tools" not in trajectory.rollout_infos
    assert _tool_calls_served(ledger_url) - before == 2 * len(seeds)


async def test_a_policy_that_takes_tools_plays_the_text_form_when_asked(ledger_url: str) -> None:
    policy = NativeLedgerPolicy()
    [trajectory] = await ToolScheduler(base_url=ledger_url, tool_format="text", max_turns=2).run(_requests([0]), policy)
    assert policy.given == [None]  # no tools= given
    assert "<tools>" in trajectory.messages[0]["content"]
    assert trajectory.messages[-1] == {"role": "assistant", "content": "I was given no ledger tools to call."}
    assert trajectory.rollout_infos["tool_format"] == "text"


async def test_a_call_whose_arguments_are_not_json_is_answered_with_an_error_and_not_run(ledger_url: str) -> None:
    [seed] = _seeds("level", 1)
    start, _ = _ledger(seed)
    broken = PolicyOutput(text="", tool_calls=[
        {"id": "a", "type": "function", "function": {"name": "deposit", "arguments": "{amount: 5"}},
        {"id": "b", "type": "function", "function": {"name": "balance", "arguments": "{}"}},
    ])
    before = _tool_calls_served(ledger_url)
    [trajectory] = await ToolScheduler(base_url=ledger_url, max_turns=3).run(_requests([seed]), ReplyPolicy(broken))
    _, _, first, second, closing = trajectory.messages
    assert first["tool_call_id"] == "a" and first["content"].startswith("error: arguments are not JSON")
    assert second == {"role": "tool", "tool_call_id": "b", "name": "balance", "content": str(start)}
    assert closing["content"] == "Done." and trajectory.status == "done"
    assert trajectory.steps[0].info["tool_error"]["error_type"] == "invalid_call"
    assert _tool_calls_served(ledger_url) - before == 1  # only the readable call reached the ledger


async def test_a_tool_error_reaches_the_model_as_the_calls_result(ledger_url: str) -> None:
    [seed] = _seeds("level", 1)
    start, _ = _ledger(seed)
    overdraft = PolicyOutput(text="", tool_calls=[
        {"id": "x", "type": "function", "function": {"name": "withdraw", "arguments": json.dumps({"amount": start + 5})}},
    ])
    [trajectory] = await ToolScheduler(base_url=ledger_url, max_turns=2).run(_requests([seed]), ReplyPolicy(overdraft))
    result = trajectory.messages[2]
    assert result["role"] == "tool" and result["tool_call_id"] == "x"
    assert result["content"].startswith("error: ")
    assert result["content"].endswith(f"cannot withdraw {start + 5}: the balance is {start}")


async def test_a_call_left_in_the_text_ends_the_native_episode_and_says_how_to_parse_it(ledger_url: str) -> None:
    unparsed = PolicyOutput(text='<tool_call>{"name": "balance", "arguments": {}}</tool_call>')
    [trajectory] = await ToolScheduler(base_url=ledger_url, max_turns=3).run(_requests([0]), ReplyPolicy(unparsed))
    assert trajectory.status == "done" and trajectory.turns == 1 and not trajectory.steps
    assert trajectory.reason is not None and trajectory.reason.startswith("no tool call (")
    assert "--tool-call-parser hermes" in trajectory.reason and "--tool-format text" in trajectory.reason


async def test_native_play_needs_a_policy_that_takes_tools(ledger_url: str) -> None:
    scheduler = ToolScheduler(base_url=ledger_url, tool_format="native")
    with pytest.raises(ToolFormatError, match="tool_format 'native' needs a policy that takes tools="):
        await scheduler.run(_requests([0]), TextLedgerPolicy())
    health = await asyncio.to_thread(httpx.get, f"{ledger_url}/health")
    assert int(health.json()["active_sessions"]) == 0  # no episode was started
    with pytest.raises(ToolFormatError, match="tool_format must be one of native, text"):
        ToolScheduler(tool_format="xml")  # type: ignore[arg-type]


def test_text_replies_are_read_for_every_call_in_order() -> None:
    text = ('<tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call> then '
            '<tool_call>not json</tool_call><tool_call>\n{"name": "b", "arguments": "{\\"k\\": 2}"}\n</tool_call>')
    first, broken, second = parse_tool_calls(text)
    assert (first.name, first.arguments, first.error) == ("a", {"k": 1}, None)
    assert broken.error is not None and "not json" in broken.error
    assert (second.name, second.arguments) == ("b", {"k": 2})
    assert parse_tool_calls('{"name": "a"}') == [ToolCall(name="a")]
    assert parse_tool_calls("no call") == [] and parse_tool_calls('{"arguments": {}}') == []


def test_openai_calls_are_read_with_their_ids_and_unreadable_arguments_named() -> None:
    call = ToolCall.from_openai({"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}})
    assert call == ToolCall(name="f", arguments={"x": 1}, id="c1")
    assert ToolCall.from_openai({"id": "c2", "function": {"name": "f", "arguments": {"x": 2}}}).arguments == {"x": 2}
    assert ToolCall.from_openai({"id": "c3", "function": {"name": "f", "arguments": ""}}) == ToolCall(name="f", id="c3")
    listed = ToolCall.from_openai({"id": "c4", "function": {"name": "f", "arguments": "[1]"}})
    assert listed.error == "arguments must be a JSON object, got list" and listed.id == "c4"
    assert ToolCall.from_openai({"id": "c5"}).error is not None


def test_messages_are_readied_for_a_chat_template_without_changing_them() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "oops"}},
        ]},
    ]
    kept = json.loads(json.dumps(messages))
    ready = chat_template_messages(messages)
    assert [c["function"]["arguments"] for c in ready[1]["tool_calls"]] == [{"x": 1}, "oops"]
    assert ready[0] is messages[0] and messages == kept
