"""An OpenEnv `Environment` that overrides ``reset_async`` / ``step_async`` is served through
them, as OpenEnv 0.10's server does (it calls the async variant when the class overrides the
base's), on the session's lane thread (never the server's loop) under the call's deadline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from envsdk.client import EnvClient
from envsdk.errors import EnvTimeoutError
from envsdk.server import create_app
from envsdk.testing import running_server

from .openenv_async_envs import A, O, OEnv

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def url() -> Iterator[str]:
    with running_server(create_app(OEnv, A, O, max_concurrent_envs=4), log_config=None) as base_url:
        yield base_url


def _server_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name.startswith("uvicorn-") and t.ident is not None}


async def test_ws_reset_and_step_run_the_overridden_async_methods_on_one_lane_loop(url: str) -> None:
    async with EnvClient(url) as env:
        reset = await env.reset(seed=7)
        assert reset.observation["text"] == "ASYNC reset 7"
        step = await env.step({"message": "hi"})
        assert step.observation["text"] == "ASYNC step hi"
        again = await env.step({"message": "again"})
        assert (await env.state())["step_count"] == 2
    # The env's coroutines ran on one thread that is not the server's, on one loop of its own.
    threads = {reset.observation["thread"], step.observation["thread"], again.observation["thread"]}
    loops = {reset.observation["loop"], step.observation["loop"], again.observation["loop"]}
    assert len(threads) == 1 and len(loops) == 1
    assert not threads & _server_threads()


def test_a_plain_openenv_client_and_the_http_routes_get_the_async_answers(url: str) -> None:
    client = GenericEnvClient(base_url=url).sync()
    try:
        assert client.reset(seed=3).observation["text"] == "ASYNC reset 3"
        result = client.step({"message": "end"})
        assert result.observation["text"] == "ASYNC step end" and result.done is True
    finally:
        client.close()
    assert httpx.post(url + "/reset", json={"seed": 5}, timeout=10).json()["observation"]["text"] == "ASYNC reset 5"
    body: Any = httpx.post(url + "/step", json={"action": {"message": "x"}}, timeout=10).json()
    assert body["observation"]["text"] == "ASYNC step x"


async def test_a_step_async_past_its_deadline_times_out_and_a_reset_starts_afresh(url: str) -> None:
    async with EnvClient(url) as env:
        await env.reset(seed=1)
        with pytest.raises(EnvTimeoutError):
            await env.step({"message": "hang"})
        assert (await env.reset(seed=2)).observation["text"] == "ASYNC reset 2"
        assert (await env.step({"message": "ok"})).observation["text"] == "ASYNC step ok"


async def test_a_step_async_written_off_by_its_deadline_is_cancelled_and_its_thread_freed(url: str) -> None:
    """A coroutine can be stopped where a thread cannot: an hour-long await past its deadline
    held its lane thread (one of the server's abandoned-thread slots) for the hour."""
    import asyncio
    import time

    async with EnvClient(url) as env:
        await env.reset(seed=1)
        with pytest.raises(EnvTimeoutError):
            await env.step({"message": "hang-for-an-hour"})
    deadline = time.monotonic() + 10
    while True:
        async with httpx.AsyncClient() as http:
            health = (await http.get(url + "/health", timeout=5)).json()
        if health["abandoned_threads"] == 0:
            break
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.1)
    async with EnvClient(url) as env:  # the server serves on
        await env.reset(seed=2)
        assert (await env.step({"message": "ok"})).observation["text"] == "ASYNC step ok"
