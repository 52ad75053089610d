"""Device check: a few GRPO steps of examples/train_grpo_sudoku.py with vLLM colocate on one GPU.

Prints the versions in play, steps/s and the rewards of every step, as text and as one JSON line
(``GPU_CHECK {...}``), and writes the JSON to ``$OUT/gpu_check.json`` when ``OUT`` is set.
Run it through bench/gpu_check.sh, which builds the environment it needs.

    python bench/gpu_check.py --model Qwen/Qwen3-0.6B --steps 5
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("MODEL", "Qwen/Qwen3-0.6B"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--adapter", choices=["rollout_func", "environment_factory"], default="rollout_func")
    parser.add_argument("--vllm-mode", choices=["colocate", "server"], default="colocate")
    args = parser.parse_args()

    versions = {}
    for name in ("torch", "vllm", "trl", "transformers", "envsdk"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    print(f"gpu_check: {torch.cuda.get_device_name(0)}; versions {versions}", flush=True)

    example = runpy.run_path(str(ROOT / "examples" / "train_grpo_sudoku.py"), run_name="gpu_check")
    argv = [
        "--model", args.model,
        "--adapter", args.adapter,
        "--use-vllm", "--vllm-mode", args.vllm_mode,
        "--vllm-gpu-memory-utilization", "0.35",
        "--max-steps", str(args.steps),
        "--batch-size", "8",
        "--num-generations", "8",
        "--max-completion-length", "1536",
        "--max-turn-tokens", "64",
        "--max-turns", "8",
        "--learning-rate", "1e-6",
        "--output-dir", "/tmp/gpu_check_run",
    ]
    started = time.perf_counter()
    summary = example["main"](argv)
    summary.update(
        device=torch.cuda.get_device_name(0),
        versions=versions,
        model=args.model,
        adapter=args.adapter,
        vllm_mode=args.vllm_mode,
        wall_s=time.perf_counter() - started,
        max_memory_gib=torch.cuda.max_memory_allocated() / 2**30,
    )
    line = json.dumps(summary, default=str)
    print("GPU_CHECK " + line, flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
