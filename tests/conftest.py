"""Fixtures shared by the top-level tests (the subfolders keep their own conftest files)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envsdk.registry import envs
from envsdk.testing import running_server


@pytest.fixture
def clean_envs() -> Iterator[None]:
    """Forget the envs and plugin modules a test added, so tests do not see each other's plugins."""
    names, modules = set(envs), set(sys.modules)
    yield
    for name in set(envs) - names:
        del envs[name]
    for module in set(sys.modules) - modules:
        if module.startswith("envsdk_plugin_"):
            del sys.modules[module]


@pytest.fixture(scope="module")
def textarena_url() -> Iterator[str]:
    """A real TextArena server of GuessTheNumber-v0 (offline, one game worker) for a module's tests."""
    from servers.textarena.app import create_textarena_app
    from servers.textarena.pool import GamePool

    pool = GamePool(workers=1)
    try:
        with running_server(create_textarena_app("GuessTheNumber-v0", game_pool=pool, max_concurrent_envs=8)) as url:
            yield url
    finally:
        pool.shutdown()


#: Test files whose verdicts rest on having the machine to themselves: rates held over windows,
#: deadlines and latencies measured against the clock, memory of the whole process, CPU shares.
#: They are marked ``serial``; ``scripts/test.sh`` runs them alone, after the parallel phase.
SERIAL: tuple[str, ...] = (
    "perf/",  # benchmark harnesses: ratios and CPU shares
    "reliability/test_hardening.py",  # attack rates held over windows
    "reliability/test_lane_handoff.py",
    "reliability/test_execution_core.py",  # replies at a deadline, within 2 s
    "reliability/test_shutdown.py",
    "reliability/test_faults.py",
    "reliability/test_game_attacks.py",  # an honest session's steps/s during an attack
    "servers/test_coding_attacks.py",  # the same, against the coding server's sandboxes
    "sandbox/test_sandbox.py",  # a warm sandbox taken within 50 ms
    "scaleout/test_failover.py",  # placement beside a hung health check within 6 s
    "server/test_deadlines.py",
    "server/test_run_call.py",
    "server/test_scale.py",  # thousands of sessions, memory per session
    "server/test_idle_lanes.py",  # threads parked after an idle time
    "servers/test_coding_limits.py",  # CPU an idle attacker gets between steps
    "test_adapters.py",  # a quick step within 0.3 s beside a timed-out one
)

_TESTS = Path(__file__).parent


def is_serial(path: str) -> bool:
    """Whether test file `path` (relative to tests/, as ``server/test_scale.py``) is listed in `SERIAL`."""
    return any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in SERIAL)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests._containers import missing_for_containers

    for item in items:
        if item.path.is_relative_to(_TESTS) and is_serial(item.path.relative_to(_TESTS).as_posix()):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("containers") is not None:
            # Every container test shares the engine's store: one worker runs them, one at a time.
            item.add_marker(pytest.mark.xdist_group("containers"))
            missing = missing_for_containers()
            if missing is not None:
                item.add_marker(pytest.mark.skip(reason=missing))
    # scripts/test.sh runs the suite in two phases: "parallel" (all but the serial tests, on
    # xdist workers), then "serial" (those alone).
    phase = os.environ.get("ENVSDK_TEST_PHASE", "")
    if phase not in ("", "parallel", "serial"):
        raise pytest.UsageError(f"ENVSDK_TEST_PHASE={phase!r}: expected parallel, serial or nothing (both)")
    if phase:
        keep, dropped = [], []
        for item in items:
            (keep if (item.get_closest_marker("serial") is not None) == (phase == "serial") else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
