"""Lanes that cost nothing while idle: a session's lane thread exits once the session has had
no call for ``lane_idle_s`` and the next call starts a new one, with every call still run once,
in order; ``THREAD_BOUND`` envs keep their thread; the written-off-thread cap still holds."""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from typing import Any, ClassVar

import httpx
import pytest
from websockets.asyncio.client import connect

from envsdk.server import create_app
from envsdk.server.executors import Executors
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from .helpers import frame, ws_url

RESET = frame(type="reset", data={})
IDLE_S = 0.05


async def _ask(ws: Any, raw: str) -> dict[str, Any]:
    await ws.send(raw)
    return json.loads(await asyncio.wait_for(ws.recv(), 10))  # type: ignore[no-any-return]


def _step(message: str) -> str:
    return frame(type="step", data={"message": message})


async def _health_until(url: str, key: str, wanted: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """/health, polled until ``health[key] == wanted`` (bounded); the last answer."""
    async with httpx.AsyncClient() as http:
        for _ in range(int(timeout_s / 0.02)):
            health: dict[str, Any] = (await http.get(url + "/health")).json()
            if health[key] == wanted:
                return health
            await asyncio.sleep(0.02)
    return health


def _eventfds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
        except OSError:  # closed meanwhile
            pass
    return count


def _lane_threads() -> int:
    return sum(thread.name.startswith("envsdk-env-lane-") for thread in threading.enumerate())


@pytest.mark.timeout(30)
async def test_an_idle_sessions_lane_thread_exits_and_its_next_calls_still_run_in_order() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, lane_idle_s=IDLE_S, web=False)
    with running_server(app, log_config=None) as url:
        before_fds = _eventfds()
        sockets = [await connect(ws_url(url)) for _ in range(8)]
        try:
            for ws in sockets:
                assert (await _ask(ws, RESET))["type"] == "observation"
                assert (await _ask(ws, _step("a")))["data"]["metadata"] == {"step": 1}
            health = await _health_until(url, "lane_threads", 0)
            assert (health["lane_threads"], health["active_sessions"]) == (0, 8)
            for _ in range(500):  # the threads exit once told to, each closing its eventfd
                if _lane_threads() == 0 and _eventfds() <= before_fds:
                    break
                await asyncio.sleep(0.02)
            assert _lane_threads() == 0 and _eventfds() <= before_fds
            # Each session's next calls start a thread again and run in order, its episode kept.
            for ws in sockets:
                for _ in range(5):
                    await ws.send(_step("b"))
            for ws in sockets:
                steps = [json.loads(await asyncio.wait_for(ws.recv(), 10))["data"]["metadata"]["step"] for _ in range(5)]
                assert steps == [2, 3, 4, 5, 6]
            assert (await _health_until(url, "lane_threads", 0))["lane_threads"] == 0
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))


