"""How the suite runs side by side (scripts/test.sh): the xdist group that keeps every container
test on one worker holds with the pytest and pytest-xdist installed, and the serial phase
collects exactly the files listed as serial."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SERIAL, is_serial

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]


def test_an_xdist_group_runs_on_one_worker_with_the_installed_pytest(tmp_path: Path) -> None:
    """pytest 9.2 stopped honouring group marks (each test of a group went to any worker): the
    container tests would then share the engine's store at once."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, time, pytest\n"
        "@pytest.mark.xdist_group('g')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    time.sleep(0.1)\n"
        "    with open('workers.txt', 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    time.sleep(0.1)\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = (tmp_path / "workers.txt").read_text(encoding="utf-8").split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers


def test_the_serial_phase_collects_the_serial_files_and_nothing_else() -> None:
    env = {**os.environ, "ENVSDK_TEST_PHASE": "serial"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = {line.split("::", 1)[0].removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line}
    assert files, done.stdout[-2000:]
    for entry in SERIAL:
        # Each entry still names tests (a renamed file would silently run beside the others).
        assert any(f == entry or f.startswith(entry) for f in files), (entry, sorted(files))
    for found in files:
        assert is_serial(found), found
