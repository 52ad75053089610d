#!/usr/bin/env bash
# The main job: set up, then play Sudoku episodes with the built-in oracle policy through the
# scheduler against an embedded TextArena Sudoku server; progress bar, then a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh ""
exec .venv/bin/envsdk rollout --env sudoku --policy oracle --episodes 64 --concurrency 16 --out runs/completions.jsonl "$@"
