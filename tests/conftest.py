"""Fixtures shared by the top-level tests (the subfolders keep their own conftest files)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

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
