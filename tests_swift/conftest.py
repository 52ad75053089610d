"""Fixtures for the ms-swift plugin tests: the plugins loaded the way ``--external_plugins``
loads them, real envsdk Sudoku and coding servers on 127.0.0.1, and a locally trained tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from envsdk.testing import running_server

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "swift"


def load_plugin(name: str) -> ModuleType:
    """Import ``examples/swift/<name>`` with ms-swift's own ``--external_plugins`` loader."""
    from swift.utils import import_external_file

    module: ModuleType = import_external_file(str(EXAMPLES / name))
    return module


@pytest.fixture(scope="session")
def sudoku_plugin() -> ModuleType:
    return load_plugin("sudoku_scheduler.py")


@pytest.fixture(scope="session")
def frozen_lake_plugin() -> ModuleType:
    return load_plugin("frozen_lake_plugin.py")


@pytest.fixture(scope="session")
def coding_plugin() -> ModuleType:
    from swift.utils import import_external_file

    module: ModuleType = import_external_file(str(EXAMPLES.parent / "coding_swift_plugin.py"))
    return module


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from envsdk.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app
    from servers.sudoku.environment import BoardPool

    pool = BoardPool(workers=1)  # one board process is plenty here, and it is ours to stop
    try:
        with running_server(create_sudoku_app(board_pool=pool, max_concurrent_envs=16)) as url:
            yield url
    finally:
        pool.shutdown()


@pytest.fixture(scope="module")
def coding_url() -> Iterator[str]:
    from servers.coding import create_coding_app

    # provider "auto": bubblewrap where `bwrap` is installed, else the plain-process provider.
    app = create_coding_app(provider="auto", warm=2, max_concurrent_envs=8)
    try:
        with running_server(app) as url:
            yield url
    finally:
        app.state.envsdk_sandbox_pool.close()


def active_sessions(url: str) -> int:
    """The server's open sessions, once closes sent just before have landed (bounded wait)."""
    import time

    deadline = time.monotonic() + 5.0
    while True:
        health = httpx.get(f"{url}/health", timeout=5.0).json()
        if health["active_sessions"] == 0 or time.monotonic() > deadline:
            return int(health["active_sessions"])
        time.sleep(0.05)
