"""Local Envs served over the protocol, remote servers used as Envs, and the in-process client:
the same episode gives the same observations and rewards whichever way it travels."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from typing import Any, ClassVar

import pytest

from envsdk.adapters import ChatAction, ChatObservation, EnvEnvironment, RemoteEnv, env_app, local_client
from envsdk.client import EnvClient
from envsdk.env import Env, RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv, FrozenLakeGame, shortest_path
from envsdk.errors import EnvNotFoundError, EnvTimeoutError, EpisodeDoneError
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


def test_env_environment_info_is_made_json_safe() -> None:
    class TupleInfo(Env):
        async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
            return "x", {"cell": (1, 2), "obj": object}, "sys"

        async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
            return "y", 1, True, {}

    environment = EnvEnvironment(TupleInfo)
    obs = environment.reset(seed=1)
    assert isinstance(obs, ChatObservation)
    assert obs.info == {"cell": [1, 2], "obj": str(object)} and obs.system_message == "sys"
    environment.close()
    environment.close()


class LoopBound(Env):
    """Records the event loop and thread of each call; ``step`` waits on `release` (sync)."""

    release: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()
    seen: ClassVar[list[tuple[str, asyncio.AbstractEventLoop, int]]] = []

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        self._see("reset")
        return "x", {}, None

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        self._see("step")
        LoopBound.entered.set()
        LoopBound.release.wait(10)
        return "y", 0.0, False, {}

    async def close(self) -> None:
        self._see("close")

    def _see(self, kind: str) -> None:
        LoopBound.seen.append((kind, asyncio.get_running_loop(), threading.get_ident()))


@pytest.mark.timeout(30)
def test_env_environment_closed_from_another_thread_mid_call_closes_on_the_call_thread_once_it_returns() -> None:
    # What the server does after a deadline: the call goes on on its lane, the env is closed
    # after it. A close from elsewhere meanwhile must neither hang nor touch the running loop.
    LoopBound.seen.clear()
    LoopBound.release.clear()
    LoopBound.entered.clear()
    environment = EnvEnvironment(LoopBound)
    steps: list[Any] = []

    def lane() -> None:
        environment.reset()
        steps.append(environment.step(ChatAction(messages=[])))

    thread = threading.Thread(target=lane)
    thread.start()
    assert LoopBound.entered.wait(10)
    started = time.perf_counter()
    assert environment.close() is None
    assert time.perf_counter() - started < 0.1
    assert [kind for kind, _, _ in LoopBound.seen] == ["reset", "step"]
    LoopBound.release.set()
    thread.join(10)
    assert steps[0].text == "y"
    # Closed after the call, on its thread and loop, and the loop closed after it.
    assert {(loop, ident) for _, loop, ident in LoopBound.seen} == {(LoopBound.seen[0][1], thread.ident)}
    assert [kind for kind, _, _ in LoopBound.seen] == ["reset", "step", "close"]
    assert LoopBound.seen[0][1].is_closed()


async def test_env_environment_inside_a_running_loop_gives_the_coroutine_to_await() -> None:
    # The server's inline_sync mode runs sync methods on its loop: there they cannot run a loop
    # of their own, so the Env's coroutine is handed back to be awaited on the caller's loop.
    LoopBound.seen.clear()
    LoopBound.release.set()
    async with local_client(LoopBound, inline_sync=True) as client:
        assert (await client.reset()).observation["text"] == "x"
        assert (await client.step({"messages": []})).observation["text"] == "y"
    loop = asyncio.get_running_loop()
    assert [(kind, seen_loop) for kind, seen_loop, _ in LoopBound.seen] == [
        ("reset", loop), ("step", loop), ("close", loop)
    ]


class SleepyStepEnv(Env):
    """An Env whose ``async def step`` does sync work: a reply ``"sleep:<s>"`` sleeps with
    ``time.sleep`` (no await). It records the thread and event loop each call ran on."""

    calls: ClassVar[list[tuple[str, int, int]]] = []

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        self._record("reset")
        # A loop-bound resource kept between calls: valid only while every call of the
        # session runs on the same event loop.
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        return "ready", {}, None

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        self._record("step")
        reply = str(messages[-1]["content"])
        if reply.startswith("sleep:"):
            time.sleep(float(reply.split(":", 1)[1]))  # noqa: ASYNC251  (the sync work under test)
        if reply.startswith("await:"):
            await asyncio.sleep(float(reply.split(":", 1)[1]))
        await self.queue.put(reply)
        return reply, 0.0, False, {"queued": self.queue.qsize()}

    async def close(self) -> None:
        self._record("close")

    def _record(self, kind: str) -> None:
        SleepyStepEnv.calls.append((kind, threading.get_ident(), id(asyncio.get_running_loop())))


def _say(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": text}]}


@pytest.mark.timeout(30)
async def test_a_served_env_doing_sync_work_in_its_async_step_does_not_hold_up_other_sessions() -> None:
    server_thread = threading.get_ident()
    SleepyStepEnv.calls.clear()
    with running_server(env_app(SleepyStepEnv)) as url:
        async with EnvClient(url) as slow, EnvClient(url) as other:
            await slow.reset()
            await other.reset()
            sleeping = asyncio.ensure_future(slow.step(_say("sleep:1.0")))
            await asyncio.sleep(0.2)  # the slow step is inside its time.sleep now
            latencies = []
            for call in (other.reset(), other.step(_say("quick"))):
                started = time.perf_counter()
                await call
                latencies.append(time.perf_counter() - started)
            started = time.perf_counter()
            health = await asyncio.to_thread(lambda: urllib.request.urlopen(url + "/health", timeout=5).read())
            latencies.append(time.perf_counter() - started)
            assert json.loads(health)["status"] == "healthy"
            # Nobody waited for the sleeper (it has 0.8 s to go): the loop went on serving.
            assert max(latencies) < 0.3, latencies
            assert not sleeping.done()
            assert (await sleeping).observation["text"] == "sleep:1.0"
            # The Env's loop-bound queue outlived the calls: one session, one event loop.
            assert (await slow.step(_say("again"))).observation["info"] == {"queued": 2}
    # Every call of a session ran on one thread (its lane, not the server's loop thread) and one loop.
    by_session: dict[int, set[tuple[int, int]]] = {}
    for kind, thread, loop in SleepyStepEnv.calls:
        assert thread != server_thread
        by_session.setdefault(thread, set()).add((thread, loop))
    assert len(by_session) == 2 and all(len(places) == 1 for places in by_session.values())


@pytest.mark.timeout(30)
async def test_a_served_env_step_past_its_deadline_times_out_and_the_server_goes_on() -> None:
    SleepyStepEnv.calls.clear()
    with running_server(env_app(SleepyStepEnv, step_timeout_s=0.3)) as url:
        async with EnvClient(url) as slow, EnvClient(url) as other:
            await slow.reset()
            await other.reset()
            started = time.perf_counter()
            with pytest.raises(EnvTimeoutError):
                await slow.step(_say("sleep:3"))
            # The reply came at the deadline, not when the 3 s sleep ended.
            assert time.perf_counter() - started < 1.5
            started = time.perf_counter()
            assert (await other.step(_say("quick"))).observation["text"] == "quick"
            assert time.perf_counter() - started < 0.3
            # The timed-out session starts again on a fresh env.
            assert (await slow.reset()).observation["text"] == "ready"
            assert (await slow.step(_say("quick"))).observation["text"] == "quick"
        # The written-off env is closed on its thread once its sleep has returned.
        deadline = time.monotonic() + 10
        while sum(kind == "close" for kind, _, _ in SleepyStepEnv.calls) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    closes = [thread for kind, thread, _ in SleepyStepEnv.calls if kind == "close"]
    assert len(closes) == 3


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


@pytest.mark.timeout(30)
async def test_a_served_env_awaiting_past_its_deadline_is_cancelled_closed_and_its_thread_freed() -> None:
    """An Env's step that awaits (a sandbox, a tool call) for an hour past its deadline held
    its lane thread, one of the server's abandoned-thread slots, for the hour, and its close
    waited as long: a coroutine can be stopped where a thread cannot."""
    SleepyStepEnv.calls.clear()
    with running_server(env_app(SleepyStepEnv, step_timeout_s=0.3)) as url:
        async with EnvClient(url) as env:
            await env.reset()
            with pytest.raises(EnvTimeoutError):
                await env.step(_say("await:3600"))
        deadline = time.monotonic() + 10
        while True:
            raw = await asyncio.to_thread(lambda: urllib.request.urlopen(url + "/health", timeout=5).read())
            health = json.loads(raw)
            closed = any(kind == "close" for kind, _, _ in SleepyStepEnv.calls)
            if health["abandoned_threads"] == 0 and closed:  # freed, and the Env closed
                break
            assert time.monotonic() < deadline, (health, SleepyStepEnv.calls)
            await asyncio.sleep(0.1)
        async with EnvClient(url) as env:  # the server serves on
            await env.reset()
            assert (await env.step(_say("quick"))).observation["text"] == "quick"
