"""See it learn: GRPO through an envsdk server raises an agent's FrozenLake success rate, on CPU.

From nothing to a measurably better agent, offline, in minutes on two CPU cores:

1. build the local tiny model (random weights, locally trained tokenizer: `envsdk.tiny_model`);
2. serve FrozenLake on a fixed 3×3 map (``S F H / F F F / H F G``) with an envsdk server on a
   free 127.0.0.1 port — every episode below, training included, is played on that server;
3. warm-start with TRL's ``SFTTrainer`` on random-policy episodes: this teaches the reply
   format (a bare direction word, ``right``, which FrozenLake reads as the move; one token of
   the tiny tokenizer) and nothing about the route, since the moves are uniformly random;
4. evaluate with envsdk's rollout runner (what ``envsdk rollout`` runs) on held-out seeds;
5. train with TRL's ``GRPOTrainer`` through `make_rollout_func` and envsdk's `GYMScheduler`:
   the only reward is the environment server's (1 for reaching G, else 0), with a KL term to
   the warm-started model;
6. evaluate again on the same seeds, and plot both evaluations and the training curve.

The map is fixed, so what is learned is a route, not map reading; a uniformly random move
reaches G within 8 turns 7.5 % of the time. Both evaluations sample at temperature 1, as
training does, with the eval seeds seeding the sampler (transformers' default top-k of 50
applies there, not in training). Episodes that draw from one sampler run one at a time
(the model generates one reply at a time anyway), and GRPO's generation batches are in
episode order, so a rerun with the same seed on the same machine replays the same draws.

Writes into ``--out`` (default ``runs/learn-cpu``): ``before/completions.jsonl``,
``after/completions.jsonl``, ``train/completions.jsonl`` (every training episode, with its
``global_step``), ``train/log.jsonl`` (the trainer's log), ``report/`` (``compare.png``: success
rate and mean reward before and after; ``training.png``: reward per training step), the models
(``sft/``, ``grpo/``). The last line printed is one JSON object: env, eval seeds, before,
after, train steps, seconds.

    python examples/learn_cpu.py --seed 0 --out runs/learn-cpu

GPU recipe (not run on CPU; vLLM colocated, Qwen3 without thinking):

    python examples/learn_cpu.py --model Qwen/Qwen3-0.6B --use-vllm --max-turn-tokens 64 \\
        --learning-rate 1e-6 --sft-learning-rate 1e-5 --out runs/learn-gpu

A model that cannot be loaded stops the script with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAP = "SFH/FFF/HFG"
ENV_NAME = "frozen_lake"
# Eval seeds sit far from the training seeds (run seed × 1000 + group number), so no
# evaluation episode ever replays a training draw.
EVAL_SEED_BASE = 1_000_000


class LoadError(RuntimeError):
    """The model, its tokenizer or vLLM cannot be loaded: reported in one line."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the run's seed; also shifts the eval seeds")
    parser.add_argument("--out", default="runs/learn-cpu", help="output folder")
    parser.add_argument("--model", default=None, help="hub id or local directory (default: build the tiny model)")
    parser.add_argument("--use-vllm", action="store_true", help="generate with vLLM (colocate) during GRPO")
    parser.add_argument("--map", default=MAP, help="the fixed FrozenLake map, rows separated by '/'")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-turn-tokens", type=int, default=8, help="tokens of one model reply")
    parser.add_argument("--sft-episodes", type=int, default=96, help="random-policy episodes to warm-start on")
    parser.add_argument("--sft-steps", type=int, default=60, help="SFT steps of 8 episodes")
    parser.add_argument("--sft-learning-rate", type=float, default=5e-3)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16, help="episodes per GRPO step")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--beta", type=float, default=0.04, help="weight of the KL term to the SFT model")
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.batch_size % args.num_generations:
        parser.error("--batch-size must be a multiple of --num-generations")
    return args


def _phase(number: int, title: str) -> None:
    print(f"[{number}/6] {title}", file=sys.stderr, flush=True)


