"""HTTP routes, Prometheus metrics, and quiet logs on normal closes."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from websockets.sync.client import connect

from .helpers import frame, wait_for_active, ws_url


@pytest.mark.timeout(30)
def test_health_metadata_and_schema_describe_the_server(serve_echo):
    url = serve_echo(max_concurrent_envs=3)
    assert httpx.get(url + "/health").json() == {
        "status": "healthy", "active_sessions": 0, "max_sessions": 3, "env_name": "EchoEnvironment",
        "lane_threads": 0, "abandoned_threads": 0, "max_abandoned_threads": 64,
    }
    meta = httpx.get(url + "/metadata").json()
    assert meta["name"] == "EchoEnvironment" and meta["version"] and meta["description"]
    schema = httpx.get(url + "/schema").json()
    assert schema["action"]["required"] == ["message"]
    assert "echoed_message" in schema["observation"]["properties"]
    assert "step_count" in schema["state"]["properties"]


@pytest.mark.timeout(30)
def test_stateless_http_routes_answer_like_openenv(serve_echo):
    url = serve_echo()
    reset = httpx.post(url + "/reset", json={"seed": 1}).json()
    assert reset == {
        "observation": {"metadata": {}, "echoed_message": "ready", "message_length": 0},
        "reward": 0.0, "done": False, "metadata": None,
    }
    assert httpx.post(url + "/reset", content=b"").status_code == 200
    step = httpx.post(url + "/step", json={"action": {"message": "hello"}}).json()
    assert step["reward"] == pytest.approx(0.5) and step["metadata"] == {"step": 1}
    assert httpx.post(url + "/step", json={"action": {"msg": "x"}}).status_code == 422
    assert httpx.post(url + "/step", json={"message": "not nested"}).status_code == 422
    failed = httpx.post(url + "/step", json={"action": {"message": "raise"}})
    assert failed.status_code == 500 and failed.json()["detail"]["code"] == "EXECUTION_ERROR"
    assert httpx.get(url + "/state").json()["step_count"] == 0
    assert httpx.get(url + "/health").json()["active_sessions"] == 0


@pytest.mark.timeout(30)
def test_metrics_count_steps_resets_errors_in_prometheus_text(serve_echo):
    url = serve_echo(max_concurrent_envs=5)
    with connect(ws_url(url)) as ws:
        for raw in (frame(type="reset", data={}), frame(type="step", data={"message": "a"}),
                    frame(type="step", data={"message": "b"}), "{bad"):
            ws.send(raw)
            ws.recv(timeout=5)
        text = httpx.get(url + "/metrics").text
    lines = set(text.splitlines())
    assert "envsdk_active_sessions 1" in lines and "envsdk_max_sessions 5" in lines
    assert "envsdk_steps_total 2" in lines and "envsdk_resets_total 1" in lines
    assert 'envsdk_errors_total{code="INVALID_JSON"} 1' in lines
    assert 'envsdk_step_duration_seconds_bucket{le="+Inf"} 2' in lines
    assert "# TYPE envsdk_step_duration_seconds histogram" in lines


@pytest.mark.timeout(30)
def test_normal_closes_leave_no_traceback_or_error_in_the_log(serve_echo, caplog):
    caplog.set_level(logging.DEBUG)
    url = serve_echo()
    with connect(ws_url(url)) as ws:  # the protocol's close message
        ws.send(frame(type="reset", data={}))
        ws.recv(timeout=5)
        ws.send(frame(type="close"))
    with connect(ws_url(url)) as ws:  # a plain WebSocket close
        ws.send(frame(type="reset", data={}))
        ws.recv(timeout=5)
    with connect(ws_url(url)) as ws:  # a resumable session, closed by the client
        ws.send(frame(type="session"))
        json.loads(ws.recv(timeout=5))
        ws.send(frame(type="close"))
    assert wait_for_active(url, 0) == 0
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]
