"""GRPO on CPU through TRL's ``environment_factory`` with the ledger's tools discovered over MCP."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

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


def _seeds_with_gap(gap: int, n: int) -> list[int]:
    """Seeds whose ledger starts `gap` below its target (the ledger's own reset draws)."""
    found = []
    for seed in range(10_000):
        rng = random.Random(seed)
        start, target = rng.randint(0, 20) * 5, rng.randint(0, 20) * 5
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
