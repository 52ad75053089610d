"""TRL's GRPOTrainer on FrozenLake with the shaped rubric: one reward column per rubric part.

CPU, 2 steps, the tiny local model steered into well-formed and sloppy moves; the episodes run
through `make_rollout_func` and `GYMScheduler`, the rubric's parts reach the reward functions
from `reward_component_funcs(rubric)`, and the trainer's log has each part's column.
"""

from __future__ import annotations

import os
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from envsdk.envs.frozen_lake import FrozenLakeRubric  # noqa: E402
from envsdk.integrations.trl import make_rollout_func, reward_component_funcs, with_env_reward  # noqa: E402
from envsdk.schedulers import GYMScheduler  # noqa: E402
from envsdk.tiny_model import build_tiny_model  # noqa: E402
from tests.integrations.steering import steering_bias  # noqa: E402

STEPS = 2
REPLIES = [f"<action>{d}</action>" for d in ("up", "down", "left", "right")] + ["go left", "go down"]


@pytest.mark.timeout(300)
def test_grpo_logs_one_reward_column_per_rubric_part(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rubric = FrozenLakeRubric()
    names = ["goal", "progress", "format"]
    funcs, weights = with_env_reward(reward_component_funcs(rubric), list(rubric.weights), env_weight=1.0)
    assert [f.__name__ for f in funcs] == [*names, "env_reward_func"]

    rollout = make_rollout_func(
        GYMScheduler("frozen_lake", max_turns=4),
        max_turn_tokens=24,
        env_config_fn=lambda prompt, seed: {"seed": seed, "rubric": "shaped"},
    )
    outputs: list[dict[str, Any]] = []

    def recording_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        outputs.append({"reward_parts": list(out["reward_parts"]), "trajectories": rollout.last_trajectories})
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=STEPS,
        max_completion_length=256,
        logging_steps=1,
        learning_rate=1e-2,
        save_strategy="no",
        seed=0,
        reward_weights=weights,
        generation_kwargs={"sequence_bias": steering_bias(tokenizer, REPLIES)},
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=funcs,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "Play FrozenLake."}]}] * 8),
        processing_class=tokenizer,
        rollout_func=recording_rollout,
    )
    trainer.train()

    logs = [entry for entry in trainer.state.log_history if "rewards/env_reward_func/mean" in entry]
    assert len(logs) == len(outputs) == STEPS
    for entry, out in zip(logs, outputs):
        print({k: round(v, 4) for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean")})
        trajectories = out["trajectories"]
        assert all(t.status != "error" for t in trajectories)
        for name in names:
            # The column the trainer logged is the mean of the episodes' part values.
            expected = fmean(t.rollout_infos["reward_parts"].get(name, 0.0) for t in trajectories)
            assert entry[f"rewards/{name}/mean"] == pytest.approx(expected, abs=1e-6)
        assert out["reward_parts"] == [t.rollout_infos["reward_parts"] for t in trajectories]
    # The steered replies are mostly tagged moves: the format column is not constant zero.
    assert any(entry["rewards/format/mean"] > 0 for entry in logs)
