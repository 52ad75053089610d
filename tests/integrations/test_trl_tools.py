"""GRPO on CPU through TRL's ``environment_factory`` with the ledger's tools discovered over MCP."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("trl")

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from envsdk.integrations.trl import tool_environment_factory
from envsdk.testing import running_server
from examples.ledger_tools import create_ledger_app

from .steering import steering_bias

STEPS = 2


def _tool_calls(url: str) -> int:
    found = re.search(r"^envsdk_tool_calls_total (\d+)$", httpx.get(f"{url}/metrics", timeout=5).text, re.MULTILINE)
    assert found
    return int(found.group(1))


def _ledger(seed: int) -> tuple[int, int]:
    """The ledger's (start, target) for `seed` (its own reset's draws)."""
    rng = random.Random(seed)
    return rng.randint(0, 20) * 5, rng.randint(0, 20) * 5


def _seeds_with_gap(gap: int, n: int) -> list[int]:
    """Seeds whose ledger starts `gap` below its target (the ledger's own reset draws)."""
    found = []
    for seed in range(10_000):
        start, target = _ledger(seed)
        if target - start == gap:
            found.append(seed)
        if len(found) == n:
            return found
    raise AssertionError("no such seeds")


def _call(amount: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "deposit", "arguments": {"amount": amount}}) + "\n</tool_call>"


@pytest.mark.timeout(300)
def test_grpo_trains_on_tools_discovered_over_mcp_and_the_calls_reach_the_server(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with running_server(create_ledger_app(max_concurrent_envs=8, mode="production")) as ledger_url:
        _train(ledger_url, tiny_model_dir, tmp_path)


def _train(ledger_url: str, model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    factory = tool_environment_factory(ledger_url, class_name="LedgerTools")
    # The tools became methods with the server's schema and descriptions.
    assert {"deposit", "withdraw", "balance"} <= set(vars(factory.environment_class))
    doc = factory.environment_class.deposit.__doc__ or ""
    assert doc.startswith("Add money to the ledger.") and "amount: How much to add, from 1 to 1000." in doc
    before = _tool_calls(ledger_url)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
        per_device_train_batch_size=4, num_generations=4, max_steps=STEPS, logging_steps=1,
        learning_rate=1e-2, save_strategy="no", seed=0, max_completion_length=256,
        max_tool_calling_iterations=1,
        # Steer the random model into one deposit of 5, 10 or 15: only 5 reaches the target.
        generation_kwargs={"sequence_bias": steering_bias(tokenizer, [_call(a) for a in (5, 10, 15)])},
    )
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "Reach the target balance."}], "seed": s} for s in _seeds_with_gap(5, 8)]
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    snapshot = {name: p.detach().clone() for name, p in model.named_parameters()}
    with factory:
        trainer = GRPOTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
            environment_factory=factory, callbacks=[factory.callback()],
        )
        trainer.train()
    made = factory.tool_calls
    assert made >= STEPS * 4  # at least one tool call per rollout
    assert _tool_calls(ledger_url) - before == made  # every one reached the server
    rewards = [e["rewards/LedgerTools/mean"] for e in trainer.state.log_history if "rewards/LedgerTools/mean" in e]
    assert len(rewards) == STEPS
    assert min(e["tools/call_frequency"] for e in trainer.state.log_history if "tools/call_frequency" in e) >= 1.0
    assert sum(not torch.equal(snapshot[n], p) for n, p in model.named_parameters()) > 0
    assert int(httpx.get(f"{ledger_url}/health", timeout=5).json()["active_sessions"]) == 0


@pytest.mark.timeout(300)
def test_rollout_func_runs_grpo_on_a_tool_env_through_the_tool_scheduler(tiny_model_dir: Path, tmp_path: Path) -> None:
    from envsdk.integrations.trl import env_reward_func, make_rollout_func
    from envsdk.schedulers import ToolScheduler

    seeds = _seeds_with_gap(5, STEPS)
    with running_server(create_ledger_app(max_concurrent_envs=8)) as ledger_url:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        rollout = make_rollout_func(
            ToolScheduler(base_url=ledger_url, max_turns=1),
            env_config_fn=lambda messages, n: {"seed": seeds[n % len(seeds)]},
        )
        played: list[Any] = []

        def recording(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            out = rollout(prompts, trainer)
            played.extend(rollout.last_trajectories)
            return out

        before = _tool_calls(ledger_url)
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
            per_device_train_batch_size=4, num_generations=4, max_steps=STEPS, logging_steps=1,
            learning_rate=1e-2, save_strategy="no", seed=0, max_completion_length=256,
            generation_kwargs={"sequence_bias": steering_bias(tokenizer, [_call(a) for a in (5, 10, 15)])},
        )
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Reach the target."}]}] * 8)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        trainer = GRPOTrainer(
            model=model, reward_funcs=[env_reward_func], args=args, train_dataset=dataset,
            processing_class=tokenizer, rollout_func=recording,
        )
        trainer.train()
        assert len(played) == STEPS * 4
        calls = sum(len(t.steps) for t in played)
        assert calls >= STEPS * 4 and _tool_calls(ledger_url) - before == calls
        # The reward is the ledger's own verdict on each trajectory's deposit.
        for t in played:
            deposited = t.steps[0].action["arguments"]["amount"]
            assert t.total_reward == (1.0 if deposited == 5 else 0.0)
        logged = [e["rewards/env_reward_func/mean"] for e in trainer.state.log_history if "rewards/env_reward_func/mean" in e]
        assert len(logged) == STEPS
        assert int(httpx.get(f"{ledger_url}/health", timeout=5).json()["active_sessions"]) == 0


