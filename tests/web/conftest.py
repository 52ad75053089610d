"""One real Sudoku server on 127.0.0.1 for the whole web test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envsdk.testing import running_server


@pytest.fixture(scope="package")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=16)) as url:
        yield url
