"""OpenEnv's own rubric classes on an envsdk-served environment, against OpenEnv's server.

The same environment logic is written twice — against OpenEnv's base classes and served by
OpenEnv's ``create_app``, and against envsdk's and served by envsdk's — with the same rubric
built from ``openenv.core.rubrics``. Both servers run on real sockets; one scripted client
drives them through the same episodes. The rewards must be equal, and only envsdk's frames
carry every named part (``metadata.reward_components``), equal to the parts of the same rubric
evaluated locally.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from websockets.sync.client import connect

oe = pytest.importorskip("openenv.core.rubrics", reason="needs the real openenv package (test extra)")

from openenv.core.env_server import Action as OEAction
from openenv.core.env_server import Environment as OEEnvironment
from openenv.core.env_server import Observation as OEObservation
from openenv.core.env_server import State as OEState
from openenv.core.env_server import create_app as openenv_create_app

import envsdk.rewards as ev
from envsdk import Action, Environment, Observation, State
from envsdk.server import create_app
from envsdk.testing import running_server

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- the rubric (OpenEnv's classes)


class Length(oe.Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return min(len(action.message) / 10.0, 1.0)


class HasDigit(oe.Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if any(ch.isdigit() for ch in action.message) else 0.0


class Polite(oe.Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if "please" in action.message else 0.0


class ShortEpisode(oe.ExponentialDiscountingTrajectoryRubric):
    def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
        return 1.0 if len(trajectory) <= 3 else 0.25


class Root(oe.Rubric):
    """A weighted, gated, fail-fast quality score plus an end-of-episode score."""

    def __init__(self) -> None:
        super().__init__()
        self.quality = oe.WeightedSum(
            [oe.Gate(Length(), threshold=0.3), oe.Sequential(HasDigit(), Polite())], weights=[0.6, 0.4]
        )
        self.episode = ShortEpisode(gamma=0.5)

    def forward(self, action: Any, observation: Any) -> float:
        return self.quality(action, observation) + self.episode(action, observation)


# ---------------------------------------------------------------- the env, twice


class OEMsgAction(OEAction):
    message: str


class OEMsgObservation(OEObservation):
    text: str = ""


class OERubricEnv(OEEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(rubric=Root())
        self._state = OEState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> OEMsgObservation:
        self._reset_rubric()
        self._state = OEState(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return OEMsgObservation(text="ready", reward=0.0)

    def step(self, action: OEMsgAction, timeout_s: float | None = None, **kwargs: Any) -> OEMsgObservation:  # type: ignore[override]
        self._state.step_count += 1
        obs = OEMsgObservation(text=action.message, done=action.message == "done")
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> OEState:
        return self._state


class MsgAction(Action):
    message: str


class MsgObservation(Observation):
    text: str = ""


class RubricEnv(Environment[MsgAction, MsgObservation, State]):
    def __init__(self) -> None:
        super().__init__(rubric=Root())
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MsgObservation:
        self._reset_rubric()
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return MsgObservation(text="ready", reward=0.0)

    def step(self, action: MsgAction) -> MsgObservation:
        self._state.step_count += 1
        obs = MsgObservation(text=action.message, done=action.message == "done")
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> State:
        return self._state


EPISODES = [
    ["hi", "give me 5 please", "done"],
    ["a much longer message 42", "please", "x" * 12, "7 please", "done"],
    ["done"],
    ["3", "please 3", "abc", "done"],
]


def _play(url: str) -> list[list[dict[str, Any]]]:
    """Every step reply's ``data`` for every episode, over one WebSocket session."""
    frames: list[list[dict[str, Any]]] = []
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10, close_timeout=5) as ws:
        for messages in EPISODES:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
            episode = []
            for message in messages:
                ws.send(json.dumps({"type": "step", "data": {"message": message}}))
                reply = json.loads(ws.recv(timeout=10))
                assert reply["type"] == "observation", reply
                episode.append(reply["data"])
            frames.append(episode)
        ws.send(json.dumps({"type": "close"}))
    return frames


