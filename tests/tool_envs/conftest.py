"""Servers for the MCP tests, each on 127.0.0.1 and stopped at teardown: envsdk serving the
envsdk-native ledger and an OpenEnv `MCPEnvironment`, and OpenEnv's own server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastmcp")
pytest.importorskip("openenv")

from envsdk.server import create_app
from envsdk.testing import running_server
from examples.ledger_tools import create_ledger_app

from .envs import CallToolAction, CallToolObservation, TallyMCPEnvironment


@pytest.fixture(scope="module")
def ledger_url() -> Iterator[str]:
    with running_server(create_ledger_app(max_concurrent_envs=8, mode="production")) as url:
        yield url


@pytest.fixture(scope="module")
def tally_url() -> Iterator[str]:
    app = create_app(TallyMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8, mode="production")
    with running_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def openenv_tally_url() -> Iterator[str]:
    from openenv.core.env_server.http_server import create_app as openenv_create_app

    app = openenv_create_app(TallyMCPEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8)
    with running_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    from envsdk.testing import EchoAction, EchoObservation

    from .envs import SlowToolsEnvironment

    app = create_app(SlowToolsEnvironment, EchoAction, EchoObservation, max_concurrent_envs=2)
    with running_server(app) as url:
        yield url
