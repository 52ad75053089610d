"""Fixtures shared by the top-level tests (the subfolders keep their own conftest files)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from envsdk.registry import envs


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
