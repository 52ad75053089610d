"""check-env on tool environments and on OpenEnv's own Environment classes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envsdk.checker import check_env
from envsdk.testing.openenv_echo import OEEchoEnvironment
from examples.ledger_tools import LedgerEnvironment

from .envs import TallyMCPEnvironment

pytestmark = pytest.mark.timeout(120)
TOOL_RULES = ["tools.list", "tools.reserved_names", "tools.schemas", "tools.call"]


@pytest.mark.parametrize("env_class", [LedgerEnvironment, TallyMCPEnvironment])
def test_check_env_checks_the_tools_of_native_and_openenv_tool_envs(env_class: type) -> None:
    report = check_env(env_class, concurrency=2, max_steps=3)
    assert all(rule in report.passed for rule in TOOL_RULES), report
    assert "factory.returns" in report.passed and "close.idempotent" in report.passed


def test_check_env_accepts_an_openenv_environment_class_without_tools() -> None:
    report = check_env(OEEchoEnvironment, concurrency=2, max_steps=3)
    assert "factory.returns" in report.passed and "reset.returns" in report.passed
    assert not any(rule in report.passed or rule in report.skipped for rule in TOOL_RULES)


def test_check_env_cli_takes_an_openenv_class() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "envsdk.cli", "check-env", "envsdk.testing.openenv_echo:OEEchoEnvironment", "--concurrency", "2"],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "factory.returns" in out.stdout
