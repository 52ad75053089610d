"""The envsdk client against a server built with OpenEnv's own `create_app` (real sockets):
plain OpenEnv behaviour, no ids, no resume, and never a silent new session."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from envsdk.client import EnvClient, Keepalive, Retry, Timeouts
from envsdk.errors import CapacityError, ServerError, SessionLostError
from envsdk.testing import EchoAction, EchoObservation, running_server

from envsdk.testing.openenv_echo import make_openenv_app

pytestmark = pytest.mark.timeout(30)


async def test_episode_against_openenv_server(openenv_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="envsdk.client")
    client = EnvClient(openenv_url)
    await client.connect()
    assert client.server_kind == "openenv"
    assert client.resumable is False
    assert client.session_id is None
    warnings = [r for r in caplog.records if "plain OpenEnv" in r.getMessage()]
    assert len(warnings) == 1

    first = await client.reset(seed=3)
    assert first.observation == {"echoed_message": "ready", "message_length": 0, "metadata": {}}
    assert (first.reward, first.done) == (0.0, False)
    # OpenEnv answers VALIDATION_ERROR to any unknown top-level key: a step that succeeds
    # proves no request id was sent.
    result = await client.step({"message": "hello"})
    assert result.observation["echoed_message"] == "hello"
    assert (result.reward, result.done) == (0.5, False)
    assert result.metadata == {"step": 1}
    await client.step(EchoAction(message="done"))
    state = await client.state()
    assert state["step_count"] == 2
    await client.close()
    await client.close()  # idempotent
    with pytest.raises(SessionLostError, match="closed"):
        await client.state()


async def test_typed_observations_and_actions(openenv_url: str) -> None:
    async with EnvClient(openenv_url, action_type=EchoAction, observation_type=EchoObservation) as client:
        await client.reset()
        result = await client.step({"message": "done"})
        assert isinstance(result.observation, EchoObservation)
        assert result.observation.echoed_message == "done"
        assert result.observation.done is True
        assert result.observation.reward == pytest.approx(0.4)
        with pytest.raises(ValueError, match="message"):
            await client.step({"msg": "wrong field"})


async def test_error_frame_raises_typed_error_and_session_continues(openenv_url: str) -> None:
    async with EnvClient(openenv_url) as client:
        await client.reset()
        with pytest.raises(ServerError) as info:
            await client.step({"msg": "wrong field"})
        assert info.value.code == "VALIDATION_ERROR"
        assert any(err["type"] == "extra_forbidden" for err in info.value.details["errors"])
        result = await client.step({"message": "ok"})
        assert result.metadata == {"step": 1}


async def test_capacity_is_noticed_at_connect() -> None:
    with running_server(make_openenv_app(max_concurrent_envs=1)) as url:
        async with EnvClient(url) as holder:
            await holder.reset()
            second = EnvClient(url)
            with pytest.raises(CapacityError) as info:
                await second.connect()
            assert (info.value.active_sessions, info.value.max_sessions) == (1, 1)
            assert info.value.code == "CAPACITY_REACHED"


async def test_drop_mid_episode_loses_the_session_for_good(openenv_url: str, proxy_factory: Any) -> None:
    proxy = await proxy_factory(openenv_url)
    client = EnvClient(proxy.url, keepalive=Keepalive.disabled(), retry=Retry(backoff_base=0.01))
    await client.connect()
    await client.reset()
    await client.step({"message": "a"})
    proxy.arm("reply")
    with pytest.raises(SessionLostError, match="does not support resume"):
        await client.step({"message": "b"})
    assert proxy.drops == 1
    with pytest.raises(SessionLostError, match="lost earlier"):
        await client.step({"message": "c"})
    with pytest.raises(SessionLostError):
        await client.reset()
    # It never reconnected to start a new session behind the caller's back.
    assert proxy.accepted == 1
    assert client.resumable is False
    await client.close()


async def test_reply_timeout_without_ids_loses_the_session(openenv_url: str) -> None:
    client = EnvClient(openenv_url, timeouts=Timeouts(request=0.3))
    await client.connect()
    await client.reset()
    with pytest.raises(SessionLostError, match="no reply to step"):
        await client.step({"message": "sleep:0.8"})
    # The late reply must never be read as the answer of a later request.
    with pytest.raises(SessionLostError):
        await client.state()
    await client.close()


async def test_cancelled_request_without_ids_loses_the_session(openenv_url: str) -> None:
    async with EnvClient(openenv_url) as client:
        await client.reset()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.step({"message": "sleep:0.5"}), 0.1)
        with pytest.raises(SessionLostError, match="cancelled"):
            await client.state()
