#!/usr/bin/env bash
# Run OpenEnv's own server tests with OpenEnv's server swapped for envsdk's (test bodies unchanged).
#
#   bash scripts/openenv_upstream/run.sh /path/to/OpenEnv [pytest args]
#
# /path/to/OpenEnv is a checkout of github.com/meta-pytorch/OpenEnv (its tests/ and envs/ are
# used in place; nothing is copied into this repository). sitecustomize.py, put first on
# PYTHONPATH with ENVSDK_SHIM=1, replaces openenv's create_app, create_fastapi_app and
# HTTPEnvServer with envsdk-backed ones in every process, subprocess servers included.
# ENVSDK_SHIM=0 runs the same tests against OpenEnv's own server, for comparison.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
openenv="$(cd "$1" && pwd)"
shift
files=(
  tests/core/test_production_mode_mcp.py
  tests/core/test_mcp/test_mcp_integration.py
  tests/core/test_production_mode_routes.py
  tests/core/test_simulation_mode_preserves_api.py
  tests/envs/test_websockets.py
)
cd "$openenv"
ENVSDK_SHIM="${ENVSDK_SHIM:-1}" PYTHONPATH="$here:$repo:$openenv:$openenv/envs" \
  "$repo/.venv/bin/python" -m pytest -p no:cacheprovider -o asyncio_mode=auto --timeout 120 -q "${files[@]}" "$@"
