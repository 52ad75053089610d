#!/usr/bin/env bash
# Create ./.venv (Python 3.11 where available) and install envsdk with the extras given as $1
# (comma-separated, e.g. "test,hf"). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1; then py="$candidate"; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
case ",$extras," in
  *,hf,*|*,train,*)
    # torch first and pinned: pip then takes the CPU build that lies on disk here instead of
    # resolving a multi-GB CUDA build for transformers. GPU users install their own torch.
    if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
      .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    fi
    ;;
esac
# setuptools' editable-install notice is advice for package authors, not for a user installing.
export PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
else
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
fi
