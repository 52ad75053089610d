"""The real OpenEnv client works against an envsdk server."""

from __future__ import annotations

import asyncio

import pytest
from openenv.core.generic_client import GenericEnvClient

from .helpers import wait_for_active


@pytest.mark.timeout(30)
def test_openenv_sync_client_resets_steps_reads_state_and_closes(serve_echo):
    url = serve_echo(max_concurrent_envs=4)
    client = GenericEnvClient(base_url=url).sync()
    try:
        first = client.reset(seed=3, episode_id="ep-7")
        assert first.observation["echoed_message"] == "ready"
        assert first.done is False
        result = client.step({"message": "hello"})
        assert result.observation["echoed_message"] == "hello"
        assert result.reward == pytest.approx(0.5)
        assert result.metadata == {"step": 1}
        state = client.state()
        assert state["episode_id"] == "ep-7" and state["step_count"] == 1
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"msg": "wrong field"})
        assert client.step({"message": "after error"}).observation["message_length"] == 11
    finally:
        client.close()
    assert wait_for_active(url, 0) == 0


@pytest.mark.timeout(30)
async def test_openenv_async_client_sees_capacity_reached(serve_echo):
    url = serve_echo(max_concurrent_envs=1)
    holder = GenericEnvClient(base_url=url)
    await holder.connect()
    try:
        await holder.reset()
        second = GenericEnvClient(base_url=url)
        try:
            # OpenEnv's client raises RuntimeError("Server error: <message> (code: <code>)") for an error frame.
            with pytest.raises(RuntimeError, match=r"Server at capacity: 1/1 sessions.*\(code: CAPACITY_REACHED\)"):
                await second.connect()
                await second.reset()
        finally:
            await second.close()
    finally:
        await holder.close()
    await asyncio.to_thread(wait_for_active, url, 0)
