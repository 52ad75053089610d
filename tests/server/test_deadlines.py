"""Server-side deadlines: TIMEOUT for the slow session, normal speed for the others."""

from __future__ import annotations

import json
import threading
import time

import pytest
from websockets.sync.client import connect

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoObservation, running_server

from .envs import AsyncSleepyEnvironment
from .helpers import frame, ws_url

RESET = frame(type="reset", data={})


def _call(ws, raw: str) -> dict:
    ws.send(raw)
    return json.loads(ws.recv(timeout=10))


@pytest.mark.timeout(30)
def test_a_step_past_its_deadline_times_out_while_others_keep_stepping(serve_echo):
    url = serve_echo(step_timeout_s=0.3)
    others = [connect(ws_url(url)) for _ in range(3)]
    latencies: list[float] = []
    stop = threading.Event()

    def keep_stepping(ws) -> None:
        _call(ws, RESET)
        while not stop.is_set():
            started = time.perf_counter()
            assert _call(ws, frame(type="step", data={"message": "x"}))["type"] == "observation"
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=keep_stepping, args=(ws,)) for ws in others]
    try:
        with connect(ws_url(url)) as slow:
            assert _call(slow, frame(type="session"))["type"] == "session"  # envsdk's own codes, please
            _call(slow, RESET)
            for t in threads:
                t.start()
            started = time.perf_counter()
            reply = _call(slow, frame(type="step", data={"message": "sleep:3"}))
            elapsed = time.perf_counter() - started
            assert reply["data"]["code"] == "TIMEOUT" and reply["data"]["timeout_s"] == 0.3
            assert elapsed < 2.0  # the reply came at the deadline, not when the 3 s sleep ended
            # The episode is over: step and state are refused until a reset builds a new env.
            after = _call(slow, frame(type="step", data={"message": "x"}))
            assert after["data"]["code"] == "NOT_RESET" and "timed out" in after["data"]["message"]
            assert _call(slow, frame(type="state"))["data"]["code"] == "NOT_RESET"
            assert _call(slow, RESET)["type"] == "observation"
            assert _call(slow, frame(type="state"))["data"]["step_count"] == 0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for ws in others:
            ws.close()
    assert len(latencies) > 10
    # Wide margins (a loaded 2-core CI box) that still prove nobody waited for the 3 s sleeper.
    assert max(latencies) < 1.5


@pytest.mark.timeout(30)
def test_an_async_step_past_its_deadline_is_cancelled():
    AsyncSleepyEnvironment.cancelled_steps = 0
    app = create_app(AsyncSleepyEnvironment, EchoAction, EchoObservation, step_timeout_s=0.2)
    with running_server(app, log_config=None) as url, connect(ws_url(url)) as ws:
        _call(ws, RESET)
        assert _call(ws, frame(type="step", data={"message": "sleep:5"}))["data"]["code"] == "TIMEOUT"
        assert _call(ws, RESET)["type"] == "observation"
        assert _call(ws, frame(type="step", data={"message": "ok"}))["type"] == "observation"
    assert AsyncSleepyEnvironment.cancelled_steps == 1


@pytest.mark.timeout(30)
def test_the_env_class_deadline_applies_when_the_config_sets_none():
    class Impatient(AsyncSleepyEnvironment):
        step_timeout_s = 0.2

    app = create_app(Impatient, EchoAction, EchoObservation)
    with running_server(app, log_config=None) as url, connect(ws_url(url)) as ws:
        _call(ws, RESET)
        assert _call(ws, frame(type="step", data={"message": "sleep:5"}))["data"]["code"] == "TIMEOUT"
