"""Real envsdk echo servers on 127.0.0.1 for the pool tests, fresh for each test (so no
session left by one test skews another's load)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server


def echo_app(max_sessions: int) -> object:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=max_sessions)


@pytest.fixture
def echo_servers() -> Iterator[Callable[..., list[str]]]:
    """``start(*capacities)`` starts one echo server per capacity and returns their base URLs."""
    with contextlib.ExitStack() as stack:

        def start(*capacities: int) -> list[str]:
            return [stack.enter_context(running_server(echo_app(c))) for c in capacities]

        yield start


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    """A local Ray runtime for one test module (the tests that use it import ray or skip)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    try:
        yield
    finally:
        ray.shutdown()
