"""Every bad input gets a typed error frame, and the same socket keeps working afterwards."""

from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

from envsdk.protocol import decode_reply

from .helpers import frame, ws_url

STEP = frame(type="step", data={"message": "hi"})

# (what is sent, expected error code); sent in order on ONE socket.
BAD_INPUTS: list[tuple[str, str | bytes, str]] = [
    ("step before reset", STEP, "NOT_RESET"),
    ("not JSON", "{not json", "INVALID_JSON"),
    ("JSON array", "[1, 2, 3]", "VALIDATION_ERROR"),
    ("JSON string", '"hello"', "VALIDATION_ERROR"),
    ("unknown type", frame(type="bogus"), "UNKNOWN_TYPE"),
    ("no type", frame(no_type=True), "UNKNOWN_TYPE"),
    ("step missing data", frame(type="step"), "VALIDATION_ERROR"),
    ("extra top-level key", frame(type="reset", data={}, extra_top=1), "VALIDATION_ERROR"),
    ("oversized frame", frame(type="step", data={"message": "x" * 5000}), "FRAME_TOO_LARGE"),
    ("binary frame", b"\x00\x01binary", "INVALID_JSON"),
    ("reset", frame(type="reset", data={}), ""),
    ("action extra field", frame(type="step", data={"message": "x", "extra": 1}), "VALIDATION_ERROR"),
    ("action missing field", frame(type="step", data={"msg": "x"}), "VALIDATION_ERROR"),
    ("env raising", frame(type="step", data={"message": "raise"}), "EXECUTION_ERROR"),
    ("ending step", frame(type="step", data={"message": "done"}), ""),
    ("step after done", STEP, "EPISODE_DONE"),
]


@pytest.mark.timeout(30)
def test_every_bad_input_gets_its_error_code_and_the_socket_survives(serve_echo):
    url = serve_echo(max_frame_bytes=4096)
    with connect(ws_url(url)) as ws:
        # envsdk's own codes (NOT_RESET, EPISODE_DONE) go to a peer that did the handshake; a
        # plain OpenEnv peer gets OpenEnv's (test_openenv_parity.py).
        ws.send(frame(type="session"))
        assert decode_reply(ws.recv(timeout=5)).type == "session"
        for what, raw, code in BAD_INPUTS:
            ws.send(raw)
            reply = decode_reply(ws.recv(timeout=5))
            if code:
                assert reply.type == "error", what
                assert reply.data.code == code, (what, reply)
            else:
                assert reply.type == "observation", (what, reply)
        # A normal episode on the same socket after all of that.
        ws.send(frame(type="reset", data={"seed": 1}))
        assert decode_reply(ws.recv(timeout=5)).type == "observation"
        ws.send(STEP)
        reply = decode_reply(ws.recv(timeout=5))
        assert reply.type == "observation" and reply.data.observation["echoed_message"] == "hi"
        ws.send(frame(type="state"))
        assert json.loads(ws.recv(timeout=5))["data"]["step_count"] == 1


@pytest.mark.timeout(30)
def test_validation_error_lists_pydantic_errors_like_openenv(serve_echo):
    url = serve_echo()
    with connect(ws_url(url)) as ws:
        ws.send(frame(type="reset", data={}))
        ws.recv(timeout=5)
        ws.send(frame(type="step", data={"msg": "wrong field"}))
        data = json.loads(ws.recv(timeout=5))["data"]
    # The sentence a user reads first names the fields; the list is OpenEnv's.
    assert data["message"] == "Invalid message: message: Field required; msg: Extra inputs are not permitted"
    assert {e["type"] for e in data["errors"]} == {"missing", "extra_forbidden"}


@pytest.mark.timeout(30)
def test_unknown_reset_kwargs_are_refused_or_dropped_by_config(serve_echo):
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoObservation, running_server

    from .envs import StrictResetEnvironment

    for mode, expected in (("error", "error"), ("drop", "observation")):
        app = create_app(StrictResetEnvironment, EchoAction, EchoObservation, unknown_reset_kwargs=mode)
        with running_server(app, log_config=None) as url, connect(ws_url(url)) as ws:
            ws.send(frame(type="reset", data={"seed": 1, "difficulty": "hard", "colour": "red"}))
            reply = json.loads(ws.recv(timeout=5))
            assert reply["type"] == expected, mode
            if mode == "error":
                assert reply["data"]["code"] == "VALIDATION_ERROR"
                assert "colour" in reply["data"]["message"] and "difficulty" in reply["data"]["message"]
                assert "seed" in reply["data"]["message"]  # the accepted keys are listed


@pytest.mark.timeout(30)
def test_request_id_is_echoed_on_replies_and_errors(serve_echo):
    url = serve_echo()
    with connect(ws_url(url)) as ws:
        ws.send(frame(type="step", data={"message": "x"}, id="a1"))
        reply = json.loads(ws.recv(timeout=5))
        assert reply["id"] == "a1" and reply["data"]["code"] == "NOT_RESET"
        ws.send(frame(type="reset", data={}, id="a2"))
        assert json.loads(ws.recv(timeout=5))["id"] == "a2"
        ws.send(frame(type="reset", data={}))
        assert "id" not in json.loads(ws.recv(timeout=5))
