"""Fixtures of the server tests: an echo app on a real uvicorn, stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server


@pytest.fixture
def serve_echo() -> Iterator[Callable[..., str]]:
    """Start an echo server with the given ServerConfig overrides; stopped at teardown."""
    stack: list[Any] = []

    def start(**overrides: Any) -> str:
        app = create_app(EchoEnvironment, EchoAction, EchoObservation, **overrides)
        ctx = running_server(app, log_config=None)
        url = ctx.__enter__()
        stack.append(ctx)
        return url

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)
