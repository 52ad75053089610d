"""GRPO on FrozenLake (envsdk's local ms-swift-style `Env`) with TRL's GRPOTrainer.

On a GPU machine:

    python examples/train_grpo_frozen_lake.py --model Qwen/Qwen3-0.6B --use-vllm --vllm-mode colocate

On CPU with a local tiny model, offline:

    HF_HUB_OFFLINE=1 python examples/train_grpo_frozen_lake.py --model ./tiny --cpu --max-steps 3

``--adapter rollout_func`` (default): envsdk's `GYMScheduler` plays whole episodes, the model
answering ``<action>up|down|left|right</action>``; the map shown between turns is kept in
context but masked from the loss. ``--adapter environment_factory``: TRL calls the ``move``
tool below (needs a chat template with tool calling) — the way to give any envsdk episode
tools of your own: subclass `EpisodeEnvironment`, turn the tool's arguments into the reply the
scheduler expects, return ``self._play(reply)``. Reward: 1 for reaching the goal, else 0.

``--rubric shaped`` (rollout_func) scores every step with FrozenLake's shaped rubric too: one
reward column per rubric part (``rewards/goal``, ``rewards/progress``, ``rewards/format``),
each weighted as the rubric weighs it, beside the 0/1 reward's column.

Leaves in ``--output-dir``: ``final/`` (the trained model and its tokenizer, loadable with
``--model``) and, with ``rollout_func``, ``completions.jsonl`` (every training episode with the
step it fed; ``envsdk report`` plots it).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from envsdk.integrations.trl import EpisodeEnvironment


class FrozenLakeTools(EpisodeEnvironment):
    """FrozenLake for TRL's tool calling: one tool, ``move``."""

    def move(self, direction: str) -> str:
        """Move one cell on the frozen lake.

        Args:
            direction: One of "up", "down", "left" or "right".

        Returns:
            The map after the move, or how the episode ended.
        """
        return self._play(f"<action>{direction}</action>")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="hub id or local directory")
    parser.add_argument("--adapter", choices=["rollout_func", "environment_factory"], default="rollout_func")
    parser.add_argument("--size", type=int, default=4, help="side of the map")
    parser.add_argument("--cpu", action="store_true", help="train on CPU (fp32, one process)")
    parser.add_argument("--use-vllm", action="store_true", help="generate with vLLM")
    parser.add_argument("--vllm-mode", choices=["colocate", "server"], default="colocate")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=1024, help="model and environment tokens")
    parser.add_argument("--max-turn-tokens", type=int, default=128, help="tokens of one model turn (rollout_func)")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--env-weight", type=float, default=1.0, help="weight of the environment's reward column")
    parser.add_argument(
        "--rubric", choices=["shaped"], default=None, help="add one reward column per part of the shaped rubric"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/grpo-frozen-lake")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; return a summary (steps, seconds, steps/s, the logged environment reward per step)."""
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envsdk.envs.frozen_lake import SYSTEM_MESSAGE, FrozenLakeRubric
    from envsdk.integrations.trl import (
        EnvironmentFactory,
        make_rollout_func,
        reward_component_funcs,
        with_env_reward,
    )
    from envsdk.schedulers import GYMScheduler

    if args.cpu:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    use_tools = args.adapter == "environment_factory"
    if use_tools and args.rubric:
        raise SystemExit("--rubric needs --adapter rollout_func")
    # rollout_func: the environment's reward is the last reward column, after one column per
    # rubric part with --rubric. environment_factory: TRL scores each rollout with
    # FrozenLakeTools.get_reward (weight 1) and needs no reward_funcs.
    rubric = FrozenLakeRubric() if args.rubric else None
    parts, part_weights = (reward_component_funcs(rubric), list(rubric.weights)) if rubric else ([], [])
    reward_funcs, weights = ([], None) if use_tools else with_env_reward(parts, part_weights, env_weight=args.env_weight)
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        reward_weights=weights,
        logging_steps=1,
        save_strategy="no",  # no checkpoints along the way: the trained model is saved once, at the end
        report_to="none",
        seed=args.seed,
        use_cpu=args.cpu,
        bf16=not args.cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_tool_calling_iterations=args.max_turns if use_tools else None,
        chat_template_kwargs={"enable_thinking": False},
    )
    scheduler = GYMScheduler("frozen_lake", max_turns=args.max_turns)
    rows = max(args.max_steps, 1) * args.batch_size
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # Every training episode (rollout_func), with the step it fed: `envsdk report` plots it.
    completions = os.path.join(args.output_dir, "completions.jsonl")
    if use_tools:
        instructions = SYSTEM_MESSAGE.split("Each turn")[0] + "Move with the move tool, one cell per call."
        dataset = Dataset.from_list(
            [
                {"prompt": [{"role": "system", "content": instructions}, {"role": "user", "content": ""}],
                 "env_config": {"size": args.size, "seed": i}}
                for i in range(rows)
            ]
        )
        factory = EnvironmentFactory(FrozenLakeTools, scheduler)
        trainer = GRPOTrainer(
            model=args.model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            environment_factory=factory,
            callbacks=[factory.callback()],
        )
    else:
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Play FrozenLake."}]}] * rows)

        def env_config(prompt: list[dict[str, Any]], seed: int) -> dict[str, Any]:
            return {"size": args.size, "seed": seed, "rubric": args.rubric}

        trainer = GRPOTrainer(
            model=args.model,
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=make_rollout_func(
                scheduler, max_turn_tokens=args.max_turn_tokens, seed=args.seed, env_config_fn=env_config,
                completions=completions,
            ),
        )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    saved = os.path.join(args.output_dir, "final")
    trainer.save_model(saved)  # weights, config and tokenizer: loadable with --model {saved}
    env_key = "rewards/FrozenLakeTools/mean" if use_tools else "rewards/env_reward_func/mean"
    rewards = [h[env_key] for h in trainer.state.log_history if env_key in h]
    steps = trainer.state.global_step
    print(f"{steps} steps in {seconds:.1f} s ({steps / seconds:.3f} steps/s)")
    part_names = [f.__name__ for f in parts]
    history = [h for h in trainer.state.log_history if env_key in h]
    for i, entry in enumerate(history, 1):
        columns = " ".join(f"{name}={entry[f'rewards/{name}/mean']:+.3f}" for name in part_names)
        print(f"step {i}: env_reward={entry[env_key]:+.3f}{' ' + columns if columns else ''}")
    print(f"model saved to {saved}" + ("" if use_tools else f"; episodes in {completions} (envsdk report {completions})"))
    return {
        "model": saved,
        "completions": None if use_tools else completions,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "env_reward": rewards,
        **{name: [h[f"rewards/{name}/mean"] for h in history] for name in part_names},
    }


if __name__ == "__main__":
    main()
