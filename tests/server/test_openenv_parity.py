"""What a plain OpenEnv 0.10 client, and OpenEnv's own tools, see of an envsdk server: error
codes of a step before reset or after done, `openenv validate`, `/schema`, and an app served
again after its lifespan ended. Each against a real server, with OpenEnv's own code."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from openenv.cli._validation import validate_running_environment
from openenv.core.generic_client import GenericEnvClient
from websockets.sync.client import connect

from envsdk.client import EnvClient
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from envsdk.testing.openenv_echo import make_openenv_app

from .helpers import frame, ws_url

pytestmark = pytest.mark.timeout(60)


class ResetObservation(EchoObservation):
    """A reset observation that differs from the step's."""

    instructions: str = ""


def test_a_plain_openenv_client_gets_openenv_codes_for_a_step_before_reset_or_after_done(serve_echo: Any) -> None:
    url = serve_echo(max_concurrent_envs=4)
    client = GenericEnvClient(base_url=url).sync()
    try:
        with pytest.raises(RuntimeError) as early:
            client.step({"message": "too early"})
        assert "(code: EXECUTION_ERROR)" in str(early.value) and "send reset first" in str(early.value)
        client.reset()
        assert client.step({"message": "done"}).done is True
        with pytest.raises(RuntimeError) as late:
            client.step({"message": "too late"})
        assert "(code: EXECUTION_ERROR)" in str(late.value) and "episode is over" in str(late.value)
        # The refused step was not applied: the episode stays where it ended.
        assert client.state()["step_count"] == 1
    finally:
        client.close()


async def test_a_peer_that_asked_for_extensions_gets_not_reset_and_episode_done(serve_echo: Any) -> None:
    url = serve_echo(max_concurrent_envs=4)
    async with EnvClient(url) as env:  # did the session handshake
        with pytest.raises(NotResetError):
            await env.step({"message": "too early"})
        await env.reset()
        await env.step({"message": "done"})
        with pytest.raises(EpisodeDoneError):
            await env.step({"message": "too late"})
    with connect(ws_url(url)) as ws:  # a request id is an extension too
        ws.send(frame(type="step", data={"message": "x"}, id="r1"))
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "NOT_RESET"
        ws.send(frame(type="step", data={"message": "x"}))
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "EXECUTION_ERROR"


def test_openenv_validate_rates_an_envsdk_server_as_openenv_http_1x(serve_echo: Any) -> None:
    url = serve_echo()
    report = validate_running_environment(url, timeout_s=10)
    assert report["standard_profile"] == "openenv-http/1.x", report
    assert report["passed"] is True, report["summary"]


def test_schema_has_openenv_keys_with_a_reset_observation_of_its_own() -> None:
    with running_server(make_openenv_app(1)) as openenv_url:
        openenv_keys = set(httpx.get(openenv_url + "/schema", timeout=10).json())
    default_app = create_app(EchoEnvironment, EchoAction, EchoObservation)
    own_app = create_app(EchoEnvironment, EchoAction, EchoObservation, reset_observation_type=ResetObservation)
    with running_server(default_app) as default_url, running_server(own_app) as own_url:
        default = httpx.get(default_url + "/schema", timeout=10).json()
        own = httpx.get(own_url + "/schema", timeout=10).json()
    assert set(default) == openenv_keys
    assert default["reset_observation"] == default["observation"] == EchoObservation.model_json_schema()
    assert own["reset_observation"] == ResetObservation.model_json_schema()
    assert own["observation"] == EchoObservation.model_json_schema()


async def test_an_app_whose_lifespan_ended_serves_again_when_started_again() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=2)
    for round_ in range(2):
        with running_server(app) as url:
            async with EnvClient(url) as env:
                assert (await env.reset()).observation["echoed_message"] == "ready", round_
                assert (await env.step({"message": "hi"})).reward == pytest.approx(0.2)
            openenv = GenericEnvClient(base_url=url).sync()
            try:
                assert openenv.reset().observation["echoed_message"] == "ready"
            finally:
                openenv.close()
            assert (await asyncio.to_thread(httpx.post, url + "/reset", json={}, timeout=10)).status_code == 200
            if round_ == 0:  # the first run ends as SIGTERM ends `envsdk serve`: drained, then stopped
                server_loop = app.state.envsdk_sessions.executors._loop
                drained = asyncio.run_coroutine_threadsafe(app.state.envsdk_drain(), server_loop)
                await asyncio.wait_for(asyncio.wrap_future(drained), 30)