def _expected_parts() -> list[list[tuple[float, dict[str, float | None]]]]:
    """The same rubric evaluated locally, episode by episode: (score, parts) per step."""
    rubric = Root()
    out = []
    for messages in EPISODES:
        rubric.reset()
        steps = []
        for message in messages:
            obs = MsgObservation(text=message, done=message == "done")
            scored = ev.score(rubric, MsgAction(message=message), obs)
            steps.append((scored.reward, scored.parts))
        out.append(steps)
    return out


def test_openenv_rubrics_score_the_same_under_both_servers_and_only_envsdk_sends_the_parts() -> None:
    openenv_app = openenv_create_app(OERubricEnv, OEMsgAction, OEMsgObservation, max_concurrent_envs=2)
    envsdk_app = create_app(RubricEnv, MsgAction, MsgObservation, max_concurrent_envs=2)
    with running_server(openenv_app) as openenv_url, running_server(envsdk_app) as envsdk_url:
        theirs = _play(openenv_url)
        ours = _play(envsdk_url)
    expected = _expected_parts()
    names = ev.part_names(Root())
    assert names == [
        "quality",
        "quality.rubric_0",
        "quality.rubric_0.rubric",
        "quality.rubric_1",
        "quality.rubric_1.rubric_0",
        "quality.rubric_1.rubric_1",
        "episode",
    ]
    steps = 0
    for their_episode, our_episode, expected_episode in zip(theirs, ours, expected, strict=True):
        for their, our, (score, parts) in zip(their_episode, our_episode, expected_episode, strict=True):
            steps += 1
            assert our["reward"] == their["reward"] == score
            assert our["done"] == their["done"]
            # OpenEnv's server sends the scalar only.
            assert "reward_components" not in (their.get("metadata") or {})
            assert "reward_components" not in their["observation"].get("metadata", {})
            # envsdk's sends every named part, at the top of the frame and in the body.
            assert our["metadata"]["reward_components"] == parts
            assert our["observation"]["metadata"]["reward_components"] == parts
            assert list(parts) == names
    assert steps == sum(len(e) for e in EPISODES)
    # The fail-fast Sequential skipped Polite on a message without a digit: None, not a stale score.
    first = ours[0][0]["metadata"]["reward_components"]
    assert first["quality.rubric_1.rubric_0"] == 0.0 and first["quality.rubric_1.rubric_1"] is None
    # The trajectory part pays at the end of the episode only (intermediate reward 0).
    assert [s["metadata"]["reward_components"]["episode"] for s in ours[1]] == [0.0, 0.0, 0.0, 0.0, 0.25]


def test_envsdk_containers_attached_to_an_envsdk_env_give_the_same_frames() -> None:
    """The same tree built from envsdk's own containers: the same rewards and parts."""

    class EvLength(ev.Rubric):
        def forward(self, action: Any, observation: Any) -> float:
            return min(len(action.message) / 10.0, 1.0)

    class EvHasDigit(ev.Rubric):
        def forward(self, action: Any, observation: Any) -> float:
            return 1.0 if any(ch.isdigit() for ch in action.message) else 0.0

    class EvPolite(ev.Rubric):
        def forward(self, action: Any, observation: Any) -> float:
            return 1.0 if "please" in action.message else 0.0

    class EvShortEpisode(ev.ExponentialDiscountingTrajectoryRubric):
        def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
            return 1.0 if len(trajectory) <= 3 else 0.25

    class EvRoot(ev.Rubric):
        def __init__(self) -> None:
            super().__init__()
            self.quality = ev.WeightedSum(
                [ev.Gate(EvLength(), threshold=0.3), ev.Sequential(EvHasDigit(), EvPolite())], weights=[0.6, 0.4]
            )
            self.episode = EvShortEpisode(gamma=0.5)

        def forward(self, action: Any, observation: Any) -> float:
            return self.quality(action, observation) + self.episode(action, observation)

    class EvRubricEnv(RubricEnv):
        def __init__(self) -> None:
            super().__init__()
            self.rubric = EvRoot()

    with running_server(create_app(RubricEnv, MsgAction, MsgObservation)) as a, running_server(
        create_app(EvRubricEnv, MsgAction, MsgObservation)
    ) as b:
        assert _play(a) == _play(b)
