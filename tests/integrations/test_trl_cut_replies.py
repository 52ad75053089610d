"""Cut replies in TRL's ``rollout_func`` (`make_rollout_func`), through the real GRPOTrainer on
CPU with the tiny model and the real Sudoku server: a reply the per-turn token limit cuts is dealt
with by the scheduler's ``cut_replies`` rule, and under ``mask`` the trainer's loss mask leaves the
episode out (TRL's ``mask_truncated_completions``, per episode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from envsdk.integrations.trl import make_rollout_func, with_env_reward
from envsdk.schedulers import SudokuScheduler


class _RecordingTrainer(GRPOTrainer):
    """GRPOTrainer that keeps each batch it computed (the real trainer, nothing replaced)."""

    batches: list[dict[str, Any]]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        self.batches = [*getattr(self, "batches", []), output]
        return output


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rule", ["penalty", "mask"])
def test_a_cut_reply_is_penalised_by_default_and_left_out_of_the_loss_under_mask(
    tiny_model_dir: Path, sudoku_url: str, tmp_path: Path, rule: str
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    scheduler = SudokuScheduler(base_url=sudoku_url, max_turns=3, cut_replies=rule)  # type: ignore[arg-type]
    # Two tokens a turn: every reply is cut (the tiny model does not end a turn that soon).
    rollout = make_rollout_func(scheduler, seed=7, max_turn_tokens=2)
    outputs: list[dict[str, Any]] = []

    def recording_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        outputs.append({k: list(v) if isinstance(v, list) else v for k, v in out.items()})
        return out

    funcs, weights = with_env_reward()
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_steps=1, logging_steps=1, save_strategy="no", seed=0, max_completion_length=64,
        reward_weights=weights,
    )
    trainer = _RecordingTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=funcs,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "Play Sudoku."}]}] * 4),
        processing_class=tokenizer,
        rollout_func=recording_rollout,
    )
    trainer.train()

    [out] = outputs
    [batch] = trainer.batches
    assert out["truncated"] == [True] * 4 and out["env_status"] == ["length"] * 4
    for row in range(4):
        mask = out["env_mask"][row]
        assert batch["tool_mask"][row, : len(mask)].tolist() == mask  # the trainer's loss mask
        if rule == "mask":
            assert mask == [0] * len(mask) and out["env_reward"][row] == 0.0  # nothing added, nothing learnt
        else:
            assert mask == [1, 1] and out["env_reward"][row] == -1.0  # a reply with no move's reward
    for trajectory in rollout.last_trajectories:
        assert trajectory.truncated and trajectory.rollout_infos["cut_replies"] == rule
