"""Native tool calling end to end through the real CLI, from a temporary folder: ``envsdk
rollout --policy openai`` on the ledger tool env (examples/ledger_tools.py), against a small
OpenAI-compatible server that answers with ``tool_calls`` (tests/tool_envs/openai_tool_server.py).
The records' messages hold the assistant's ``tool_calls`` and the ``tool`` turns, and render
through the tiny model's chat template and Qwen's as those templates render tool turns."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.testing import running_server
from envsdk.tools import chat_template_messages
from examples.ledger_tools import create_ledger_app
from tests.cli.conftest import Result, assert_one_line_error, envsdk

from .openai_tool_server import MODEL, ToolChatServer, ledger_plan

pytestmark = pytest.mark.timeout(240)

EPISODES = 6


def _ledger(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(0, 20) * 5, rng.randint(0, 20) * 5


class Played:
    """A ledger server, the tool-calling chat server, and one CLI run against both."""

    def __init__(self, folder: Path, ledger: str, chat: ToolChatServer, chat_url: str) -> None:
        self.folder, self.ledger, self.chat, self.chat_url = folder, ledger, chat, chat_url

    def rollout(self, *extra: str, out: str = "completions.jsonl") -> tuple[Result, list[dict[str, Any]]]:
        self.chat.requests.clear()
        result = envsdk(
            "rollout", "--env", "ledger", "--base-url", self.ledger, "--policy", "openai",
            "--api-base", f"{self.chat_url}/v1", "--model", MODEL, "--episodes", str(EPISODES), "--max-turns", "4",
            "--out", out, "--no-progress", *extra, cwd=self.folder,
        )
        path = self.folder / out
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
        return result, sorted(records, key=lambda r: r["seed"])


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Played]:
    chat = ToolChatServer()
    with running_server(create_ledger_app(max_concurrent_envs=8)) as ledger, running_server(chat.app) as chat_url:
        yield Played(tmp_path_factory.mktemp("user"), ledger, chat, chat_url)


@pytest.fixture(scope="module")
def native(played: Played) -> tuple[Result, list[dict[str, Any]], list[dict[str, Any]]]:
    result, records = played.rollout()
    return result, records, list(played.chat.requests)


def test_the_openai_policy_plays_the_ledger_with_native_tool_calls(
    played: Played, native: tuple[Result, list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    result, records, requests = native
    assert result.returncode == 0, result.stderr
    assert len(records) == EPISODES
    several = 0
    for record in records:
        start, target = _ledger(record["seed"])
        user, assistant, *rest = record["messages"]
        # The prompt is the env's text; no tool is listed by hand (no system message at all).
        assert user == {"role": "user", "content": f"The ledger holds {start}. Bring it to exactly {target} with the deposit and withdraw tools."}
        calls = assistant["tool_calls"]
        assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("function", name, arguments) for name, arguments in ledger_plan(start, target)
        ]
        several += len(calls) > 1
        results, closing = rest[: len(calls)], rest[len(calls):]
        assert [(m["role"], m["tool_call_id"], m["name"]) for m in results] == [
            ("tool", c["id"], c["function"]["name"]) for c in calls
        ]
        assert results[-1]["content"] == str(target)  # the balance after the calls, run in order
        assert closing == [{"role": "assistant", "content": f"The ledger is balanced at {target}."}]
        assert record["status"] == "done" and record["reason"] == "no tool call" and record["turns"] == 2
        assert record["total_reward"] == 1.0  # the ledger's state: the target was reached
        assert record["infos"]["tool_format"] == "native"
        assert {t["function"]["name"] for t in record["infos"]["tools"]} == {"deposit", "withdraw", "balance"}
    assert several >= 1
    # Over the wire: every request carried the tools; the second turn of each episode sent the
    # tool turns back with their call ids (the server refuses a conversation that does not).
    assert len(requests) == 2 * EPISODES
    assert all({t["function"]["name"] for t in r["tools"]} == {"deposit", "withdraw", "balance"} for r in requests)
    followups = [r for r in requests if any(m["role"] == "tool" for m in r["messages"])]
    assert len(followups) == EPISODES
    for request in followups:
        ids = [c["id"] for c in request["messages"][1]["tool_calls"]]
        assert [m["tool_call_id"] for m in request["messages"] if m["role"] == "tool"] == ids


def test_the_text_form_on_request_lists_the_tools_in_the_prompt_and_sends_none(played: Played) -> None:
    result, records = played.rollout("--tool-format", "text", out="text.jsonl")
    assert result.returncode == 0, result.stderr
    assert len(records) == EPISODES and all("tools" not in r for r in played.chat.requests)
    for record in records:
        system = record["messages"][0]
        assert system["role"] == "system" and "<tools>" in system["content"] and '"name": "deposit"' in system["content"]
        # Given no tools, the scripted model says so: a reply without a call ends the episode.
        assert record["messages"][-1]["content"] == "I was given no ledger tools to call."
        assert record["infos"]["tool_format"] == "text" and record["reason"] == "no tool call"


def test_native_tool_calls_need_a_policy_that_makes_them(played: Played) -> None:
    result = envsdk(
        "rollout", "--env", "ledger", "--base-url", played.ledger, "--policy", "random", "--tool-format", "native",
        "--episodes", "1", "--out", "refused.jsonl", "--no-progress", cwd=played.folder,
    )
    assert result.returncode == 2
    assert_one_line_error(result, "--tool-format native", "--policy random")
    assert not (played.folder / "refused.jsonl").exists()


def test_tool_format_is_refused_for_an_env_without_tools(played: Played) -> None:
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as echo:
        for env, where in (("frozen_lake", []), ("echo", ["--base-url", echo])):
            result = envsdk(
                "rollout", "--env", env, *where, "--tool-format", "text", "--episodes", "1", "--out", "none.jsonl",
                "--no-progress", cwd=played.folder,
            )
            assert result.returncode == 2
            assert_one_line_error(result, "--tool-format text", f"{env} is not one")
            # Refused before the run began: no records, no run file.
            assert not list(played.folder.glob("none.*"))


# ------------------------------------------------------------------ rendering

def _tokenizer() -> Any:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from envsdk.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _qwen_template(name: str) -> str:
    """Qwen's own chat template, as TRL keeps a verbatim copy of it (to recognise the model)."""
    trl = pytest.importorskip("trl")
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _render(tokenizer: Any, record: dict[str, Any], template: str | None = None, *, ready: bool = True) -> str:
    messages = chat_template_messages(record["messages"]) if ready else record["messages"]
    rendered = tokenizer.apply_chat_template(
        messages, tools=record["infos"]["tools"], tokenize=False, chat_template=template
    )
    return str(rendered)


