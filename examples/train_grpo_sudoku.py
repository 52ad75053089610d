"""GRPO on TextArena Sudoku with TRL's GRPOTrainer and an envsdk Sudoku server.

On a GPU machine, with vLLM generating inside the training process:

    python examples/train_grpo_sudoku.py --model Qwen/Qwen3-0.6B --use-vllm --vllm-mode colocate

On CPU with a local tiny model (``python -m envsdk.tiny_model tiny``), offline:

    HF_HUB_OFFLINE=1 python examples/train_grpo_sudoku.py --model ./tiny --cpu --max-steps 3

Two adapters (``--adapter``):

* ``rollout_func`` (default): envsdk's `SudokuScheduler` plays whole games, the model replying
  ``[row col number]`` each turn; the board and hints between turns are kept in context but
  masked from the loss. Works with any chat model.
* ``environment_factory``: TRL runs the game through tool calls to ``place(row, col,
  number)``; needs a chat template with tool calling (Qwen3, Llama 3.1, …).

Without ``--base-url`` a Sudoku server is started in this process, sized for the run
(MAX_CONCURRENT_ENVS = the sessions the run holds at once). The reward is the scheduler's
total of its five components (empty_cell, valid_move, repetition, progress, correct), each
also logged as ``rewards/<component>/mean``.

Leaves in ``--output-dir``: ``final/`` (the trained model and its tokenizer, loadable with
``--model``) and, with ``rollout_func``, ``completions.jsonl`` (every training episode with the
step it fed; ``envsdk report`` plots it). An ``--output-dir`` that holds an earlier run's
``final/`` or records is refused, as transformers' example scripts refuse a used output folder:
``--overwrite-output-dir`` removes them first, so that the model and the records beside it are
always one run's.

``--sudoku-hints`` says what the messages show beside the board (`envsdk.schedulers.sudoku`):
``rejected`` (the default: the moves the game rejected), ``none``, or ``all`` (ms-swift's hints,
moves of the solution among them, which make the reward easier to earn than the game).

Without the ``train`` extra (torch, transformers, trl, datasets) it says so in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envsdk.schedulers.sudoku import DEFAULT_HINTS, HINT_LEVELS

PROGRAM = "train_grpo_sudoku.py"

SYSTEM_PROMPT = (
    "You are playing Sudoku. Fill the empty cells ('.') so that every row, every column and every 3x3 box "
    "contains the digits 1-9 exactly once. Never overwrite a filled cell."
)
REPLY_FORMAT = "Each turn, reply with exactly one move in the format [row column number], for example [5 3 7]."
TOOL_FORMAT = "Make one move at a time by calling the place tool."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="hub id or local directory")
    parser.add_argument("--adapter", choices=["rollout_func", "environment_factory"], default="rollout_func")
    parser.add_argument("--base-url", default=None, help="a running Sudoku server (default: start one here)")
    parser.add_argument("--env-id", default="Sudoku-v0", help="TextArena variant for the embedded server")
    parser.add_argument("--cpu", action="store_true", help="train on CPU (fp32, one process)")
    parser.add_argument("--use-vllm", action="store_true", help="generate with vLLM")
    parser.add_argument("--vllm-mode", choices=["colocate", "server"], default="colocate")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=2048, help="model and environment tokens")
    parser.add_argument("--max-turn-tokens", type=int, default=256, help="tokens of one model turn (rollout_func)")
    parser.add_argument("--max-turns", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--env-weight", type=float, default=1.0, help="weight of the environment's reward column")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/grpo-sudoku")
    parser.add_argument(
        "--overwrite-output-dir", action="store_true",
        help="replace an earlier run's final/ and completions in --output-dir (without it they are refused)",
    )
    parser.add_argument(
        "--sudoku-hints", choices=HINT_LEVELS, default=DEFAULT_HINTS,
        help="what the messages show beside the board: none, rejected (the moves the game rejected), or all "
        "(also GUARANTEED MOVES: moves of the solution, which make the reward easier to earn than the game)",
    )
    return parser.parse_args(argv)


def fail(message: str, code: int = 2) -> None:
    """End the program with one line on stderr (2: a usage error, 1: a missing dependency)."""
    print(f"{PROGRAM}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def earlier_run(output_dir: Path) -> list[Path]:
    """What an earlier run left in `output_dir`: its model (``final/``) and its records."""
    found = [output_dir / "final"] if (output_dir / "final").exists() else []
    return found + sorted(output_dir.glob("completions*.jsonl"))


def check_output_dir(args: argparse.Namespace) -> list[Path]:
    """What an earlier run left in --output-dir, to remove once training can start; refused
    (without --overwrite-output-dir): a new ``final/`` beside the old run's records would pass
    for one run."""
    output_dir = Path(args.output_dir)
    previous = earlier_run(output_dir)
    if previous and not args.overwrite_output_dir:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in previous)
        fail(
            f"--output-dir {output_dir} holds an earlier run ({names}): give another --output-dir, or "
            "--overwrite-output-dir to replace it"
        )
    return previous


def remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


@contextlib.contextmanager
def sudoku_server(args: argparse.Namespace, sessions: int) -> Iterator[str]:
    """The server to train against: `--base-url`, or one started here for `sessions` sessions."""
    if args.base_url:
        yield args.base_url
        return
    from envsdk.testing import running_server
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(args.env_id, max_concurrent_envs=sessions)) as url:
        yield url


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; return a summary (steps, seconds, steps/s, the logged rewards per step)."""
    args = parse_args(argv)
    earlier = check_output_dir(args)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        import torch
        from datasets import Dataset
        from transformers import AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        from envsdk.integrations.trl import (
            SUDOKU_REWARD_COMPONENTS,
            make_rollout_func,
            required_env_sessions,
            reward_component_funcs,
            sudoku_environment_factory,
            with_env_reward,
        )
    except ImportError as exc:
        from envsdk.cli import missing_extra

        hint = missing_extra(exc)
        if hint is None:
            raise
        fail(hint, 1)
    remove(earlier)  # only now: a run that cannot start leaves the earlier one as it was
    from envsdk.schedulers import SudokuScheduler

    if args.cpu:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    components = reward_component_funcs()
    use_tools = args.adapter == "environment_factory"
    if use_tools:
        # TRL adds the environment's get_reward column itself (last, weight 1).
        reward_funcs: list[Any] = list(components)
        weights = [0.0] * len(components)
    else:
        reward_funcs, weights = with_env_reward(components, [0.0] * len(components), args.env_weight)
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
    prompt = [{"role": "system", "content": f"{SYSTEM_PROMPT} {TOOL_FORMAT if use_tools else REPLY_FORMAT}"}]
    rows = max(args.max_steps, 1) * args.batch_size
    if use_tools:
        dataset = Dataset.from_list([{"prompt": [*prompt, {"role": "user", "content": ""}], "seed": i} for i in range(rows)])
    else:
        dataset = Dataset.from_list([{"prompt": [*prompt, {"role": "user", "content": "Start."}]}] * rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # Every training episode (rollout_func), with the step it fed: `envsdk report` plots it.
    completions = os.path.join(args.output_dir, "completions.jsonl")
    # rollout_func: the episodes in a batch at once; environment_factory: TRL's pool.
    sessions = required_env_sessions(config)
    with sudoku_server(args, sessions) as url:
        if use_tools:
            factory = sudoku_environment_factory(url, max_turns=args.max_turns, hints=args.sudoku_hints)
            trainer = GRPOTrainer(
                model=args.model,
                reward_funcs=reward_funcs,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                environment_factory=factory,
                callbacks=[factory.callback()],
            )
        else:
            scheduler = SudokuScheduler(
                base_url=url, max_turns=args.max_turns, system_message=prompt[0]["content"], max_concurrent_envs=64,
                hints=args.sudoku_hints,
            )
            trainer = GRPOTrainer(
                model=args.model,
                reward_funcs=reward_funcs,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                rollout_func=make_rollout_func(
                    scheduler, max_turn_tokens=args.max_turn_tokens, seed=args.seed, completions=completions
                ),
            )
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
        saved = os.path.join(args.output_dir, "final")
        trainer.save_model(saved)  # weights, config and tokenizer: loadable with --model {saved}
    env_key = "rewards/SudokuToolEnvironment/mean" if use_tools else "rewards/env_reward_func/mean"
    history = [h for h in trainer.state.log_history if env_key in h]
    print(f"model saved to {saved}" + ("" if use_tools else f"; episodes in {completions} (envsdk report {completions})"))
    summary: dict[str, Any] = {
        "model": saved,
        "completions": None if use_tools else completions,
        "steps": trainer.state.global_step,
        "seconds": seconds,
        "steps_per_s": trainer.state.global_step / seconds if seconds else 0.0,
        "env_reward": [h[env_key] for h in history],
        **{name: [h.get(f"rewards/{name}/mean") for h in history] for name in SUDOKU_REWARD_COMPONENTS},
    }
    print(f"{summary['steps']} steps in {seconds:.1f} s ({summary['steps_per_s']:.3f} steps/s)")
    for i, h in enumerate(history, 1):
        # A part TRL logged as None (no episode of the step gave it) is no 0: said as n/a.
        parts = " ".join(f"{name}={logged(h.get(f'rewards/{name}/mean'))}" for name in SUDOKU_REWARD_COMPONENTS)
        print(f"step {i}: env_reward={logged(h[env_key])} {parts}")
    return summary


def logged(value: Any) -> str:
    """A logged mean as printed: signed, 3 decimals; ``n/a`` where TRL logged none (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):+.3f}"


if __name__ == "__main__":
    main()
