"""The execution core under realistic env faults, one test per finding of the issue that
redesigned it: every test runs a real uvicorn server and talks to it over a real socket.

1. an observation that cannot be encoded is a typed, recorded error, never a re-applied step;
2. hung calls (steps, constructors) cost their own thread only, and SIGTERM still exits;
3. an env is closed only after its timed-out call returned;
4. no env instance leaks when a session is closed while a reset builds a fresh env;
5. the replay record is bounded in bytes;
6. a request id reused with a different request is refused (ID_REUSED);
7. ``state`` runs off the event loop under a deadline; SystemExit from an env is an error frame;
8. each session's calls run on one thread while it is busy (one thread for all, for single-thread envs;
   tests/server/test_idle_lanes.py: idle lanes let their thread go, THREAD_BOUND envs keep it).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Any, ClassVar

import httpx
import pytest
from server.helpers import frame, wait_for_active, ws_url
from websockets.asyncio.client import connect

from envsdk.client import EnvClient
from envsdk.errors import ServerError
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from envsdk.types import State

from .envs import CLOSE_LOG_ENV
from .helpers import start_server, stop_server


async def _call(ws: Any, raw: str, timeout: float = 10) -> dict[str, Any]:
    await ws.send(raw)
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))  # type: ignore[no-any-return]


def _resume_url(url: str, info: dict[str, Any]) -> str:
    return ws_url(url, f"session_id={info['session_id']}&resume_token={info['resume_token']}")


RESET = frame(type="reset", data={})


# ---------------------------------------------------------------- 1. unencodable observation


class UnencodableEnv(EchoEnvironment):
    """Echo env whose "bad" step returns an observation pydantic cannot serialise (as a numpy
    array in an observation would); counts the steps it applied."""

    applied: ClassVar[int] = 0

    def step(self, action: EchoAction) -> EchoObservation:
        type(self).applied += 1
        obs = super().step(action)
        if action.message == "bad":
            obs.metadata = {"payload": object()}
        return obs


@pytest.mark.timeout(30)
async def test_an_unencodable_observation_is_a_recorded_execution_error_and_never_reapplied():
    UnencodableEnv.applied = 0
    app = create_app(UnencodableEnv, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as ws:
            await _call(ws, frame(type="session"))
            await _call(ws, RESET)
            bad = frame(type="step", data={"message": "bad"}, id="b1")
            first = await _call(ws, bad)
            assert first["type"] == "error" and first["data"]["code"] == "EXECUTION_ERROR", first
            assert "cannot be encoded" in first["data"]["message"] and first["id"] == "b1"
            assert await _call(ws, bad) == first  # the retry is answered from the record
            assert UnencodableEnv.applied == 1
            ok = await _call(ws, frame(type="step", data={"message": "fine"}, id="b2"))
            assert ok["type"] == "observation" and ok["data"]["observation"]["metadata"] == {"step": 2}
        # The envsdk client's step raises the typed error once; the step ran once.
        async with EnvClient(url) as client:
            await client.reset()
            with pytest.raises(ServerError) as info:
                await client.step({"message": "bad"})
            # EXECUTION_ERROR has no class of its own: the plain ServerError, not a subclass
            # (EnvTimeoutError, NotResetError ...) nor a transport error, with the server's code.
            assert type(info.value) is ServerError and info.value.code == "EXECUTION_ERROR", repr(info.value)
            assert "cannot be encoded" in info.value.message
            assert UnencodableEnv.applied == 3


# ---------------------------------------------------------------- 2. hung calls, SIGTERM


@pytest.mark.timeout(60)
async def test_hung_steps_past_their_deadline_leave_the_server_answering_new_clients():
    hung = 8  # more than the old shared pool's threads on this machine
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, step_timeout_s=0.3, web=False)
    with running_server(app, log_config=None) as url:
        sockets = [await connect(ws_url(url)) for _ in range(hung)]
        try:
            for ws in sockets:
                await _call(ws, RESET)
            replies = await asyncio.gather(*(_call(ws, frame(type="step", data={"message": "sleep:8"})) for ws in sockets))
            assert [r["data"]["code"] for r in replies] == ["TIMEOUT"] * hung
            started = time.monotonic()
            async with connect(ws_url(url)) as newcomer:
                assert (await _call(newcomer, RESET, timeout=5))["type"] == "observation"
                assert (await _call(newcomer, frame(type="step", data={"message": "hi"}), timeout=5))["type"] == "observation"
            assert time.monotonic() - started < 2.0  # generous for a loaded box; it was never answered before
            health = httpx.get(url + "/health").json()
            assert health["abandoned_threads"] == hung and health["max_abandoned_threads"] == 64
            assert f"envsdk_abandoned_threads {hung}" in httpx.get(url + "/metrics").text
            # The timed-out sessions themselves start over at once, on fresh lanes.
            assert (await _call(sockets[0], RESET, timeout=5))["type"] == "observation"
        finally:
            for ws in sockets:
                await ws.close()


@pytest.mark.timeout(60)
async def test_written_off_threads_are_capped_and_the_cap_frees_itself_when_they_return():
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, step_timeout_s=0.2, max_abandoned_threads=2, web=False)
    with running_server(app, log_config=None) as url:
        sockets = [await connect(ws_url(url)) for _ in range(2)]
        try:
            for ws in sockets:
                await _call(ws, RESET)
            for ws in sockets:
                assert (await _call(ws, frame(type="step", data={"message": "sleep:3"})))["data"]["code"] == "TIMEOUT"
            async with connect(ws_url(url)) as refused:  # its env would need a new thread
                error = json.loads(await asyncio.wait_for(refused.recv(), 10))
            assert error["data"]["code"] == "CAPACITY_REACHED", error
            assert (error["data"]["abandoned_threads"], error["data"]["max_abandoned_threads"]) == (2, 2)
            for _ in range(100):  # the hung steps return after 3 s; their threads exit
                async with httpx.AsyncClient() as http:
                    if (await http.get(url + "/health")).json()["abandoned_threads"] == 0:
                        break
                await asyncio.sleep(0.1)
            async with connect(ws_url(url)) as admitted:
                assert (await _call(admitted, RESET))["type"] == "observation"
        finally:
            for ws in sockets:
                await ws.close()


class HangingConstructorEnv(EchoEnvironment):
    """Its constructor hangs for 3 s; its class sets a 0.3 s factory deadline."""

    factory_timeout_s = 0.3
    built: ClassVar[int] = 0
    closed: ClassVar[int] = 0

    def __init__(self) -> None:
        time.sleep(3.0)
        super().__init__()
        type(self).built += 1

    def close(self) -> None:
        type(self).closed += 1


@pytest.mark.timeout(30)
async def test_a_hanging_constructor_times_out_frees_its_slot_and_its_env_is_closed_when_built():
    HangingConstructorEnv.built = HangingConstructorEnv.closed = 0
    app = create_app(HangingConstructorEnv, EchoAction, EchoObservation, max_concurrent_envs=1, web=False)
    with running_server(app, log_config=None) as url:
        started = time.monotonic()
        async with connect(ws_url(url)) as ws:
            refused = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert refused["data"]["code"] == "TIMEOUT" and refused["data"]["timeout_s"] == 0.3
        assert time.monotonic() - started < 2.0
        assert httpx.get(url + "/health").json()["active_sessions"] == 0  # the slot is free again
        for _ in range(200):  # the constructor returns after 3 s; its env is then closed
            if HangingConstructorEnv.closed:
                break
            await asyncio.sleep(0.05)
        assert (HangingConstructorEnv.built, HangingConstructorEnv.closed) == (1, 1)


@pytest.mark.timeout(60)
async def test_sigterm_exits_within_the_drain_timeout_while_a_step_never_returns(tmp_path):
    close_log = tmp_path / "closes.txt"
    close_log.touch()
    server = await asyncio.to_thread(
        start_server, "reliability.apps:short_drain", tmp_path / "server.log", env={CLOSE_LOG_ENV: str(close_log)},
    )
    try:
        ws = await connect(ws_url(server.url))
        await _call(ws, RESET)
        await ws.send(frame(type="step", data={"message": "sleep:600"}))  # default deadline: 60 s
        await asyncio.sleep(0.3)
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        told = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert told["data"]["code"] == "SHUTTING_DOWN"
        exited = await asyncio.to_thread(_wait_exit, server.proc, 15.0)
        assert exited is not None, "the server did not exit within 15 s of SIGTERM"
        # drain_timeout_s (0.3) + the close deadline (5 s, the wait for envs to close) + margin
        assert time.monotonic() - sigterm_at < 0.3 + 5.0 + 2.5
        assert "Traceback" not in server.log(), server.log()
    finally:
        await asyncio.to_thread(stop_server, server, signal.SIGKILL)


def _wait_exit(proc: Any, timeout_s: float) -> int | None:
    try:
        return int(proc.wait(timeout_s))
    except Exception:
        return None


# ---------------------------------------------------------------- 3. close after the call


class TimedEnv(EchoEnvironment):
    """Records when its steps return and when it is closed, and on which threads."""

    events: ClassVar[list[tuple[str, float, int]]] = []

    def __init__(self) -> None:
        super().__init__()
        type(self).events.append(("init", time.monotonic(), threading.get_ident()))

    def step(self, action: EchoAction) -> EchoObservation:
        try:
            return super().step(action)
        finally:
            type(self).events.append(("step", time.monotonic(), threading.get_ident()))

    def close(self) -> None:
        type(self).events.append(("close", time.monotonic(), threading.get_ident()))


@pytest.mark.timeout(30)
async def test_an_env_is_closed_only_after_its_timed_out_step_returned():
    TimedEnv.events = []
    app = create_app(TimedEnv, EchoAction, EchoObservation, step_timeout_s=0.3, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as ws:
            await _call(ws, RESET)
            assert (await _call(ws, frame(type="step", data={"message": "sleep:1.5"})))["data"]["code"] == "TIMEOUT"
            await ws.send(frame(type="close"))
        for _ in range(100):
            if any(kind == "close" for kind, _, _ in TimedEnv.events):
                break
            await asyncio.sleep(0.05)
    events = {kind: (at, thread) for kind, at, thread in TimedEnv.events}
    assert set(events) == {"init", "step", "close"}
    assert events["close"][0] >= events["step"][0]  # never while the step was running
    assert events["init"][1] == events["step"][1] == events["close"][1]  # one thread, start to end


# ---------------------------------------------------------------- 4. no leaked env


class SlowRebuildEnv(EchoEnvironment):
    """Counts live instances; every construction after the first takes 0.6 s."""

    built: ClassVar[int] = 0
    closed: ClassVar[int] = 0

    def __init__(self) -> None:
        if type(self).built:
            time.sleep(0.6)
        super().__init__()
        type(self).built += 1

    def close(self) -> None:
        type(self).closed += 1


@pytest.mark.timeout(60)
async def test_a_session_closed_while_a_reset_rebuilds_its_env_leaks_no_instance():
    SlowRebuildEnv.built = SlowRebuildEnv.closed = 0
    app = create_app(SlowRebuildEnv, EchoAction, EchoObservation, step_timeout_s=0.3, resume_window_s=10, web=False)
    with running_server(app, log_config=None) as url:
        for cycle in range(3):
            ws = await connect(ws_url(url))
            info = (await _call(ws, frame(type="session", id="h")))["data"]
            await _call(ws, frame(type="reset", data={}, id="r1"))
            timed_out = await _call(ws, frame(type="step", data={"message": "sleep:1"}, id="s1"))
            assert timed_out["data"]["code"] == "TIMEOUT", cycle
            await ws.send(frame(type="reset", data={}, id="r2"))  # builds a fresh env (0.6 s)
            await asyncio.sleep(0.1)
            async with connect(_resume_url(url, info)) as resumed:  # supersedes ws
                await resumed.send(frame(type="close"))
                await resumed.wait_closed()
            await ws.close()
        assert await asyncio.to_thread(wait_for_active, url, 0) == 0
        for _ in range(100):
            if SlowRebuildEnv.built == SlowRebuildEnv.closed:
                break
            await asyncio.sleep(0.05)
        assert SlowRebuildEnv.built - SlowRebuildEnv.closed == 0, (SlowRebuildEnv.built, SlowRebuildEnv.closed)


# ---------------------------------------------------------------- 5. replay bounded in bytes


@pytest.mark.timeout(60)
async def test_the_replay_record_is_bounded_in_bytes_and_still_replays_the_latest_reply():
    big = 1024 * 1024
    bound = 4 * big  # the default replay_window_bytes
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url), max_size=None) as ws:
            await _call(ws, frame(type="session"))
            await _call(ws, RESET)
            message = "x" * big  # echoed back: each reply is over 1 MiB
            for i in range(12):
                last = await _call(ws, frame(type="step", data={"message": message}, id=f"s{i}"))
            (session,) = app.state.envsdk_sessions.sessions()
            held = sum(len(v if isinstance(v, str) else v[1]) for v in session._replies.values())
            assert held <= bound + len(json.dumps(last)) + 1024, held  # not 12 × 1 MiB
            again = await _call(ws, frame(type="step", data={"message": message}, id="s11"))
            assert again == last  # the latest reply is always kept: its retry is exactly-once
            assert (await _call(ws, frame(type="state")))["data"]["step_count"] == 12


# ---------------------------------------------------------------- 6. id bound to its request


@pytest.mark.timeout(30)
async def test_a_request_id_reused_with_a_different_request_is_refused_and_nothing_is_applied():
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as ws:
            await _call(ws, frame(type="session"))
            await _call(ws, frame(type="reset", data={"seed": 1}, id="r"))
            refused = await _call(ws, frame(type="reset", data={"seed": 2}, id="r"))
            assert refused["data"]["code"] == "ID_REUSED" and refused["id"] == "r"
            first = await _call(ws, frame(type="step", data={"message": "a"}, id="x"))
            again = await _call(ws, frame(type="step", data={"message": "b"}, id="x"))
            assert again["type"] == "error" and again["data"]["code"] == "ID_REUSED"
            assert await _call(ws, frame(type="step", data={"message": "a"}, id="x")) == first
            assert (await _call(ws, frame(type="state")))["data"]["step_count"] == 1


# ---------------------------------------------------------------- 7. state off the loop, SystemExit


class SlowStateEnv(EchoEnvironment):
    """Reading ``state`` takes 3 s the first time."""

    reads: ClassVar[int] = 0

    @property
    def state(self) -> State:
        type(self).reads += 1
        if type(self).reads == 1:
            time.sleep(3.0)
        return super().state


@pytest.mark.timeout(30)
async def test_a_slow_state_stalls_neither_health_nor_other_sessions():
    SlowStateEnv.reads = 0
    app = create_app(SlowStateEnv, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as slow, connect(ws_url(url)) as other:
            await _call(slow, RESET)
            await _call(other, RESET)
            await slow.send(frame(type="state"))
            await asyncio.sleep(0.2)  # the state read is sleeping now
            async with httpx.AsyncClient() as http:
                started = time.monotonic()
                assert (await http.get(url + "/health", timeout=10)).status_code == 200
                health_s = time.monotonic() - started
            started = time.monotonic()
            for _ in range(5):
                assert (await _call(other, frame(type="step", data={"message": "m"})))["type"] == "observation"
            steps_s = time.monotonic() - started
            state = json.loads(await asyncio.wait_for(slow.recv(), 10))
            assert state["type"] == "state"
    assert health_s < 1.0 and steps_s < 1.0, (health_s, steps_s)


class ImpatientStateEnv(SlowStateEnv):
    state_timeout_s = 0.3


@pytest.mark.timeout(30)
async def test_a_state_past_its_deadline_times_out():
    SlowStateEnv.reads = 0
    app = create_app(ImpatientStateEnv, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as ws:
            await _call(ws, RESET)
            assert (await _call(ws, frame(type="state")))["data"]["code"] == "TIMEOUT"
            assert (await _call(ws, RESET))["type"] == "observation"


class ExitingEnv(EchoEnvironment):
    """``exit`` raises SystemExit, ``interrupt`` KeyboardInterrupt (sync); async variant below."""

    def step(self, action: EchoAction) -> EchoObservation:
        if action.message == "exit":
            raise SystemExit(3)
        if action.message == "interrupt":
            raise KeyboardInterrupt
        return super().step(action)


class AsyncExitingEnv(EchoEnvironment):
    async def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        if action.message == "exit":
            raise SystemExit(3)
        return EchoEnvironment.step(self, action)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("env_class", [ExitingEnv, AsyncExitingEnv], ids=["sync", "async"])
async def test_system_exit_from_an_env_is_an_error_frame_and_the_server_goes_on(env_class):
    app = create_app(env_class, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        async with connect(ws_url(url)) as ws:
            await _call(ws, RESET)
            for message in ("exit", "interrupt") if env_class is ExitingEnv else ("exit",):
                reply = await _call(ws, frame(type="step", data={"message": message}))
                assert reply["type"] == "error" and reply["data"]["code"] == "EXECUTION_ERROR", reply
                assert ("SystemExit" if message == "exit" else "KeyboardInterrupt") in reply["data"]["message"]
            assert (await _call(ws, frame(type="step", data={"message": "on"})))["type"] == "observation"
        assert httpx.get(url + "/health").status_code == 200


# ---------------------------------------------------------------- 8. one thread per session


class ThreadLoggingEnv(EchoEnvironment):
    """Records the thread of every call of every instance (constructor to close)."""

    calls: ClassVar[list[tuple[int, str, int]]] = []

    def __init__(self) -> None:
        super().__init__()
        self._log("init")

    def _log(self, what: str) -> None:
        type(self).calls.append((id(self), what, threading.get_ident()))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._log("reset")
        return super().reset(seed=seed, episode_id=episode_id)

    def step(self, action: EchoAction) -> EchoObservation:
        self._log("step")
        return super().step(action)

    @property
    def state(self) -> State:
        self._log("state")
        return super().state

    def close(self) -> None:
        self._log("close")


class SingleThreadEnv(ThreadLoggingEnv):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True
    calls: ClassVar[list[tuple[int, str, int]]] = []


async def _episodes(url: str, sessions: int) -> None:
    async def one() -> None:
        async with connect(ws_url(url)) as ws:
            for _ in range(3):
                await _call(ws, RESET)
                for i in range(8):
                    await _call(ws, frame(type="step", data={"message": f"m{i}"}))
                await _call(ws, frame(type="state"))
            await ws.send(frame(type="close"))
            await ws.wait_closed()

    await asyncio.gather(*(one() for _ in range(sessions)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_class", [ThreadLoggingEnv, SingleThreadEnv], ids=["lane-per-session", "single-thread"])
async def test_every_call_of_a_session_runs_on_one_thread(env_class):
    env_class.calls = []
    app = create_app(env_class, EchoAction, EchoObservation, web=False)
    with running_server(app, log_config=None) as url:
        await _episodes(url, 6)
        assert await asyncio.to_thread(wait_for_active, url, 0) == 0
        for _ in range(100):
            if sum(what == "close" for _, what, _ in env_class.calls) == 6:
                break
            await asyncio.sleep(0.05)
    threads: dict[int, set[int]] = {}
    for instance, _, thread in env_class.calls:
        threads.setdefault(instance, set()).add(thread)
    assert len(threads) == 6 and len(env_class.calls) == 6 * (1 + 3 * 10 + 1)
    assert all(len(t) == 1 for t in threads.values()), threads  # 32 calls each, one thread each
    distinct = set().union(*threads.values())
    assert len(distinct) == (1 if env_class is SingleThreadEnv else 6)
    assert threading.main_thread().ident not in distinct
