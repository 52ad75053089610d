"""``scripts/test.sh`` itself, run on a copy whose tools are stand-in scripts (the real suites
take half an hour): the main suite's two phases (side by side on xdist workers, then the serial
tests alone) and the ms-swift suite all run and are reported whatever the others' outcome, the
script fails if any failed, and apt waits for a lock another process holds instead of aborting."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import REPO

pytestmark = pytest.mark.timeout(60)


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body + "\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _checkout(
    tmp_path: Path, *, main_rc: int, swift_rc: int, serial_rc: int = 0, browser: bool = True,
) -> tuple[Path, dict[str, str]]:
    """A copy of test.sh beside stand-ins for setup.sh, the venv's python and test_swift.sh
    (each logs its call to calls.log); `browser` puts chromium and chromedriver on PATH."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    log = tmp_path / "calls.log"
    _script(root / "scripts" / "setup.sh", f'echo "setup $*" >> {log}')
    _script(
        root / ".venv" / "bin" / "python",
        f'echo "pytest $ENVSDK_TEST_PHASE $*" >> {log}; '
        f'if [ "$ENVSDK_TEST_PHASE" = serial ]; then exit {serial_rc}; else exit {main_rc}; fi',
    )
    _script(root / "scripts" / "test_swift.sh", f'echo "swift" >> {log}; exit {swift_rc}')
    bin_dir = tmp_path / "bin"
    _script(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}')
    if browser:
        _script(bin_dir / "chromium", "true")
        _script(bin_dir / "chromedriver", "true")
    for basic in ("bash", "dirname", "id"):
        found = shutil.which(basic)
        assert found is not None, basic
        (bin_dir / basic).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k != "ENVSDK_SKIP_SWIFT"}
    # Only the stand-ins and the shell's basics: no real chromium, bwrap, apt-get or pytest reachable.
    env["PATH"] = str(bin_dir)
    return root, env


def _run(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "scripts" / "test.sh")], env=env, capture_output=True, text=True, timeout=50, check=False)


@pytest.mark.parametrize(
    ("main_rc", "serial_rc", "swift_rc", "reported"),
    [
        (1, 0, 0, 1), (0, 1, 0, 1), (0, 0, 1, 0), (1, 1, 1, 1), (0, 0, 0, 0),
        # A phase left with no test (pytest's 5, e.g. a -k naming only serial tests) is no failure...
        (5, 0, 0, 0), (0, 5, 0, 0),
        # ...unless both are: nothing ran at all.
        (5, 5, 0, 5),
    ],
)
def test_both_phases_and_the_swift_suite_run_and_are_reported_and_any_failing_fails_the_script(
    tmp_path: Path, main_rc: int, serial_rc: int, swift_rc: int, reported: int,
) -> None:
    root, env = _checkout(tmp_path, main_rc=main_rc, serial_rc=serial_rc, swift_rc=swift_rc)
    done = _run(root, env)
    calls = [c for c in (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines() if not c.startswith("apt-get")]
    assert [c.split()[:2] for c in calls] == [["setup", "test,train,ray"], ["pytest", "parallel"], ["pytest", "serial"], ["swift"]], calls
    parallel, serial = calls[1].split(), calls[2].split()
    # The parallel phase on xdist workers with their groups kept; the serial one in one process.
    assert parallel[parallel.index("-n") + 1] == "3" and parallel[parallel.index("--dist") + 1] == "loadgroup", calls
    assert "-n" not in serial and "--dist" not in serial, calls
    assert (done.returncode == 0) == (reported == 0 and swift_rc == 0), done
    assert f"main suite (tests/): exit status {reported}" in done.stderr, done.stderr
    assert f"ms-swift suite (tests_swift/): exit status {swift_rc}" in done.stderr, done.stderr


def test_arguments_reach_both_phases_and_the_worker_count_is_a_setting(tmp_path: Path) -> None:
    root, env = _checkout(tmp_path, main_rc=0, swift_rc=0)
    env["ENVSDK_TEST_WORKERS"] = "2"
    done = subprocess.run(
        ["bash", str(root / "scripts" / "test.sh"), "-k", "sudoku", "tests/cli"],
        env=env, capture_output=True, text=True, timeout=50, check=False,
    )
    assert done.returncode == 0, done
    calls = [c for c in (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines() if c.startswith("pytest")]
    assert len(calls) == 2 and all(c.endswith("-k sudoku tests/cli") for c in calls), calls
    assert calls[0].split()[calls[0].split().index("-n") + 1] == "2", calls


@pytest.mark.skipif(os.geteuid() != 0, reason="test.sh installs the browser with apt-get only as root")
def test_apt_waits_for_the_lock_and_a_failed_install_only_skips_the_browser_tests(tmp_path: Path) -> None:
    root, env = _checkout(tmp_path, main_rc=0, swift_rc=0, browser=False)
    done = _run(root, env)
    assert done.returncode == 0, done
    apt_calls = [c for c in (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines() if c.startswith("apt-get")]
    assert apt_calls and all("DPkg::Lock::Timeout=" in c for c in apt_calls), apt_calls
    # apt-get failing (a lock held past the wait, no network): a warning, and the suites still run.
    _script(tmp_path / "bin" / "apt-get", "echo 'E: Could not get lock /var/lib/dpkg/lock-frontend' >&2; exit 100")
    (tmp_path / "calls.log").unlink()
    failed = _run(root, env)
    assert failed.returncode == 0, failed
    assert "browser tests will skip" in failed.stderr
    ran = [c.split()[0] for c in (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines()]
    assert [c for c in ran if c != "apt-get"] == ["setup", "pytest", "pytest", "swift"], ran
