"""Calls that take longer than a client's own request timeout, on a server that allows them (a
Harbor command or verifier runs for minutes): the server announces each request's deadline in
its session handshake, and the client waits that long plus a margin, on the WebSocket step path
and the MCP tool-call path alike. A number the user gives as request timeout is kept; a server
that announces nothing (OpenEnv's) gets the client's own timeout.

Real servers on 127.0.0.1 (one per module and kind); the client's own timeout is made short
(0.5 s) so that a call of 1.5 s outlasts it. Sessions are not resumed (``resume=False``): a
client that gave up would lose the session, so a passing call shows the client waited."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from envsdk.client import EnvClient, Keepalive, ServerDeadline, Timeouts
from envsdk.env import Environment, RolloutRequest
from envsdk.errors import EnvTimeoutError, SessionLostError
from envsdk.schedulers import ToolScheduler
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoObservation, running_server
from envsdk.tools import tool
from envsdk.types import State
from tests.client.conftest import TcpProxy

pytestmark = pytest.mark.timeout(60)

#: Longer than the client's own timeout below, far shorter than the server's deadlines.
CALL_S = 1.5
#: The client's own request timeout: what it waits where the server announces nothing.
SHORT = ServerDeadline(otherwise=0.5)


class LongCallsEnvironment(Environment[EchoAction, EchoObservation, State]):
    """A step (``sleep:<seconds>``) and a tool (``nap``) that take as long as asked; the server
    allows 30 s for either."""

    step_timeout_s = 30.0

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or uuid.uuid4().hex)
        return EchoObservation(echoed_message="ready")

    def step(self, action: EchoAction) -> EchoObservation:
        if action.message.startswith("sleep:"):
            time.sleep(float(action.message.removeprefix("sleep:")))
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return self._state

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep for `seconds`.

        Args:
            seconds: How long.

        Returns:
            "rested", on the thread that slept.
        """
        time.sleep(seconds)
        return f"rested on {threading.get_ident()}"

    @tool
    def submit(self) -> str:
        """Judge the work (slowly, as a verifier may).

        Returns:
            The verdict.
        """
        time.sleep(CALL_S)
        return "judged"


@pytest.fixture(scope="module")
def long_url() -> Iterator[str]:
    with running_server(create_app(LongCallsEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4)) as url:
        yield url


@pytest.fixture(scope="module")
def short_url() -> Iterator[str]:
    """The same env with a step and tool deadline of 1 s (the server's setting wins over the class's)."""
    app = create_app(LongCallsEnvironment, EchoAction, EchoObservation, max_concurrent_envs=2, step_timeout_s=1.0)
    with running_server(app) as url:
        yield url


async def test_the_session_handshake_announces_how_long_each_request_may_take(long_url: str, short_url: str) -> None:
    async with EnvClient(long_url) as env:
        assert env.session is not None
        # A first reset builds the env (the factory's 60 s) before it resets it (60 s).
        assert env.session.deadlines_s == {"reset": 120.0, "step": 30.0, "mcp": 30.0, "state": 10.0}
        # The default waits the server's deadline and a margin; a number given is kept as it is.
        assert Timeouts().request == ServerDeadline()
        assert env.request_timeout("step") == 30.0 + ServerDeadline().margin
        assert env.request_timeout("mcp") == 30.0 + ServerDeadline().margin
    async with EnvClient(short_url, timeouts=Timeouts(request=7.0)) as env:
        assert env.session is not None and env.session.deadlines_s["step"] == 1.0
        assert env.request_timeout("step") == 7.0


async def test_a_step_longer_than_the_clients_own_timeout_is_waited_for(long_url: str) -> None:
    async with EnvClient(long_url, timeouts=Timeouts(request=SHORT), resume=False) as env:
        await env.reset()
        started = time.monotonic()
        result = await env.step({"message": f"sleep:{CALL_S}"})
        assert time.monotonic() - started >= CALL_S
        assert result.observation["echoed_message"] == f"sleep:{CALL_S}"
        # A tool call sent as OpenEnv's step action (what the tools scheduler sends).
        called = await env.step({"type": "call_tool", "tool_name": "nap", "arguments": {"seconds": CALL_S}})
        assert called.observation["error"] is None
        assert str(called.observation["result"]["data"]).startswith("rested")
        assert (await env.state())["step_count"] == 1
        assert env.session is not None and env.session.resumed is False


async def test_a_tool_call_over_mcp_longer_than_the_clients_own_timeout_is_waited_for(long_url: str) -> None:
    async with EnvClient(long_url, timeouts=Timeouts(request=SHORT), resume=False) as env:
        await env.reset()
        started = time.monotonic()
        assert str(await env.call_tool("nap", seconds=CALL_S)).startswith("rested")
        assert time.monotonic() - started >= CALL_S
        assert env.session is not None and env.session.resumed is False


