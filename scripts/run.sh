#!/usr/bin/env bash
# The main job: set up, then play Sudoku episodes with the built-in oracle policy through the
# scheduler against an embedded TextArena Sudoku server; progress bar, then a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# The install is editable: code changes need no reinstall, only a changed pyproject.toml does.
# A stamp holding its hash lets later runs start at once.
stamp=.venv/.envsdk-run-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/envsdk ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  bash scripts/setup.sh ""
  echo "$want" > "$stamp"
fi
# Each run replaces the last one's records, unless it is asked to continue it: `--resume`.
fresh=--overwrite
for arg in "$@"; do
  if [ "$arg" = --resume ]; then fresh=; fi
done
exec .venv/bin/envsdk rollout --env sudoku --policy oracle --episodes 64 --concurrency 16 --out runs/completions.jsonl $fresh "$@"