@pytest.mark.timeout(300)
def test_trl_and_envsdk_rollout_hold_the_same_native_tool_conversation(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One GRPO step through TRL's ``environment_factory`` on the tiny model's own chat
    template, the model steered into two native calls in one reply; then ``envsdk rollout
    --policy openai`` makes the same two calls over OpenAI's wire. The user turn, the calls and
    the tool turns are the same in both, and render to the same characters."""
    from envsdk.tools import chat_template_messages
    from tests.cli.conftest import envsdk
    from tests.tool_envs.openai_tool_server import MODEL, ToolChatServer, ledger_plan

    seeds = _seeds_with_gap(5, 4)
    plan = ledger_plan(*_ledger(seeds[0]))  # every seed's: five below the target

    def reply(calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)

    # The plan (it reaches the target), or its deposit with a withdrawal of 10 (it misses by 5):
    # the model's own logits choose, so rewards differ within the group and the step learns.
    replies = [reply(plan), reply([plan[0], ("withdraw", {"amount": 10})])]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)  # the tiny model's template: tools, tool turns
    trained: list[tuple[int, list[dict[str, Any]]]] = []

    def keep(completions: list[Any], seed: list[int], **kwargs: Any) -> list[float]:
        trained.extend(zip(seed, completions))
        return [0.0] * len(completions)

    chat = ToolChatServer()
    with running_server(create_ledger_app(max_concurrent_envs=8, mode="production")) as ledger_url, \
            running_server(chat.app) as chat_url:
        factory = tool_environment_factory(ledger_url, class_name="LedgerTools")
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
            per_device_train_batch_size=4, num_generations=4, max_steps=1, logging_steps=1,
            learning_rate=1e-2, save_strategy="no", seed=0, max_completion_length=256, max_tool_calling_iterations=1,
            generation_kwargs={"sequence_bias": steering_bias(tokenizer, replies)},
        )
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "seed": s} for s in seeds])
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        snapshot = {name: p.detach().clone() for name, p in model.named_parameters()}
        with factory:
            trainer = GRPOTrainer(
                model=model, args=args, train_dataset=dataset, processing_class=tokenizer, reward_funcs=[keep],
                environment_factory=factory, callbacks=[factory.callback()],
            )
            trainer.train()
        assert len(trained) == 4
        assert sum(not torch.equal(snapshot[n], p) for n, p in model.named_parameters()) > 0
        rewards = [e["rewards/LedgerTools/mean"] for e in trainer.state.log_history if "rewards/LedgerTools/mean" in e]
        assert 0.0 < rewards[0] < 1.0  # both replies were played, and the ledger scored each
        # A rollout that played the plan (TRL parses the arguments into objects).
        seed, completion = next(
            (s, c) for s, c in trained if [t["function"]["arguments"] for t in c[0]["tool_calls"]] == [a for _, a in plan]
        )
        folder = tmp_path / "user"
        folder.mkdir()
        result = envsdk(
            "rollout", "--env", "ledger", "--base-url", ledger_url, "--policy", "openai", "--api-base", f"{chat_url}/v1",
            "--model", MODEL, "--seed", str(seed), "--episodes", "1", "--no-progress", cwd=folder,
        )
        assert result.returncode == 0, result.stderr
        [record] = [json.loads(line) for line in (folder / "completions.jsonl").read_text(encoding="utf-8").splitlines()]

    start, target = _ledger(seed)
    prompt = {"role": "user", "content": f"The ledger holds {start}. Bring it to exactly {target} with the deposit and withdraw tools."}
    # TRL's: the prompt (its reset text), the model's calls, TRL's tool turns (the regenerated reply after them differs).
    trl_turns = [prompt, *completion[:3]]
    envsdk_turns = record["messages"][:4]
    assert envsdk_turns[0] == prompt
    for turns in (trl_turns, envsdk_turns):
        calls = chat_template_messages(turns)[1]["tool_calls"]
        assert [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("function", name, arguments) for name, arguments in plan
        ]
        assert [(m["role"], m["name"], m["content"]) for m in turns[2:]] == [
            ("tool", "deposit", str(target + 5)), ("tool", "withdraw", str(target)),
        ]
    # The same characters through the chat template, from the user turn on (the system turn lists
    # the tools, each path with its own schema text: the server's, transformers' from the methods).
    def rendered(turns: list[dict[str, Any]]) -> str:
        text = tokenizer.apply_chat_template(chat_template_messages(turns), tokenize=False)
        return str(text)

    assert rendered(trl_turns) == rendered(envsdk_turns)
    assert f"<|im_start|>user\n<tool_response>\n{target}\n</tool_response><|im_end|>\n" in rendered(envsdk_turns)
    # The tools each path gave the model: the same names, summaries and arguments. (FastMCP keeps a
    # docstring's "Returns:" section in the description when it has no "Args:" one, as balance's;
    # transformers drops it.)
    given = {t["function"]["name"]: t["function"] for t in record["infos"]["tools"]}
    from transformers.utils import get_json_schema

    for name in ("deposit", "withdraw", "balance"):
        trl_schema = get_json_schema(getattr(factory.environment_class, name))["function"]
        assert trl_schema["description"] == given[name]["description"].split("\n\n")[0]
        assert trl_schema["parameters"]["properties"] == given[name]["parameters"].get("properties", {})