def _calls_text(record: dict[str, Any]) -> str:
    """The assistant's calls as Qwen's templates (and the tiny model's) write them."""
    return "\n".join(
        f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {c["function"]["arguments"]}}}\n</tool_call>'
        for c in record["messages"][1]["tool_calls"]
    )


def _results(record: dict[str, Any]) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "tool"]


def test_the_records_render_through_the_tiny_models_chat_template(native: tuple[Result, list[dict[str, Any]], Any]) -> None:
    tokenizer = _tokenizer()
    _, records, _ = native
    for record in records:
        text = _render(tokenizer, record)
        # The tools in the system turn, the calls in the assistant turn, each result a user turn.
        assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "withdraw"' in text
        turns = "".join(f"<|im_start|>user\n<tool_response>\n{r}\n</tool_response><|im_end|>\n" for r in _results(record))
        closing = record["messages"][-1]["content"]
        assert text.endswith(
            f"<|im_start|>user\n{record['messages'][0]['content']}<|im_end|>\n"
            f"<|im_start|>assistant\n\n{_calls_text(record)}<|im_end|>\n{turns}"
            f"<|im_start|>assistant\n{closing}<|im_end|>\n"
        ), text


def test_the_records_render_through_qwens_chat_templates(native: tuple[Result, list[dict[str, Any]], Any]) -> None:
    tokenizer = _tokenizer()
    _, records, _ = native
    for record in records:
        # Qwen renders consecutive tool turns as one user turn of <tool_response> blocks.
        turns = "<|im_start|>user" + "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in _results(record)) + "<|im_end|>\n"
        user = f"<|im_start|>user\n{record['messages'][0]['content']}<|im_end|>\n"
        closing = record["messages"][-1]["content"]
        qwen3 = _render(tokenizer, record, _qwen_template("qwen3"))
        assert "# Tools\n\nYou may call one or more functions" in qwen3
        assert qwen3.endswith(
            f"{user}<|im_start|>assistant\n{_calls_text(record)}<|im_end|>\n{turns}"
            f"<|im_start|>assistant\n<think>\n\n</think>\n\n{closing}<|im_end|>\n"
        ), qwen3
        qwen25 = _render(tokenizer, record, _qwen_template("qwen2_5"))
        assert qwen25.endswith(
            f"{user}<|im_start|>assistant\n{_calls_text(record)}<|im_end|>\n{turns}"
            f"<|im_start|>assistant\n{closing}<|im_end|>\n"
        ), qwen25
        # Qwen2.5 writes the arguments with tojson: OpenAI's JSON text would come out as a quoted
        # string, not what the model wrote; `chat_template_messages` gives it the objects.
        raw = _render(tokenizer, record, _qwen_template("qwen2_5"), ready=False)
        assert '"arguments": "{\\"amount\\"' in raw
