"""OpenEnvWrapper: a blocking facade whose instances all share one background loop thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envsdk.client import OpenEnvWrapper
from envsdk.client.sync import background_loop
from envsdk.errors import EnvTimeoutError, SessionLostError
from envsdk.testing import running_server

from envsdk.testing.openenv_echo import make_openenv_app

pytestmark = pytest.mark.timeout(60)


def non_executor_threads() -> set[threading.Thread]:
    # asyncio.to_thread's default executor names its workers "asyncio_N"; they belong to the
    # caller's loop, not to the wrappers.
    return {t for t in threading.enumerate() if not t.name.startswith("asyncio_")}


def play(wrapper: OpenEnvWrapper, n: int) -> tuple[int, list[str]]:
    wrapper.connect()
    wrapper.reset()
    echoed = [wrapper.step({"message": f"m{n}-{i}"}).observation["echoed_message"] for i in range(3)]
    return wrapper.state()["step_count"], echoed


async def test_fifty_wrappers_through_to_thread_add_at_most_one_thread(subprocess_server_url: str) -> None:
    before = non_executor_threads()
    wrappers = [OpenEnvWrapper(subprocess_server_url, call_timeout=30) for _ in range(50)]
    results = await asyncio.gather(*(asyncio.to_thread(play, w, n) for n, w in enumerate(wrappers)))
    added = non_executor_threads() - before
    assert len(added) <= 1, added
    assert all(t.name == "envsdk-client-loop" for t in added)
    assert results == [(3, [f"m{n}-{i}" for i in range(3)]) for n in range(50)]
    assert all(w.server_kind == "envsdk" for w in wrappers)
    assert len({w.session_id for w in wrappers}) == 50
    await asyncio.gather(*(asyncio.to_thread(w.close) for w in wrappers))
    assert non_executor_threads() - before == added


def test_wrapper_is_a_blocking_context_manager() -> None:
    with running_server(make_openenv_app()) as url:
        with OpenEnvWrapper(url) as env:
            assert env.server_kind == "openenv"
            assert env.reset().observation["echoed_message"] == "ready"
            assert env.step({"message": "hi"}).reward == pytest.approx(0.2)
            assert env.state()["step_count"] == 1
        with pytest.raises(SessionLostError):
            env.step({"message": "after close"})


def test_call_timeout_raises_a_typed_timeout() -> None:
    with running_server(make_openenv_app()) as url:
        env = OpenEnvWrapper(url, call_timeout=0.3)
        env.reset()
        with pytest.raises(EnvTimeoutError):
            env.step({"message": "sleep:1.0"})
        # The cancelled call left the socket with an unread reply: the session is lost, not reused.
        env.call_timeout = 5
        with pytest.raises(SessionLostError):
            env.state()
        env.close()


def test_calling_from_the_loop_thread_is_refused() -> None:
    with running_server(make_openenv_app()) as url:
        env = OpenEnvWrapper(url)

        async def inside() -> None:
            env.state()

        future = asyncio.run_coroutine_threadsafe(inside(), background_loop())
        with pytest.raises(RuntimeError, match="own event loop"):
            future.result(5)


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_a_call_timeout_that_is_no_time_is_refused_at_once(timeout: float) -> None:
    """Accepted, it timed out every call (after sending it)."""
    with pytest.raises(ValueError, match="call_timeout"):
        OpenEnvWrapper("http://127.0.0.1:9", call_timeout=timeout)