async def test_a_connection_dropped_during_a_long_call_is_resumed_when_the_call_is_done(long_url: str) -> None:
    # The server answers the resume's handshake once the call in flight is done: the client waits
    # for it as long as the call may take, not its connect timeout (after which a second attempt
    # would carry a resume token the first one used up, and be refused).
    proxy = TcpProxy(int(long_url.rsplit(":", 1)[1]))
    await proxy.start()
    try:
        async with EnvClient(proxy.url, timeouts=Timeouts(connect=0.5, request=SHORT),
                             keepalive=Keepalive.disabled()) as env:
            await env.reset()
            step = asyncio.ensure_future(env.step({"message": f"sleep:{CALL_S}"}))
            await asyncio.sleep(0.3)
            proxy.drop_all()
            result = await step
            assert result.observation["echoed_message"] == f"sleep:{CALL_S}"
            assert env.session is not None and env.session.resumed is True and proxy.accepted == 2
            assert (await env.state())["step_count"] == 1
    finally:
        await proxy.stop()


async def test_a_request_timeout_given_as_a_number_is_kept(long_url: str) -> None:
    env = EnvClient(long_url, timeouts=Timeouts(request=0.5), resume=False)
    try:
        await env.reset()
        with pytest.raises(SessionLostError, match=r"no reply to step within 0\.5 s"):
            await env.step({"message": f"sleep:{CALL_S}"})
    finally:
        await env.close()


async def test_past_the_servers_deadline_the_client_hears_its_timeout_not_a_lost_session(short_url: str) -> None:
    # The server allows 1 s; the client waits that and its margin, so the server's TIMEOUT
    # reaches it (the episode ends in a typed error), where waiting exactly as long raced it.
    async with EnvClient(short_url, timeouts=Timeouts(request=ServerDeadline(margin=3.0, otherwise=0.5)),
                         resume=False) as env:
        await env.reset()
        with pytest.raises(EnvTimeoutError):
            await env.step({"message": "sleep:2.5"})
        await env.reset()  # a timed-out call ends the episode
        with pytest.raises(EnvTimeoutError):
            await env.call_tool("nap", seconds=2.5)


class _Stopper:
    """An agent that says it is done at once: the scheduler submits for it."""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        return "I am done."


async def test_a_slow_submit_the_server_allows_is_the_episodes_end(long_url: str) -> None:
    [trajectory] = await ToolScheduler(base_url=long_url, max_turns=2).run([RolloutRequest()], _Stopper())
    assert trajectory.status == "done" and trajectory.rollout_infos["submitted"] == "by the scheduler"
    assert trajectory.steps[-1].observation["result"]["data"] == "judged"


async def test_a_submit_past_the_servers_deadline_leaves_the_episode_in_an_error(short_url: str) -> None:
    # The call that was to judge the work gave no verdict: not an episode that scored 0.0.
    [trajectory] = await ToolScheduler(base_url=short_url, max_turns=2).run([RolloutRequest()], _Stopper())
    assert (trajectory.status, trajectory.error_kind) == ("error", "EnvTimeoutError"), trajectory.reason
    assert trajectory.reason is not None and trajectory.reason.startswith("EnvTimeoutError: ")
    assert "submitted" not in trajectory.rollout_infos and trajectory.success is None


@pytest.mark.parametrize("which", ["openenv_tally_url"])
async def test_a_server_that_announces_no_deadline_gets_the_clients_own_timeout(
    which: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(which)
    env = EnvClient(url, timeouts=Timeouts(request=SHORT))
    try:
        await env.reset()
        assert env.server_kind == "openenv" and env.request_timeout("mcp") == 0.5
        with pytest.raises(SessionLostError, match=r"no reply to tools/call within 0\.5 s"):
            await env.call_tool("nap", seconds=CALL_S)
    finally:
        await env.close()


@pytest.mark.parametrize("announced", [-5.0, float("nan"), float("inf")])
def test_an_announced_deadline_that_is_no_duration_counts_as_none(announced: float) -> None:
    assert ServerDeadline(otherwise=0.5).seconds(announced) == 0.5
    assert ServerDeadline(margin=1.0).seconds(0.0) == 1.0


@pytest.mark.parametrize("bad", [{"margin": -1.0}, {"otherwise": 0.0}, {"margin": float("nan")}])
def test_a_server_deadline_with_a_bad_number_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ServerDeadline(**bad)
