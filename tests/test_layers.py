"""The import layers drawn in the README's map hold: `lint-imports` checks the contracts in
pyproject.toml (`[tool.importlinter]`) over envsdk and servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.mark.timeout(300)
def test_import_layer_contracts_are_kept() -> None:
    assert LINT_IMPORTS.exists(), "lint-imports comes with the test extra (import-linter)"
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout
