"""Fuzzing one real server: over 10,000 generated frames (random bytes, random JSON, mutated
valid frames, huge numbers, deep nesting, wrong types, binary and oversized frames); each
gets a reply, a typed error or a protocol close, and the server still serves an episode
afterwards. And an oversized frame is refused without being held in memory."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server.helpers import wait_for_active, ws_url
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from envsdk.client import EnvClient
from envsdk.protocol import ErrorCode, decode_reply
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from .helpers import serve_process

# Raw WebSocket frame header of a masked text frame declaring a 100 MiB payload.
OVERSIZED_BYTES = 100 * 1024 * 1024
_OVERSIZED_HEADER = bytes([0x81, 0x80 | 127]) + OVERSIZED_BYTES.to_bytes(8, "big") + b"\0\0\0\0"

MAX_FRAME_BYTES = 64 * 1024
WS_MAX_SIZE = 256 * 1024
FRAMES_PER_EXAMPLE = 50
EXAMPLES = 205  # 10,250 frames
ERROR_CODES = {code.value for code in ErrorCode}

# ---------------------------------------------------------------- frames

Frame = tuple[str, Any]  # ("text", str) | ("binary", bytes) | ("text-bytes", bytes: maybe not UTF-8)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
request_ids = st.none() | st.text(max_size=8) | st.integers() | st.text(min_size=129, max_size=140)


@st.composite
def valid_requests(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["reset", "step", "step", "step", "state", "session", "close"]))
    request: dict[str, Any] = {"type": kind}
    if kind == "reset":
        request["data"] = {"seed": draw(st.integers(0, 2**31))}
    elif kind == "step":
        request["data"] = {"message": draw(st.text(max_size=30).filter(lambda m: not m.startswith("sleep:")))}
    if draw(st.booleans()):
        request["id"] = draw(st.text(min_size=1, max_size=8))
    return request


@st.composite
def mutated_requests(draw: st.DrawFn) -> Any:
    request = draw(valid_requests())
    mutation = draw(st.sampled_from(["replace", "delete", "add", "retype", "wrap", "data-type"]))
    key = draw(st.sampled_from(sorted(request)))
    if mutation == "replace":
        request[key] = draw(json_values)
    elif mutation == "delete":
        del request[key]
    elif mutation == "add":
        request[draw(st.text(max_size=8))] = draw(json_values)
    elif mutation == "retype":
        request["type"] = draw(st.text(max_size=10) | st.integers() | st.none())
    elif mutation == "data-type":
        request["data"] = draw(json_values)
    else:
        return [request]
    if key == "id" and mutation == "replace":
        request["id"] = draw(request_ids)
    return request


def _text(obj: Any) -> Frame:
    return ("text", json.dumps(obj))


huge_numbers = st.sampled_from([
    '{"type":"reset","data":{"seed":' + "9" * 5000 + "}}",  # past int()'s digit limit
    '{"type":"reset","data":{"seed":1e999}}',
    '{"type":"reset","data":{"seed":-1e999}}',
    '{"type":"reset","data":{"seed":NaN}}',
    '{"type":"step","data":{"message":"x"},"id":' + "1" * 400 + "}",
    '{"type":"reset","data":{"seed":18446744073709551617}}',
]).map(lambda s: ("text", s))
deep_nesting = st.integers(10, 5000).flatmap(
    lambda n: st.sampled_from([
        ("text", "[" * n + "]" * n),
        ("text", '{"type":"step","data":{"message":' + "[" * n + "]" * n + "}}"),
        ("text", '{"type":"reset","data":{"deep":' + '{"a":' * n + "0" + "}" * n + "}}"),
        ("text", "[" * n),
    ])
)
oversized = st.integers(MAX_FRAME_BYTES - 100, WS_MAX_SIZE + 50_000).map(
    lambda n: ("text", '{"type":"step","data":{"message":"' + "x" * n + '"}}')
)
# one_of picks a branch uniformly: the answered kinds are listed more than once so that the
# frames which close the socket (and cost a reconnect) stay a minority.
_answered = [
    st.binary(max_size=64).map(lambda b: ("binary", b)),
    st.text(max_size=64).map(lambda t: ("text", t)),
    json_values.map(_text),
    valid_requests().map(_text),
    mutated_requests().map(_text),
    huge_numbers,
    deep_nesting,
]
frames: st.SearchStrategy[Frame] = st.one_of(
    *_answered,
    *_answered,
    st.binary(max_size=64).map(lambda b: ("text-bytes", b)),
    oversized,
)

# ---------------------------------------------------------------- the server and a socket


@pytest.fixture(scope="module")
def fuzz_url() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, max_frame_bytes=MAX_FRAME_BYTES,
        max_concurrent_envs=512, resume_window_s=0.2, step_timeout_s=2.0,
    )
    # No keepalive pings on either side: their payloads come from the global `random`, which
    # hypothesis reports when another thread draws from it while it generates data.
    with running_server(app, log_config=None, ws_max_size=WS_MAX_SIZE, ws_ping_interval=None) as url:
        yield url


class Socket:
    """One connection reused across frames; reopened after each protocol close."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: ClientConnection | None = None
        self.outcomes: Counter[str] = Counter()

    def open(self) -> ClientConnection:
        if self.ws is None:
            self.ws = connect(ws_url(self.url), compression=None, max_size=None, ping_interval=None)
        return self.ws

    def send(self, frame: Frame) -> None:
        """Send one frame; check the server answered it with a reply, a typed error or a close."""
        ws = self.open()
        kind, payload = frame
        try:
            ws.send(payload, text=kind != "binary")
            raw = ws.recv(timeout=10)
        except ConnectionClosed:
            code = ws.close_code
            self.ws = None
            ws.close()
            expected = {1007: kind == "text-bytes", 1009: len(payload) > WS_MAX_SIZE, 1000: _is_close(payload)}
            assert expected.get(code), (code, frame if len(payload) < 300 else len(payload))
            self.outcomes[f"close {code}"] += 1
            return
        except TimeoutError:
            raise AssertionError(f"no reply within 10 s to {frame!r:.300}") from None
        reply = decode_reply(raw)
        if reply.type == "error":
            assert reply.data.code in ERROR_CODES, reply
            self.outcomes[reply.data.code] += 1
        else:
            self.outcomes[reply.type] += 1


def _is_close(payload: str | bytes) -> bool:
    try:
        obj = json.loads(payload)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("type") == "close"


@pytest.mark.timeout(240)
def test_ten_thousand_generated_frames_each_get_a_reply_error_or_close_and_the_server_survives(fuzz_url):
    sock = Socket(fuzz_url)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(frames, min_size=FRAMES_PER_EXAMPLE, max_size=FRAMES_PER_EXAMPLE))
    def exchange(batch: list[Frame]) -> None:
        for frame in batch:
            sock.send(frame)

    started = time.monotonic()
    exchange()
    elapsed = time.monotonic() - started
    total = sum(sock.outcomes.values())
    print(f"\n{total} frames in {elapsed:.1f} s: {dict(sock.outcomes.most_common())}")
    assert total >= 10_000
    # Every family of answer was exercised, protocol closes included.
    for seen in ("observation", "INVALID_JSON", "VALIDATION_ERROR", "UNKNOWN_TYPE", "FRAME_TOO_LARGE",
                 "close 1000", "close 1007", "close 1009"):
        assert sock.outcomes[seen] > 0, seen
    if sock.ws is not None:
        sock.ws.close()

    asyncio.run(_normal_episode(fuzz_url))
    assert wait_for_active(fuzz_url, 0, timeout_s=10) == 0


async def _normal_episode(url: str) -> None:
    async with EnvClient(url) as env:
        assert (await env.reset(seed=3)).observation["echoed_message"] == "ready"
        assert (await env.step({"message": "still here"})).observation["echoed_message"] == "still here"
        assert (await env.state())["step_count"] == 1


@pytest.mark.timeout(90)
def test_a_100_mb_frame_is_refused_with_1009_without_being_buffered(tmp_path):
    # `envsdk serve` sets uvicorn's ws_max_size to 4 x max_frame_bytes (64 MiB by default);
    # the WebSocket layer reads the declared length from the frame header and closes before
    # the payload arrives, so the server never holds it.
    with serve_process("envsdk.testing:EchoEnvironment", tmp_path / "server.log") as server:
        server_proc = psutil.Process(server.proc.pid)
        with connect(ws_url(server.url), compression=None) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            ws.recv(timeout=10)
            rss_before = server_proc.memory_info().rss
            peak, sent, chunk = rss_before, 0, bytes(1024 * 1024)
            sock = ws.socket
            sock.settimeout(10)
            try:
                sock.sendall(_OVERSIZED_HEADER)
                while sent < OVERSIZED_BYTES:
                    sock.sendall(chunk)
                    sent += len(chunk)
                    peak = max(peak, server_proc.memory_info().rss)
            except OSError:  # the server closed the connection: what this test expects
                pass
            peak = max(peak, server_proc.memory_info().rss)
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
            assert ws.close_code == 1009
        print(f"\nsent {sent / 2**20:.0f} MiB of a 100 MiB frame; server RSS {rss_before / 2**20:.1f} -> "
              f"peak {peak / 2**20:.1f} MiB")
        assert peak - rss_before < 16 * 1024 * 1024
        assert wait_for_active(server.url, 0) == 0
        assert "Traceback" not in server.log()
