"""Rewards and their named parts on the wire: a non-finite value is a typed error on both
sides (never a null that reads as "no reward" or "not evaluated"), and the named parts of an
OpenEnv-native environment's rubric travel with the step like those of an envsdk one."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openenv.core.env_server import Action as OEAction
from openenv.core.env_server import Environment as OEEnvironment
from openenv.core.env_server import Observation as OEObservation
from openenv.core.env_server import State as OEState
from openenv.core.generic_client import GenericEnvClient
from openenv.core.rubrics import Rubric as OERubric
from openenv.core.rubrics import WeightedSum as OEWeightedSum
from websockets.asyncio.server import ServerConnection, serve

from envsdk.client import EnvClient
from envsdk.env import Environment
from envsdk.errors import ProtocolError, ServerError
from envsdk.rewards import Rubric
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoObservation, free_port, running_server
from envsdk.types import State

from .envs import RewardingEnvironment

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
async def test_a_non_finite_reward_is_a_typed_error_not_a_null(value: str) -> None:
    with running_server(create_app(RewardingEnvironment, EchoAction, EchoObservation)) as url:
        async with EnvClient(url) as env:
            await env.reset()
            with pytest.raises(ServerError) as info:
                await env.step({"message": value})
            assert info.value.code == "EXECUTION_ERROR"
            assert "RewardingEnvironment.step" in info.value.message and "non-finite reward" in info.value.message
            assert (await env.step({"message": "0.5"})).reward == 0.5  # the session goes on
        openenv = GenericEnvClient(base_url=url).sync()
        try:
            openenv.reset()
            with pytest.raises(RuntimeError, match="non-finite reward"):
                openenv.step({"message": value})
        finally:
            openenv.close()


class _Const(Rubric):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, action: Any, observation: Any) -> float:
        return self.value


class _FirstOnly(Rubric):
    """Scores by its `good` part; its `bad` part is evaluated too and gives NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.good = _Const(1.0)
        self.bad = _Const(math.nan)

    def forward(self, action: Any, observation: Any) -> float:
        self.bad(action, observation)
        return self.good(action, observation)


class NanPartEnvironment(Environment[EchoAction, EchoObservation, State]):
    def __init__(self) -> None:
        super().__init__(rubric=_FirstOnly())

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._reset_rubric()
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        obs = EchoObservation(echoed_message=action.message)
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> State:
        return State()


async def test_a_non_finite_rubric_part_is_a_typed_error_naming_the_part() -> None:
    with running_server(create_app(NanPartEnvironment, EchoAction, EchoObservation)) as url:
        async with EnvClient(url) as env:
            await env.reset()
            with pytest.raises(ServerError) as info:
                await env.step({"message": "x"})
    assert info.value.code == "EXECUTION_ERROR"
    assert "NanPartEnvironment.step" in info.value.message and "'bad'" in info.value.message


async def _nan_server(ws: ServerConnection) -> None:
    """Answers like a peer that writes JSON's non-standard NaN literal: reset with a NaN
    reward, step with a NaN rubric part."""
    async for raw in ws:
        kind = json.loads(raw)["type"]
        if kind == "session":
            await ws.send('{"type":"error","data":{"message":"Unknown message type: session","code":"UNKNOWN_TYPE"}}')
        elif kind == "reset":
            await ws.send('{"type":"observation","data":{"observation":{},"reward":NaN,"done":false}}')
        elif kind == "step":
            parts = '{"reward_components":{"progress":NaN}}'
            await ws.send(
                f'{{"type":"observation","data":{{"observation":{{"metadata":{parts}}},'
                f'"reward":1.0,"done":false,"metadata":{parts}}}}}'
            )
        else:
            return


@pytest.fixture
async def nan_peer_url() -> AsyncIterator[str]:
    port = free_port()
    async with serve(_nan_server, "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


async def test_the_client_refuses_a_non_finite_reward_or_part_from_any_peer(nan_peer_url: str) -> None:
    async with EnvClient(nan_peer_url) as env:
        with pytest.raises(ProtocolError, match="non-finite reward"):
            await env.reset()
        with pytest.raises(ProtocolError, match="progress"):
            await env.step({"message": "x"})


# ------------------------------------------------------------ an OpenEnv-native environment


class OEGuessAction(OEAction):
    message: str


class OEGuessObservation(OEObservation):
    text: str = ""


class OEFormat(OERubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if action.message.startswith("[") else 0.0


class OECorrect(OERubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if action.message == "[42]" else 0.0


class OEGuessEnvironment(OEEnvironment):
    """Written as OpenEnv's docs say: OpenEnv's base class, rubric and `_apply_rubric`."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(rubric=OEWeightedSum([OEFormat(), OECorrect()], weights=[0.25, 0.75]))
        self._state = OEState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> OEGuessObservation:
        self._reset_rubric()
        self._state = OEState(episode_id=episode_id, step_count=0)
        return OEGuessObservation(text="guess")

    def step(self, action: OEGuessAction, timeout_s: float | None = None, **kwargs: Any) -> OEGuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        obs = OEGuessObservation(text=action.message, done=action.message == "[42]")
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> OEState:
        return self._state


async def test_the_named_parts_of_an_openenv_native_rubric_travel_with_the_step() -> None:
    app = create_app(OEGuessEnvironment, OEGuessAction, OEGuessObservation)
    with running_server(app) as url:
        async with EnvClient(url) as env:
            first = await env.reset()
            assert "reward_components" not in first.metadata  # no rubric ran on reset
            wrong = await env.step({"message": "[7]"})
            assert wrong.reward == pytest.approx(0.25)
            assert wrong.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_1": 0.0}
            right = await env.step({"message": "[42]"})
            assert right.reward == pytest.approx(1.0) and right.done is True
            assert right.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_1": 1.0}
        # An OpenEnv client reads them from the observation's metadata, as any metadata.
        openenv = GenericEnvClient(base_url=url).sync()
        try:
            openenv.reset()
            result = openenv.step({"message": "nope"})
            assert result.observation["metadata"]["reward_components"] == {"rubric_0": 0.0, "rubric_1": 0.0}
        finally:
            openenv.close()
