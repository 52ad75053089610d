"""Fuzzing one real server: over 10,000 generated frames (random bytes, random JSON, mutated
valid frames, huge numbers, deep nesting, wrong types, binary and oversized frames); each
gets the answer the protocol gives it (which reply type, which error code, which close code:
`Expected` works it out from the frame and the session's state so far, from the rules of
`envsdk.protocol` and `envsdk.server.sessions` written out here), and the server still serves
an episode afterwards. And an oversized frame is refused without being held in memory."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import from_json
from server.helpers import wait_for_active, ws_url
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from envsdk.client import EnvClient
from envsdk.protocol import ErrorCode, decode_reply
from envsdk.server import create_app
from envsdk.server.sessions import request_digest
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from .helpers import serve_process

# Raw WebSocket frame header of a masked text frame declaring a 100 MiB payload.
OVERSIZED_BYTES = 100 * 1024 * 1024
_OVERSIZED_HEADER = bytes([0x81, 0x80 | 127]) + OVERSIZED_BYTES.to_bytes(8, "big") + b"\0\0\0\0"

MAX_FRAME_BYTES = 64 * 1024
WS_MAX_SIZE = 256 * 1024
STEP_TIMEOUT_S = 2.0
REPLAY_WINDOW = 16  # ServerConfig.replay_window's default: answered ids a session remembers
FRAMES_PER_EXAMPLE = 50
EXAMPLES = 205  # 10,250 frames

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

# ---------------------------------------------------------------- what each frame should get

INVALID_JSON, UNKNOWN_TYPE, VALIDATION_ERROR, EXECUTION_ERROR = (
    ErrorCode.INVALID_JSON.value, ErrorCode.UNKNOWN_TYPE.value, ErrorCode.VALIDATION_ERROR.value,
    ErrorCode.EXECUTION_ERROR.value,
)
FRAME_TOO_LARGE, NOT_RESET, EPISODE_DONE, TIMEOUT, ID_REUSED = (
    ErrorCode.FRAME_TOO_LARGE.value, ErrorCode.NOT_RESET.value, ErrorCode.EPISODE_DONE.value,
    ErrorCode.TIMEOUT.value, ErrorCode.ID_REUSED.value,
)
#: The keys a request of each type may carry (OpenEnv forbids others; ``id`` is envsdk's).
REQUEST_KEYS = {
    "reset": {"type", "id", "data"}, "step": {"type", "id", "data"}, "mcp": {"type", "id", "data"},
    "state": {"type", "id"}, "close": {"type", "id"}, "session": {"type", "id"},
}
TOOL_ACTIONS = ("list_tools", "call_tool")


class Expected:
    """The answer each frame of one connection should get, and the session's state it follows.

    Frame level (`envsdk.protocol.decode_request`, in this order): a binary frame is INVALID_JSON;
    a text frame that is not UTF-8 is closed with 1007, one past the WebSocket layer's limit with
    1009, one past ``max_frame_bytes`` (UTF-8 bytes) is FRAME_TOO_LARGE; then not JSON (as
    pydantic-core parses it: lone surrogates and nesting past its limit are not) is
    INVALID_JSON, not an object VALIDATION_ERROR, a ``type`` that is not a known string
    UNKNOWN_TYPE, and a key the type does not have, an ``id`` that is no string of at most 128
    characters, or ``data`` that is no object (or missing where required) VALIDATION_ERROR.
    Those replies carry no id.

    Session level (`envsdk.server.sessions`): ``close`` closes with 1000 (the next connection is a
    fresh session); an id answered before is answered again from the record, word for word, or
    ID_REUSED for another request (the record keeps the last `REPLAY_WINDOW` ids); ``session``
    is answered and makes the peer extended; the env is built as the socket is accepted, so
    ``state`` is answered before any reset, and NOT_RESET only once a step deadline wrote the env
    off; a tool action on an env without tools is VALIDATION_ERROR (NOT_RESET with no env); a
    step with no env or before any reset succeeded is NOT_RESET, after ``done`` EPISODE_DONE
    (both EXECUTION_ERROR to a peer that neither did the handshake nor sent an id); then the
    action is validated (VALIDATION_ERROR) and the echo env runs it: ``"raise"`` is
    EXECUTION_ERROR, a sleep past the step deadline TIMEOUT, else the observation echoing the
    message. A reset (building an env if a deadline wrote the last one off) answers what the
    echo env's own ``reset`` does with its data (an observation, or EXECUTION_ERROR when it raises).
    """

    def __init__(self) -> None:
        self.fresh()

    def fresh(self) -> None:
        self.env = True  # an env instance exists (built as the socket is accepted, as OpenEnv does)
        self.phase = "fresh"  # fresh | running | done
        self.extended = False
        self.record: OrderedDict[str, tuple[bytes, str]] = OrderedDict()

    def frame(self, kind: str, payload: str | bytes) -> str | dict[str, Any]:
        """The frame-level answer (an error code or "close <code>"), or the decoded request."""
        if kind == "binary":
            return INVALID_JSON
        if isinstance(payload, bytes):
            try:
                payload = payload.decode("utf-8")
            except UnicodeDecodeError:
                return "close 1007"
        size = len(payload.encode("utf-8", "surrogatepass"))
        if size > WS_MAX_SIZE:
            return "close 1009"
        if size > MAX_FRAME_BYTES:
            return FRAME_TOO_LARGE
        try:
            obj = from_json(payload)
        except ValueError:
            return INVALID_JSON
        if not isinstance(obj, dict):
            return VALIDATION_ERROR
        keys = REQUEST_KEYS.get(obj["type"]) if isinstance(obj.get("type"), str) else None
        if keys is None:
            return UNKNOWN_TYPE
        rid, data = obj.get("id"), obj.get("data")
        if (
            set(obj) - keys
            or (rid is not None and not (isinstance(rid, str) and len(rid) <= 128))
            or ("data" in obj and not isinstance(data, dict))
            or ("data" not in obj and obj["type"] in ("step", "mcp"))
        ):
            return VALIDATION_ERROR
        return obj

    def _plain(self, code: str, rid: str | None) -> str:
        """NOT_RESET / EPISODE_DONE as the peer gets them: EXECUTION_ERROR unless it asked for more."""
        return code if self.extended or rid is not None else EXECUTION_ERROR

    def apply(self, request: dict[str, Any]) -> tuple[str | tuple[str, ...], str | None]:
        """(the answer to a decoded request other than close, or the answers it may get; the
        message a step's observation echoes)."""
        kind, rid = request["type"], request.get("id")
        data = request.get("data", {} if kind == "reset" else None)
        if kind == "session":
            self.extended = True
            return "session", None
        if kind == "mcp":
            return "mcp", None
        if kind == "state":
            return ("state" if self.env else self._plain(NOT_RESET, rid)), None
        if kind == "reset":
            self.env = True  # built (if written off) before the reset is called, kept if it raises
            try:
                EchoEnvironment().reset(**data)
            except (TypeError, ValueError):  # an argument it has no place for, a value its State refuses
                return EXECUTION_ERROR, None
            self.phase = "running"
            return "observation", "ready"
        assert kind == "step", request
        if data.get("type") in TOOL_ACTIONS:
            return (VALIDATION_ERROR if self.env else self._plain(NOT_RESET, rid)), None
        if not self.env or self.phase == "fresh":
            return self._plain(NOT_RESET, rid), None
        if self.phase == "done":
            return self._plain(EPISODE_DONE, rid), None
        try:
            message = EchoAction.model_validate(data).message
        except ValidationError:
            return VALIDATION_ERROR, None
        if message == "raise":
            return EXECUTION_ERROR, None
        if message.startswith("sleep:"):
            try:
                seconds = float(message.split(":", 1)[1])
            except ValueError:
                return EXECUTION_ERROR, None
            if not (math.isfinite(seconds) and seconds >= 0):
                return EXECUTION_ERROR, None
            if seconds >= 2 * STEP_TIMEOUT_S:
                self.timed_out()
                return TIMEOUT, None
            if seconds >= STEP_TIMEOUT_S / 2:  # near the deadline: a loaded machine decides which
                self.phase = "running"
                return ("observation", TIMEOUT), message
        self.phase = "done" if message == "done" else "running"
        return "observation", message

    def timed_out(self) -> None:
        """A step past its deadline: the env is written off, the next step or state is NOT_RESET."""
        self.env, self.phase = False, "fresh"

    def remember(self, rid: str, digest: bytes, raw: str) -> None:
        self.record[rid] = (digest, raw)
        while len(self.record) > REPLAY_WINDOW:
            self.record.popitem(last=False)


# ---------------------------------------------------------------- the server and a socket


@pytest.fixture(scope="module")
def fuzz_url() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, max_frame_bytes=MAX_FRAME_BYTES,
        max_concurrent_envs=512, resume_window_s=0.2, step_timeout_s=STEP_TIMEOUT_S,
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
        self.expected = Expected()
        self.outcomes: Counter[str] = Counter()

    def open(self) -> ClientConnection:
        if self.ws is None:
            self.ws = connect(ws_url(self.url), compression=None, max_size=None, ping_interval=None)
            self.expected.fresh()  # a new connection is a new session
        return self.ws

    def send(self, frame: Frame) -> None:
        """Send one frame; check the server gave it the answer `Expected` says it gets."""
        ws = self.open()
        kind, payload = frame
        shown = f"{frame!r:.300}" if len(payload) < 300 else f"a {kind} frame of {len(payload)} characters"
        decoded = self.expected.frame(kind, payload)
        request = decoded if isinstance(decoded, dict) else None
        rid = request.get("id") if request is not None else None
        digest = b""
        if request is not None and request["type"] == "close":
            want, echoed, replayed = "close 1000", None, None
        elif request is not None:
            data = request.get("data", {} if request["type"] == "reset" else None)
            digest = request_digest(request["type"], data) if rid is not None else b""
            recorded = self.expected.record.get(rid) if rid is not None else None
            if recorded is not None:
                want, echoed = (None, None) if recorded[0] == digest else (ID_REUSED, None)
                replayed = recorded[1] if recorded[0] == digest else None
            else:
                (want, echoed), replayed = self.expected.apply(request), None
        else:
            assert isinstance(decoded, str)
            want, echoed, replayed = decoded, None, None
        try:
            ws.send(payload, text=kind != "binary")
            raw = ws.recv(timeout=10)
        except ConnectionClosed:
            code = ws.close_code
            self.ws = None
            ws.close()
            assert want == f"close {code}", (f"closed with {code}", "expected", want, shown)
            self.outcomes[want] += 1
            return
        except TimeoutError:
            raise AssertionError(f"no reply within 10 s to {shown}") from None
        if replayed is not None:  # answered from the record, word for word, and nothing ran again
            assert raw == replayed, ("a repeated id was not answered from the record", raw[:300], replayed[:300], shown)
            self.outcomes["replayed"] += 1
            return
        reply = decode_reply(raw)
        got = reply.data.code if reply.type == "error" else reply.type
        assert got in want if isinstance(want, tuple) else got == want, (f"answered {got}", "expected", want, raw[:300], shown)
        if isinstance(want, tuple) and got == TIMEOUT:
            self.expected.timed_out()
        # Replies to a request carry its id; frames refused before they were decoded carry none.
        assert reply.id == rid, (reply.id, rid, shown)
        if echoed is not None and got == "observation":
            assert reply.data.observation["echoed_message"] == echoed, (raw[:300], shown)
        if rid is not None and got != ID_REUSED:
            self.expected.remember(rid, digest, raw)
        self.outcomes[got] += 1


@pytest.mark.timeout(240)
def test_ten_thousand_generated_frames_each_get_the_reply_error_or_close_the_protocol_gives_and_the_server_survives(fuzz_url):
    sock = Socket(fuzz_url)

    # No shrinking: the answer a frame gets depends on what the connection saw before, in
    # earlier examples too, so a shrunk example would replay differently; the first failure
    # is reported as it came, with the frame and the answer expected.
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
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
    for seen in ("observation", "state", "session", "INVALID_JSON", "VALIDATION_ERROR", "UNKNOWN_TYPE",
                 "FRAME_TOO_LARGE", "NOT_RESET", "EXECUTION_ERROR", "close 1000", "close 1007", "close 1009"):
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
