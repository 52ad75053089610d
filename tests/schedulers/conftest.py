"""Real servers on 127.0.0.1 for the scheduler tests, one per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server


@pytest.fixture(scope="module")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=128)) as url:
        yield url


@pytest.fixture(scope="module")
def openenv_sudoku_url() -> Iterator[str]:
    from servers.sudoku.openenv_style import create_openenv_style_app

    with running_server(create_openenv_style_app(max_concurrent_envs=32)) as url:
        yield url


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=64)) as url:
        yield url
