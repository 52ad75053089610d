#!/usr/bin/env bash
# Device check for the TRL integration: a few GRPO steps of examples/train_grpo_sudoku.py with
# vLLM colocate on one GPU, printing steps/s and the rewards (bench/gpu_check.py).
#
# Builds its own virtual environment (.venv-gpu, reusing the machine's CUDA torch through
# --system-site-packages) and installs envsdk[train,vllm] into it:
#   * from the package registry when it is reachable;
#   * else from wheels in $WHEELS (pip install --no-index --find-links "$WHEELS").
# The model is a hub id (needs the Hub or a filled HF cache) or a local directory: MODEL=...
#
#   bash bench/gpu_check.sh                       # Qwen/Qwen3-0.6B, 5 steps
#   MODEL=/models/Qwen3-0.6B STEPS=3 bash bench/gpu_check.sh
#
# Every stage is bounded by `timeout`, so the script ends inside ~9 minutes whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
STEPS="${STEPS:-5}"
VENV="${VENV:-.venv-gpu}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
if [ -n "${WHEELS:-}" ]; then
  timeout 300 "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" -e ".[train,vllm]"
else
  timeout 420 "$VENV/bin/python" -m pip install -q -e ".[train,vllm]"
fi
"$VENV/bin/python" -m pip list 2>/dev/null | grep -Ei '^(torch|vllm|trl|transformers|envsdk) ' || true

if [ -d "$MODEL" ] || [ -n "${HF_HUB_OFFLINE:-}" ]; then
  export HF_HUB_OFFLINE=1
fi
timeout 480 "$VENV/bin/python" bench/gpu_check.py --model "$MODEL" --steps "$STEPS"
