"""The in-process transport: the same client drives an ASGI app with no socket at all."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from envsdk.client import EnvClient, InProcessTransport
from envsdk.errors import CapacityError, ServerError, SessionLostError
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from envsdk.testing.openenv_echo import make_openenv_app

pytestmark = pytest.mark.timeout(30)

ACTIONS = [{"message": m} for m in ("hello", "sudoku", "x" * 17, "done")]


async def run_episode(client: EnvClient) -> list[tuple[Any, ...]]:
    """Every observation, reward, done and metadata of one fixed episode, then the state."""
    seen: list[tuple[Any, ...]] = []
    async with client:
        first = await client.reset(seed=11, episode_id="ep-1")
        seen.append((first.observation, first.reward, first.done, first.metadata))
        for action in ACTIONS:
            result = await client.step(action)
            seen.append((result.observation, result.reward, result.done, result.metadata))
        seen.append(tuple(sorted((await client.state()).items())))
    return seen


def refuse_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to open a network socket fail, so "no socket" is checked, not assumed."""

    def no_connect(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the in-process transport opened a socket")

    monkeypatch.setattr(socket.socket, "connect", no_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", no_connect)


def envsdk_app() -> Any:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4)


@pytest.mark.parametrize(("make_app", "kind"), [(make_openenv_app, "openenv"), (envsdk_app, "envsdk")])
async def test_in_process_episode_matches_the_socket_episode(
    make_app: Callable[[], Any], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_server(make_app()) as url:
        over_socket = await run_episode(EnvClient(url))
    refuse_sockets(monkeypatch)
    async with InProcessTransport(make_app()) as transport:
        client = EnvClient("http://envsdk.local", transport=transport)
        in_process = await run_episode(client)
        assert client.server_kind == kind
    assert in_process == over_socket
    assert len(in_process) == len(ACTIONS) + 2
    assert in_process[-2][2] is True  # the "done" step ended the episode


async def test_in_process_capacity_and_errors_are_typed() -> None:
    async with InProcessTransport(make_openenv_app(max_concurrent_envs=1)) as transport:
        async with EnvClient("http://local", transport=transport) as holder:
            await holder.reset()
            with pytest.raises(ServerError) as info:
                await holder.step({"nope": 1})
            assert info.value.code == "VALIDATION_ERROR"
            with pytest.raises(CapacityError):
                await EnvClient("http://local", transport=transport).connect()
        # The slot was freed by the first client's close: a new session fits.
        async with EnvClient("http://local", transport=transport) as again:
            assert (await again.reset()).observation["echoed_message"] == "ready"


async def test_in_process_connection_loss_loses_a_plain_session() -> None:
    async with InProcessTransport(make_openenv_app()) as transport:
        client = EnvClient("http://local", transport=transport)
        await client.connect()
        await client.reset()
        assert client._conn is not None
        await client._conn.close(1001)  # the connection goes away under the client
        with pytest.raises(SessionLostError):
            await client.step({"message": "a"})
        await client.close()


async def test_in_process_connection_loss_resumes_an_envsdk_session() -> None:
    async with InProcessTransport(envsdk_app()) as transport:
        client = EnvClient("http://local", transport=transport)
        await client.connect()
        await client.reset()
        await client.step({"message": "a"})
        assert client._conn is not None
        await client._conn.close(1001)
        result = await client.step({"message": "b"})
        assert result.metadata == {"step": 2}
        assert client.session is not None and client.session.resumed is True
        await client.close()


async def test_lifespan_hooks_run_in_process() -> None:
    events: list[str] = []
    app = make_openenv_app()
    app.router.on_startup.append(lambda: events.append("startup"))
    app.router.on_shutdown.append(lambda: events.append("shutdown"))
    async with InProcessTransport(app) as transport:
        assert events == ["startup"]
        async with EnvClient("http://local", transport=transport) as client:
            await client.reset()
    assert events == ["startup", "shutdown"]