class ConnectionEnv(EchoEnvironment):
    """Keeps a handle in thread-local storage made in its constructor, as a driver bound to its
    thread does: on any other thread the handle is not there. Logs the thread (kernel id: a new
    thread often gets the Python ident of the one that exited) of each call."""

    calls: ClassVar[list[tuple[str, int]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()
        self.local.handle = "open"
        self._log("init")

    def _log(self, what: str) -> None:
        type(self).calls.append((what, threading.get_native_id()))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._log("reset")
        super().reset(seed=seed, episode_id=episode_id)
        return EchoObservation(echoed_message=type(self).__name__)

    def step(self, action: EchoAction) -> EchoObservation:
        self._log("step")
        assert self.local.handle == "open"  # AttributeError on any other thread
        return super().step(action)


class BoundConnectionEnv(ConnectionEnv):
    THREAD_BOUND = True
    calls: ClassVar[list[tuple[str, int]]] = []


class PlainConnectionEnv(ConnectionEnv):
    calls: ClassVar[list[tuple[str, int]]] = []


@pytest.mark.timeout(30)
async def test_a_thread_bound_env_keeps_its_thread_across_idle_time() -> None:
    """The factory is a plain function, so the declaration is only seen on the env it built:
    one session gets a THREAD_BOUND env, the other a plain one, served side by side."""
    built = iter([BoundConnectionEnv, PlainConnectionEnv])

    def factory():  # type: ignore[no-untyped-def]  # no return annotation: the server cannot tell the class
        return next(built)()

    BoundConnectionEnv.calls, PlainConnectionEnv.calls = [], []
    app = create_app(factory, EchoAction, EchoObservation, lane_idle_s=IDLE_S, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as first, connect(ws_url(url)) as second:
            names = [(await _ask(ws, RESET))["data"]["observation"]["echoed_message"] for ws in (first, second)]
            bound, plain = (first, second) if names[0] == "BoundConnectionEnv" else (second, first)
            assert sorted(names) == ["BoundConnectionEnv", "PlainConnectionEnv"]
            # The plain env's lane parks; the bound one's thread stays.
            assert (await _health_until(url, "lane_threads", 1))["lane_threads"] == 1
            await asyncio.sleep(IDLE_S * 6)
            assert (await _health_until(url, "lane_threads", 1))["lane_threads"] == 1
            for _ in range(3):
                reply = await _ask(bound, _step("x"))
                assert reply["type"] == "observation", reply
            moved = await _ask(plain, _step("x"))  # a new thread, without the handle
            assert moved["data"]["code"] == "EXECUTION_ERROR" and "AttributeError" in moved["data"]["message"]
    assert [what for what, _ in BoundConnectionEnv.calls] == ["init", "reset", "step", "step", "step"]
    assert len({thread for _, thread in BoundConnectionEnv.calls}) == 1
    assert len({thread for _, thread in PlainConnectionEnv.calls}) == 2


class Declared(EchoEnvironment):
    THREAD_BOUND = True


class Shared(EchoEnvironment):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True


@pytest.mark.timeout(30)
async def test_only_lanes_of_undeclared_envs_park() -> None:
    executors = Executors(max_abandoned_threads=4, lane_idle_s=IDLE_S)
    lanes = {cls: executors.lane(cls) for cls in (EchoEnvironment, Declared, Shared)}
    try:
        threads = {cls: await lane.submit(threading.get_native_id) for cls, lane in lanes.items()}
        for _ in range(200):
            if lanes[EchoEnvironment].parked:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(IDLE_S * 4)
        assert [lane.parked for lane in lanes.values()] == [True, False, False]
        assert executors.live_lanes == 2
        again = {cls: await lane.submit(threading.get_native_id) for cls, lane in lanes.items()}
        assert again[Declared] == threads[Declared] and again[Shared] == threads[Shared]
        assert again[EchoEnvironment] != threads[EchoEnvironment] and executors.live_lanes == 3
    finally:
        executors.shutdown()


@pytest.mark.timeout(60)
async def test_calls_queued_as_a_lane_parks_are_neither_lost_nor_reordered() -> None:
    """Parking passes forced between calls, while the lanes finish calls on their threads: each
    lane must run every call once, in the order queued, whichever way it was handed over."""
    executors = Executors(max_abandoned_threads=4, lane_idle_s=0.001)
    lanes = [executors.lane() for _ in range(8)]
    seen: list[list[int]] = [[] for _ in lanes]
    threads: list[set[threading.Thread]] = [set() for _ in lanes]
    rng = random.Random(7)

    def note(i: int, n: int) -> int:
        seen[i].append(n)
        threads[i].add(threading.current_thread())
        return n

    try:
        pending = []
        for n in range(600):
            for i, lane in enumerate(lanes):
                how = rng.randrange(3)
                if how == 0:
                    pending.append(lane.submit(note, (i, n)))
                elif how == 1:
                    lane.post(note, i, n)
                else:
                    call = lane.call(note, (i, n), {}, rng.choice((0.0, 0.0005)))
                    if not call.settled:
                        assert call.future is not None
                        pending.append(call.future)
                    else:
                        assert call.result == n
                executors.park_idle()
                executors.park_idle()  # twice: parks a lane that had finished everything
            if n % 10 == 0:
                await asyncio.sleep(rng.choice((0, 0.001, 0.003)))
            if n % 100 == 99:  # let every lane finish, then park them all: each restarts after
                for _ in range(500):
                    if all(lane._ran == lane._queued for lane in lanes):
                        break
                    await asyncio.sleep(0.01)
                executors.park_idle()
                executors.park_idle()
                assert all(lane.parked for lane in lanes)
        await asyncio.wait_for(asyncio.gather(*pending), 20)
        for _ in range(200):
            if all(len(order) == 600 for order in seen):
                break
            await asyncio.sleep(0.02)
        assert all(order == list(range(600)) for order in seen)
        assert all(len(t) >= 6 for t in threads)  # each lane parked and restarted
    finally:
        executors.shutdown()


RELEASE = threading.Event()


class HangingEnv(EchoEnvironment):
    """The echo env whose step "hang" blocks until the test lets it go."""

    def step(self, action: EchoAction) -> EchoObservation:
        if action.message == "hang":
            RELEASE.wait(30)
        return super().step(action)


@pytest.mark.timeout(60)
async def test_the_written_off_thread_cap_holds_and_parked_lanes_still_restart() -> None:
    """Two hung steps use up a cap of two written-off threads: a new session is refused until
    they return, but a session whose lane parked meanwhile gets its thread back (parking is no
    leak: only written-off threads count)."""
    RELEASE.clear()
    app = create_app(
        HangingEnv, EchoAction, EchoObservation, lane_idle_s=IDLE_S, step_timeout_s=0.2,
        max_abandoned_threads=2, web=False,
    )
    with running_server(app, log_config=None) as url:
        try:
            async with connect(ws_url(url)) as idle, connect(ws_url(url)) as one, connect(ws_url(url)) as two:
                for ws in (idle, one, two):
                    await _ask(ws, RESET)
                hung = await asyncio.gather(*(_ask(ws, _step("hang")) for ws in (one, two)))
                assert [reply["data"]["code"] for reply in hung] == ["TIMEOUT", "TIMEOUT"]
                health = await _health_until(url, "lane_threads", 0)
                assert (health["lane_threads"], health["abandoned_threads"]) == (0, 2)
                async with connect(ws_url(url)) as refused:
                    reply = json.loads(await asyncio.wait_for(refused.recv(), 10))
                assert reply["data"]["code"] == "CAPACITY_REACHED"
                assert (reply["data"]["abandoned_threads"], reply["data"]["max_abandoned_threads"]) == (2, 2)
                assert (await _ask(idle, _step("still here")))["data"]["metadata"] == {"step": 1}
                RELEASE.set()
                assert (await _health_until(url, "abandoned_threads", 0))["abandoned_threads"] == 0
                async with connect(ws_url(url)) as later:
                    assert (await _ask(later, RESET))["type"] == "observation"
        finally:
            RELEASE.set()
