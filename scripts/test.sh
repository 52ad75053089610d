#!/usr/bin/env bash
# Set up everything the tests need, from this project's own files, then run the whole suite:
# the main tests in .venv, then the ms-swift plugin tests in their own .venv-swift
# (skip those with ENVSDK_SKIP_SWIFT=1). Arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,train,ray"
# The web page is tested in a real headless browser: Debian's chromium and its driver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "warning: chromium/chromedriver missing and cannot be installed here; browser tests will skip" >&2
  fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [ -z "${ENVSDK_SKIP_SWIFT:-}" ]; then
  bash scripts/test_swift.sh
fi
