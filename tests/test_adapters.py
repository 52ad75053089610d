"""Local Envs served over the protocol, remote servers used as Envs, and the in-process client:
the same episode gives the same observations and rewards whichever way it travels."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

from envsdk.adapters import ChatObservation, EnvEnvironment, RemoteEnv, env_app, local_client
from envsdk.client import EnvClient
from envsdk.env import Env, RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv, FrozenLakeGame, shortest_path
from envsdk.errors import EnvNotFoundError, EpisodeDoneError
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

SEED = 11
Step = tuple[str, float, bool, dict[str, Any]]


def _replies() -> list[str]:
    """A fixed reply list for seed 11: an unparseable reply, a word-only move, then the
    shortest path in tags, which ends at the goal."""
    game = FrozenLakeGame.generate(seed=SEED)
    path = shortest_path(game.grid, game.start, game.goal)
    assert path
    first, rest = path[0], path[1:]
    return ["hmm, let me think", f"I will go {first}", *(f"<action>{m}</action>" for m in rest)]


def _row() -> RolloutRequest:
    return RolloutRequest(
        messages=[{"role": "user", "content": "<placeholder>"}],
        data_dict={"env_config": {"name": "frozen_lake", "seed": SEED}},
        uuid="episode-11",
    )


def _conversation(first: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": first}]


async def _play_env(env: Env) -> tuple[tuple[str, dict[str, Any], str | None], list[Step]]:
    first = await env.reset(_row())
    messages = _conversation(first[0])
    steps = []
    for reply in _replies():
        messages.append({"role": "assistant", "content": reply})
        step = await env.step(list(messages))
        messages.append({"role": "user", "content": step[0]})
        steps.append(step)
    await env.close()
    return first, steps


async def _play_client(client: EnvClient) -> tuple[tuple[str, dict[str, Any], str | None], list[Step]]:
    row = _row()
    async with client:
        result = await client.reset(messages=row.messages, data_dict=row.data_dict, uuid=row.uuid)
        body = result.observation
        first = (body["text"], body["info"], body["system_message"])
        messages = _conversation(body["text"])
        steps = []
        for reply in _replies():
            messages.append({"role": "assistant", "content": reply})
            result = await client.step({"messages": messages})
            steps.append((result.observation["text"], result.reward, result.done, result.observation["info"]))
            messages.append({"role": "user", "content": result.observation["text"]})
    return first, steps


@pytest.mark.timeout(30)
def test_frozen_lake_episode_is_identical_direct_in_process_and_over_websocket() -> None:
    direct = asyncio.run(_play_env(FrozenLakeEnv({"seed": SEED})))
    first, steps = direct
    # The episode is the one the replies describe: no move, a move, ..., the goal.
    assert steps[0][3]["outcome"] == "invalid"
    assert [s[1:3] for s in steps[1:]] == [(0.0, False)] * (len(steps) - 2) + [(1.0, True)]

    in_process = asyncio.run(_play_client(local_client(FrozenLakeEnv)))
    with running_server(env_app("frozen_lake")) as url:
        over_websocket = asyncio.run(_play_client(EnvClient(url)))
        remote_env = asyncio.run(_play_env(RemoteEnv({"base_url": url, "seed": SEED})))
    assert in_process == direct
    assert over_websocket == direct
    assert remote_env == direct


@pytest.mark.timeout(30)
async def test_served_env_is_reset_with_the_row_and_closed_with_the_client() -> None:
    class RowEcho(Env):
        closed: ClassVar[list[str]] = []

        async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
            self.uuid = config.uuid
            info = {"messages": config.messages, "data_dict": config.data_dict, "ctor": self.env_config}
            return "ready", info, None

        async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
            return f"{len(messages)} messages", 0.5, True, {"last": messages[-1]}

        async def close(self) -> None:
            RowEcho.closed.append(self.uuid)

    client = local_client(RowEcho)
    async with client:
        result = await client.reset(
            seed=5, messages=[{"role": "user", "content": "q"}], uuid="u-1",
            data_dict={"env_config": {"seed": 1, "size": 3}, "solution": "x"}, env_config={"p": 0.5},
        )
        config = {"seed": 5, "size": 3, "p": 0.5}
        assert result.observation["info"] == {
            "messages": [{"role": "user", "content": "q"}],
            "data_dict": {"env_config": config, "solution": "x"},
            "ctor": config,
        }
        assert (result.reward, result.done) == (0.0, False)
        step = await client.step({"messages": [{"role": "assistant", "content": "a"}] * 3})
        assert (step.observation["text"], step.reward, step.done) == ("3 messages", 0.5, True)
        assert (await client.state())["step_count"] == 1
        with pytest.raises(EpisodeDoneError):
            await client.step({"messages": [{"role": "assistant", "content": "again"}]})
    assert RowEcho.closed == ["u-1"]


async def test_env_environment_info_is_made_json_safe() -> None:
    class TupleInfo(Env):
        async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
            return "x", {"cell": (1, 2), "obj": object}, "sys"

        async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
            return "y", 1, True, {}

    environment = EnvEnvironment(TupleInfo)
    obs = await environment.reset(seed=1)
    assert isinstance(obs, ChatObservation)
    assert obs.info == {"cell": [1, 2], "obj": str(object)} and obs.system_message == "sys"
    await environment.close()
    await environment.close()


def test_env_app_rejects_unknown_names_and_non_env_classes() -> None:
    with pytest.raises(EnvNotFoundError, match="frozen_lake"):
        env_app("no_such_env")
    with pytest.raises(TypeError):
        env_app(EchoEnvironment)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_remote_env_speaks_actions_to_a_plain_environment_server() -> None:
    async def episode(url: str) -> list[Step]:
        env = RemoteEnv({"base_url": url, "system_message": "Say something."})
        observation, info, system = await env.reset(RolloutRequest())
        assert env.mode == "action"
        assert system == "Say something."
        # The model reads the observation's text (envsdk.formats.render_observation), not a JSON dump.
        assert observation == "ready" and info["observation"]["echoed_message"] == "ready"
        steps = []
        for reply in ('```json\n{"message": "fenced"}\n```', "plain words", "done"):
            steps.append(await env.step([{"role": "assistant", "content": reply}]))
        with pytest.raises(EpisodeDoneError):
            await env.step([{"role": "assistant", "content": "more"}])
        await env.close()
        await env.close()
        return steps

    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as url:
        steps = asyncio.run(episode(url))
    echoed = [s[3]["observation"]["echoed_message"] for s in steps]
    assert echoed == ["fenced", "plain words", "done"]
    assert [(s[1], s[2]) for s in steps] == [(0.6, False), (1.1, False), (0.4, True)]
    assert [s[0] for s in steps] == ["fenced", "plain words", "done"]


@pytest.mark.timeout(30)
def test_remote_env_formatter_is_chosen_like_the_schedulers_and_reads_the_previous_observation() -> None:
    seen: list[tuple[str, str | None]] = []

    def recording(observation: dict[str, Any], previous: dict[str, Any] | None) -> str:
        seen.append((observation["echoed_message"], previous["echoed_message"] if previous else None))
        return f"<{observation['echoed_message']}>"

    async def texts(env: RemoteEnv) -> list[str]:
        first, _, _ = await env.reset(RolloutRequest())
        steps = [await env.step([{"role": "assistant", "content": m}]) for m in ("a", "b")]
        # A new episode starts with no previous observation.
        again, _, _ = await env.reset(RolloutRequest())
        await env.close()
        return [first, *(s[0] for s in steps), again]

    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation)) as url:
        assert asyncio.run(texts(RemoteEnv({"base_url": url}, formatter=recording))) == ["<ready>", "<a>", "<b>", "<ready>"]
        dumped = asyncio.run(texts(RemoteEnv({"base_url": url, "formatter": "json"})))
        # The row's env_config["formatter"] wins over the keyword, as in the schedulers.
        row_wins = asyncio.run(texts(RemoteEnv({"base_url": url, "formatter": "text"}, formatter="json")))
    assert seen == [("ready", None), ("a", "ready"), ("b", "a"), ("ready", None)]
    assert [json.loads(t)["echoed_message"] for t in dumped] == ["ready", "a", "b", "ready"]
    assert row_wins == ["ready", "a", "b", "ready"]


@pytest.mark.parametrize(
    "text, action",
    [
        ('{"message": "[1 2 3]"}', {"message": "[1 2 3]"}),
        ('```json\n{"move": "up"}\n```', {"move": "up"}),
        ("```\n{\"a\": 1}\n```", {"a": 1}),
        ("[1, 2]", {"message": "[1, 2]"}),
        ("go left", {"message": "go left"}),
    ],
)
def test_remote_env_default_parse_action(text: str, action: dict[str, Any]) -> None:
    assert RemoteEnv().parse_action(text) == action


def test_remote_env_parse_and_format_are_overridable() -> None:
    class Custom(RemoteEnv):
        def parse_action(self, text: str) -> dict[str, Any]:
            return {"message": text.upper()}

        def format_observation(self, observation: Any) -> str:
            return str(observation["prompt"])

    env = Custom({"base_url": "http://127.0.0.1:1", "mode": "action"})
    assert env.parse_action("x") == {"message": "X"}
    assert env.format_observation({"prompt": "p"}) == "p"
    assert RemoteEnv().format_observation({"t": "é", "n": {1}}) == "é"
    assert RemoteEnv({"formatter": "json"}).format_observation({"t": "é", "n": {1}}) == '{"t": "é", "n": "{1}"}'
    with pytest.raises(KeyError, match="json"):
        RemoteEnv({"formatter": "yaml"})
    with pytest.raises(ValueError, match="mode"):
        RemoteEnv({"mode": "telepathy"})


@pytest.mark.slow  # importing openenv pulls in gradio: 5-20 s on a busy 2-core machine
@pytest.mark.timeout(120)
def test_remote_env_plays_an_openenv_server() -> None:
    from openenv.core.env_server import Action as OEAction
    from openenv.core.env_server import Environment as OEEnvironment
    from openenv.core.env_server import Observation as OEObservation
    from openenv.core.env_server import State as OEState
    from openenv.core.env_server import create_app as openenv_create_app

    class ShoutAction(OEAction):
        message: str

    class ShoutObservation(OEObservation):
        shout: str = ""

    class ShoutEnvironment(OEEnvironment):
        """Shouts the message back; "bye" ends the episode with reward 1."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = OEState()

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ShoutObservation:
            return ShoutObservation(shout=f"seed {seed}", reward=0.0)

        def step(self, action: ShoutAction, timeout_s: float | None = None, **kwargs: Any) -> ShoutObservation:  # type: ignore[override]
            bye = action.message == "bye"
            return ShoutObservation(shout=action.message.upper(), reward=float(bye), done=bye)

        @property
        def state(self) -> OEState:
            return self._state

    async def episode(url: str) -> tuple[str, list[Step]]:
        env = RemoteEnv({"base_url": url, "seed": 9})
        observation, _, _ = await env.reset(RolloutRequest())
        assert env.mode == "action"
        steps = [await env.step([{"role": "assistant", "content": m}]) for m in ("hi", '{"message": "bye"}')]
        await env.close()
        return observation, steps

    app = openenv_create_app(ShoutEnvironment, ShoutAction, ShoutObservation, max_concurrent_envs=2)
    with running_server(app) as url:
        observation, steps = asyncio.run(episode(url))
    assert observation == "seed 9"
    assert [(s[3]["observation"]["shout"], s[1], s[2]) for s in steps] == [("HI", 0.0, False), ("BYE", 1.0, True)]