def _check_dependencies() -> None:
    """Fail before any work (not at the plot step, minutes later) when a package the run
    imports is missing, naming the install command."""
    import importlib

    from envsdk.cli import EXTRAS

    missing = []
    for name in ("torch", "transformers", "trl", "datasets", "matplotlib"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        extras = ",".join(sorted({EXTRAS[name] for name in missing}))
        raise LoadError(
            f"{', '.join(missing)} not installed: run bash scripts/setup.sh train,report (or pip install -e "
            f"'.[{extras}]') in the envsdk clone"
        )


def _check_loadable(model: str, use_vllm: bool) -> None:
    """Fail before any work when the model (or vLLM) cannot be loaded."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(model)
        AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # noqa: BLE001 - any loading failure is reported the same way
        reason = " ".join(str(exc).split())[:300]
        raise LoadError(f"cannot load model {model!r} ({type(exc).__name__}: {reason})") from None
    if use_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise LoadError("--use-vllm needs vLLM: pip install vllm (on a CUDA machine)") from None


def _rate(summary: Any) -> dict[str, float]:
    return {
        "success_rate": round(summary.success_rate, 4),
        "mean_reward": round(summary.total_reward.mean, 4),
    }


def _evaluate(model_dir: str, url: str, seeds: range, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """Play the eval seeds with the model through the server; write ``out/completions.jsonl``."""
    import torch

    from envsdk.policies import TransformersPolicy
    from envsdk.rollout import run_rollouts
    from envsdk.schedulers import GYMScheduler

    out.mkdir(parents=True, exist_ok=True)
    policy = TransformersPolicy(
        model_dir,
        device="cuda" if torch.cuda.is_available() else "cpu",
        max_new_tokens=args.max_turn_tokens,
        temperature=args.temperature,
        do_sample=True,
        seed=seeds.start,
    )
    try:
        report = asyncio.run(
            run_rollouts(
                "remote",
                policy,
                episodes=len(seeds),
                seed=seeds.start,
                # The n-th reply draws from seed + n: episodes in turn keep that n theirs.
                concurrency=1,
                base_url=url,
                out=out / "completions.jsonl",
                scheduler=GYMScheduler(max_turns=args.max_turns),
            )
        )
    finally:
        asyncio.run(policy.aclose())
    return _rate(report.summary)


def _random_moves(seed: int) -> Any:
    """A policy answering a uniformly random direction as a bare word (``right``): FrozenLake
    reads a reply's last direction word as its move, and one word is one token of the tiny
    model's tokenizer, so the only thing GRPO can change is which move, not the format."""
    import random

    from envsdk.envs.frozen_lake import DIRECTIONS
    from envsdk.policies.base import Message, Policy

    class RandomMoves(Policy):
        def __init__(self) -> None:
            self.rng = random.Random(seed)

        async def act(self, messages: list[Message]) -> str:
            return self.rng.choice(sorted(DIRECTIONS))

    return RandomMoves()


def _sft_rows(trajectories: list[Any], tokenizer: Any) -> list[dict[str, Any]]:
    """One tokenized row per episode: the whole conversation, with the loss on the model's
    replies only (``assistant_masks``): every reply of an episode trains in one sequence."""
    rows = []
    for trajectory in trajectories:
        messages = trajectory.messages
        ids = _template(tokenizer, messages, add_generation_prompt=False)
        mask = [0] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(_template(tokenizer, messages[:i], add_generation_prompt=True))
            end = len(_template(tokenizer, messages[: i + 1], add_generation_prompt=False))
            mask[start:end] = [1] * (end - start)
        if any(mask):
            rows.append({"input_ids": ids, "assistant_masks": mask})
    return rows


def _template(tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, enable_thinking=False
    )
    return [int(i) for i in ids]


def _warm_start(model: str, url: str, args: argparse.Namespace, out: Path) -> str:
    """SFT on random-policy episodes (moves uniform over the four directions)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from envsdk.rollout import run_rollouts
    from envsdk.schedulers import GYMScheduler

    report = asyncio.run(
        run_rollouts(
            "remote",
            _random_moves(args.seed),
            episodes=args.sft_episodes,
            seed=args.seed * 1000 + 500,
            # One shared random stream: episodes in turn draw from it in the same order each run.
            concurrency=1,
            base_url=url,
            out=out / "sft_data.jsonl",
            scheduler=GYMScheduler(max_turns=args.max_turns),
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = _sft_rows(report.trajectories, tokenizer)
    config = SFTConfig(
        output_dir=str(out / "sft-trainer"),
        max_steps=args.sft_steps,
        per_device_train_batch_size=8,
        learning_rate=args.sft_learning_rate,
        lr_scheduler_type="constant",
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not _cuda(),
        bf16=_bf16(),
        max_length=1024,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    target = out / "sft"
    trainer.save_model(str(target))
    return str(target)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _bf16() -> bool:
    import torch

    return _cuda() and bool(torch.cuda.is_bf16_supported())


def _train(model: str, url: str, args: argparse.Namespace, out: Path) -> tuple[str, int]:
    """GRPO with the environment server's reward; every episode logged with its step."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envsdk.integrations.trl import make_rollout_func, with_env_reward
    from envsdk.schedulers import GYMScheduler

    train_dir = out / "train"
    train_dir.mkdir(parents=True, exist_ok=True)
    reward_funcs, weights = with_env_reward()
    config = GRPOConfig(
        output_dir=str(out / "grpo-trainer"),
        max_steps=args.train_steps,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_turns * (args.max_turn_tokens + 64),
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        # Each episode's loss is averaged over its own tokens: a long failed episode then
        # weighs no more than a short success, so the shared reply format is not pushed down.
        loss_type="grpo",
        # A KL term to the warm-started model: without it, a group whose eight episodes all
        # fail gives no gradient, so a drift away from the reply format is never pulled back.
        beta=args.beta,
        reward_weights=weights,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not _cuda(),
        bf16=_bf16(),
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        chat_template_kwargs={"enable_thinking": False},
    )

    def env_config(prompt: list[dict[str, Any]], seed: int) -> dict[str, Any]:
        return {"name": "remote", "base_url": url, "seed": seed}

    rollout = make_rollout_func(
        GYMScheduler(max_turns=args.max_turns),
        max_turn_tokens=args.max_turn_tokens,
        seed=args.seed * 1000,
        env_config_fn=env_config,
        completions=train_dir / "completions.jsonl",  # every training episode, with the step it fed
    )

    rows = args.train_steps * args.batch_size
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Play FrozenLake."}]}] * rows)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model),
        rollout_func=rollout,
    )
    trainer.train()
    with (train_dir / "log.jsonl").open("w", encoding="utf-8") as history:
        for entry in trainer.state.log_history:
            history.write(json.dumps(entry) + "\n")
    target = out / "grpo"
    trainer.save_model(str(target))
    return str(target), int(trainer.state.global_step)


