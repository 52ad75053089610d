"""The envsdk client against the envsdk server (real sockets): handshake, capacity at connect,
typed errors, and resume after dropped connections with exactly-once steps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envsdk.client import EnvClient, Keepalive, Retry, Timeouts, WebSocketTransport
from envsdk.errors import (
    CapacityError,
    EpisodeDoneError,
    NotResetError,
    RequestEncodingError,
    SessionLostError,
)
from envsdk.server import create_app
from envsdk.testing import (
    EchoAction,
    EchoEnvironment,
    EchoObservation,
    free_port,
    running_server,
)

pytestmark = pytest.mark.timeout(30)

FAST_RETRY = Retry(max_attempts=5, backoff_base=0.01, backoff_max=0.05)


def echo_app(**overrides: Any) -> Any:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, **overrides)


@pytest.fixture
def envsdk_url() -> Any:
    with running_server(echo_app(max_concurrent_envs=4)) as url:
        yield url


async def test_episode_against_envsdk_server(envsdk_url: str) -> None:
    client = EnvClient(envsdk_url, observation_type=EchoObservation)
    await client.connect()
    assert client.server_kind == "envsdk"
    assert client.resumable is True
    assert client.session_id and client.session is not None
    assert client.session.resumed is False
    first = await client.reset(seed=1)
    assert first.observation.echoed_message == "ready"
    result = await client.step(EchoAction(message="hello"))
    assert (result.observation.echoed_message, result.reward, result.done) == ("hello", 0.5, False)
    assert result.metadata == {"step": 1}
    assert (await client.state())["step_count"] == 1
    await client.close()
    assert client.resumable is False
    with pytest.raises(SessionLostError, match="closed"):
        await client.step({"message": "late"})


async def test_capacity_is_noticed_at_connect() -> None:
    with running_server(echo_app(max_concurrent_envs=1, capacity_retry_after_s=2.5)) as url:
        async with EnvClient(url) as holder:
            await holder.reset()
            with pytest.raises(CapacityError) as info:
                await EnvClient(url).connect()
            assert (info.value.active_sessions, info.value.max_sessions) == (1, 1)
            assert info.value.details["retry_after_s"] == 2.5
        # close() said goodbye: the slot is free again at once.
        async with EnvClient(url) as again:
            assert (await again.reset()).observation["echoed_message"] == "ready"


async def test_server_error_codes_raise_their_typed_errors(envsdk_url: str) -> None:
    async with EnvClient(envsdk_url) as client:
        with pytest.raises(NotResetError):
            await client.step({"message": "too early"})
        await client.reset()
        assert (await client.step({"message": "done"})).done is True
        with pytest.raises(EpisodeDoneError) as info:
            await client.step({"message": "after done"})
        assert info.value.code == "EPISODE_DONE"
        # Errors do not end the session.
        await client.reset()
        assert (await client.step({"message": "again"})).metadata == {"step": 1}


async def test_resume_after_three_drops_keeps_every_step_exactly_once(envsdk_url: str, proxy_factory: Any) -> None:
    proxy = await proxy_factory(envsdk_url)
    client = EnvClient(proxy.url, keepalive=Keepalive.disabled(), retry=FAST_RETRY)
    await client.connect()
    session_id = client.session_id
    await client.reset()
    steps_seen = []
    for i in range(1, 11):
        if i == 3:
            proxy.drop_all()  # between requests: the next send finds a dead socket
        elif i == 6:
            proxy.arm("reply")  # the step is applied, its reply is lost: resent, not re-applied
        elif i == 9:
            proxy.arm("request")  # the step never reaches the server: resent and applied once
        result = await client.step({"message": f"m{i}"})
        assert result.observation["echoed_message"] == f"m{i}"
        steps_seen.append(result.metadata["step"])
    assert proxy.drops == 3
    assert proxy.accepted == 4  # one connection, then one resume per drop
    assert client.session_id == session_id
    assert client.session is not None and client.session.resumed is True
    assert steps_seen == list(range(1, 11))
    assert (await client.state())["step_count"] == 10
    await client.close()


async def test_reply_timeout_resends_the_same_request_and_never_applies_it_twice(envsdk_url: str) -> None:
    client = EnvClient(envsdk_url, timeouts=Timeouts(request=0.3), retry=FAST_RETRY)
    await client.connect()
    await client.reset()
    # The step takes 0.8 s: the client gives up waiting after 0.3 s, reconnects, resends the
    # same id; the server awaits the still-running call and answers it once.
    result = await client.step({"message": "sleep:0.8"})
    assert result.observation["echoed_message"] == "sleep:0.8"
    assert result.metadata == {"step": 1}
    assert (await client.state())["step_count"] == 1
    after = await client.step({"message": "next"})
    assert after.metadata == {"step": 2}
    await client.close()


async def test_drop_after_the_resume_window_loses_the_session(proxy_factory: Any) -> None:
    with running_server(echo_app(resume_window_s=0.2)) as url:
        proxy = await proxy_factory(url)
        client = EnvClient(proxy.url, keepalive=Keepalive.disabled(), retry=FAST_RETRY)
        await client.connect()
        await client.reset()
        await client.step({"message": "a"})
        proxy.drop_all()
        await asyncio.sleep(0.8)
        with pytest.raises(SessionLostError) as info:
            await client.step({"message": "b"})
        assert info.value.code == "RESUME_FAILED"
        assert info.value.session_id == client.session_id
        with pytest.raises(SessionLostError, match="lost earlier"):
            await client.state()
        assert proxy.accepted == 2  # one resume attempt, refused; no new session was opened
        await client.close()


async def test_restarted_server_loses_the_session_instead_of_starting_a_new_one() -> None:
    port = free_port()
    with running_server(echo_app(), port=port) as url:
        client = EnvClient(url, retry=FAST_RETRY)
        await client.connect()
        await client.reset()
        await client.step({"message": "a"})
    with running_server(echo_app(), port=port):
        with pytest.raises(SessionLostError) as info:
            await client.step({"message": "b"})
        assert info.value.code == "RESUME_FAILED"
        with pytest.raises(SessionLostError):
            await client.reset()
        await client.close()


async def test_unreachable_server_loses_the_session_after_bounded_retries(envsdk_url: str, proxy_factory: Any) -> None:
    proxy = await proxy_factory(envsdk_url)
    client = EnvClient(proxy.url, keepalive=Keepalive.disabled(), retry=Retry(max_attempts=3, backoff_base=0.01))
    await client.connect()
    await client.reset()
    await proxy.stop()  # drops the connection and stops listening
    with pytest.raises(SessionLostError, match="gave up after 3 reconnect attempts"):
        await client.step({"message": "a"})
    await client.close()


async def test_late_reply_of_a_cancelled_request_is_never_taken_for_the_next_answer(envsdk_url: str) -> None:
    async with EnvClient(envsdk_url) as client:
        await client.reset()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.step({"message": "sleep:0.5"}), 0.1)
        # The abandoned step's reply arrives first on the same socket; its id does not match.
        state = await client.state()
        assert state["step_count"] == 1
        assert (await client.step({"message": "b"})).observation["echoed_message"] == "b"


async def test_reply_over_the_frame_limit_is_refused_not_retried(envsdk_url: str) -> None:
    client = EnvClient(envsdk_url, transport=WebSocketTransport(max_frame_bytes=1000), retry=FAST_RETRY)
    await client.connect()
    await client.reset()
    assert (await client.step({"message": "x" * 100})).observation["message_length"] == 100
    with pytest.raises(SessionLostError, match="1009"):
        await client.step({"message": "x" * 2000})
    await client.close()


@pytest.mark.parametrize(
    ("what", "send"),
    [
        # What a "\ud800" escape in a model server's JSON decodes to: UTF-8 has no form for it.
        ("step", lambda client: client.step({"message": "left \ud800"})),
        # A value JSON has no type for.
        ("reset", lambda client: client.reset(seed=object())),
        ("tools/call", lambda client: client.call_tool("echo", text="\udfff")),
    ],
)
async def test_a_request_that_cannot_be_written_as_json_is_a_typed_error_and_sends_nothing(
    envsdk_url: str, what: str, send: Any
) -> None:
    async with EnvClient(envsdk_url) as client:
        await client.reset()
        with pytest.raises(RequestEncodingError, match=f"^{what}: .*nothing was sent") as info:
            await send(client)
        assert isinstance(info.value, ValueError)  # what callers caught before: pydantic's error is one
        # The session is as it was: the episode goes on where it stood.
        result = await client.step({"message": "after"})
        assert result.observation["echoed_message"] == "after"
        assert (await client.state())["step_count"] == 1