def _plots(out: Path) -> list[Path]:
    from envsdk.report import write_comparison, write_report

    report_dir = out / "report"
    compare = write_comparison(
        [out / "before" / "completions.jsonl", out / "after" / "completions.jsonl"], report_dir / "compare.png"
    )
    training = write_report(out / "train" / "completions.jsonl", report_dir / "train")
    return [compare, training.plots.get("training", training.html)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All six phases; returns the summary printed as the last line."""
    started = time.perf_counter()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    _check_dependencies()
    if args.model is not None:
        _check_loadable(args.model, args.use_vllm)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not _cuda():
        # Two cores shared with the environment server: one thread trains fastest.
        torch.set_num_threads(1)

    from envsdk.adapters import env_app
    from envsdk.envs.frozen_lake import FrozenLakeEnv, FrozenLakeGame
    from envsdk.testing import running_server

    FrozenLakeGame.from_map(args.map)  # a bad --map fails here, not in every episode
    layout = args.map

    class FixedLake(FrozenLakeEnv):
        """FrozenLake on the run's fixed map, whatever the row asks."""

        def __init__(self, env_config: dict[str, Any] | None = None) -> None:
            super().__init__({**(env_config or {}), "map": layout})

    _phase(1, "model")
    model = args.model
    if model is None:
        from envsdk.tiny_model import build_tiny_model

        model = str(build_tiny_model(out / "tiny", seed=args.seed))
    eval_seeds = range(EVAL_SEED_BASE + args.seed * 1000, EVAL_SEED_BASE + args.seed * 1000 + args.eval_episodes)
    sessions = max(args.batch_size, 8)
    with running_server(env_app(FixedLake, env_name=ENV_NAME, max_concurrent_envs=sessions)) as url:
        _phase(2, f"warm start: SFT on {args.sft_episodes} random-policy episodes (format only)")
        sft_model = _warm_start(model, url, args, out)
        _phase(3, f"evaluate before GRPO: seeds {eval_seeds.start}..{eval_seeds.stop - 1}")
        before = _evaluate(sft_model, url, eval_seeds, args, out / "before")
        _phase(4, f"GRPO: {args.train_steps} steps of {args.batch_size} episodes, reward from the server")
        grpo_model, steps = _train(sft_model, url, args, out)
        _phase(5, f"evaluate after GRPO: seeds {eval_seeds.start}..{eval_seeds.stop - 1}")
        after = _evaluate(grpo_model, url, eval_seeds, args, out / "after")
    _phase(6, "plots")
    for path in _plots(out):
        print(f"wrote {path}", file=sys.stderr)
    return {
        "env": f"{ENV_NAME}:{args.map}",
        "eval_seeds": [eval_seeds.start, eval_seeds.stop - 1],
        "before": before,
        "after": after,
        "train_steps": steps,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary = run(args)
    except LoadError as exc:
        print(f"learn_cpu: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
