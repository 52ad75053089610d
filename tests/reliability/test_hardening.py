"""Hardening for untrusted networks: one test per finding of a security test of the server, each
against a real server process, each bounded in time and in the server's memory.

1 amplified validation errors · 2 ping flood / peers that stop reading · 3 HTTP body limit and
capacity · 4 slowloris · 5 DNS rebinding · 6 slots held for free · 7 lone surrogates ·
8 resume tokens in logs and replayed · 9 byte-based frame limit and Sudoku option caps.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from .helpers import ServerProcess, serve_process

ECHO = "envsdk.testing:EchoEnvironment"
MiB = 1024 * 1024


def _rss(server: ServerProcess) -> int:
    return int(psutil.Process(server.proc.pid).memory_info().rss)


def _cpu_s(server: ServerProcess) -> float:
    """CPU seconds the server has used: unlike wall time, not stretched by a loaded machine."""
    times = psutil.Process(server.proc.pid).cpu_times()
    return float(times.user + times.system)


def _ws(server: ServerProcess, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/ws" + (f"?{query}" if query else "")


def _ask(ws: object, frame: dict | str, timeout: float = 10.0) -> dict:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))  # type: ignore[attr-defined]
    return json.loads(ws.recv(timeout=timeout))  # type: ignore[attr-defined]


def _tracebacks(server: ServerProcess) -> list[str]:
    return [line for line in server.log().splitlines() if "Traceback" in line or "ERROR" in line]


class RawWebSocket:
    """A WebSocket client written by hand over a socket: it sends what it is told (any Host,
    pings in bulk) and reads only when asked, which no library client does."""

    def __init__(self, port: int, *, host: str | None = None, origin: str | None = None,
                 path: str = "/ws", rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        headers = [f"GET {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Upgrade: websocket",
                   "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                   "Sec-WebSocket-Version: 13"]
        if origin is not None:
            headers.append(f"Origin: {origin}")
        self.sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        self._buffer = b""
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._read_some()
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])

    def _read_some(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        return chunk

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._buffer += self._read_some()
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    @staticmethod
    def frame(opcode: int, payload: bytes) -> bytes:
        n = len(payload)
        if n < 126:
            head = bytes([0x80 | opcode, 0x80 | n])
        elif n < 65536:
            head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
        return head + b"\0\0\0\0" + payload  # a zero mask leaves the payload as it is

    def send_text(self, text: str) -> None:
        self.sock.sendall(self.frame(0x1, text.encode("utf-8", "surrogatepass")))

    def recv(self) -> tuple[int, bytes]:
        """The next data or close frame (pings from the server are skipped)."""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            opcode, payload = b0 & 0x0F, self._read(n)
            if opcode not in (0x9, 0xA):
                return opcode, payload

    def close(self) -> None:
        self.sock.close()


class HealthProbe:
    """Polls /health in a thread; `worst_s` is the slowest answer seen (inf if one failed)."""

    def __init__(self, url: str) -> None:
        self.url, self.worst_s, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    client.get(self.url + "/health")
                    took = time.perf_counter() - started
                except httpx.HTTPError:
                    took = float("inf")
                self.worst_s = max(self.worst_s, took)
                self._stop.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(35)


@contextlib.contextmanager
def bounded_server(target: str, log_path: Path, *, max_growth: int = 64 * MiB,
                   **kwargs: object) -> Iterator[ServerProcess]:
    """`serve_process`, failing the test if the server's RSS grew by `max_growth` or more."""
    with serve_process(target, log_path, **kwargs) as server:
        start = _rss(server)
        yield server
        grown = _rss(server) - start
        assert grown < max_growth, f"server RSS grew by {grown / MiB:.0f} MiB over the test"


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[ServerProcess]:
    with bounded_server(ECHO, tmp_path / "server.log", max_growth=100 * MiB) as server:
        yield server


# ------------------------------------------------------------------ 1 amplified validation errors


def _wide_object(keys: int) -> str:
    # 19 bytes a key: 880,000 keys make 15.9 MiB, under the 16 MiB frame limit.
    return "{" + ",".join(f'"unknown{i:07d}":1' for i in range(keys)) + "}"


@pytest.mark.timeout(120)
def test_a_wide_action_is_answered_at_once_with_a_bounded_error_list(echo):
    frame = '{"type":"step","data":' + _wide_object(880_000) + "}"
    assert 15 * MiB < len(frame) < 16 * MiB
    with connect(_ws(echo), max_size=None) as ws:
        assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        before, cpu_before = _rss(echo), _cpu_s(echo)
        with HealthProbe(echo.url) as probe:
            started = time.perf_counter()
            ws.send(frame)
            raw = ws.recv(timeout=60)
            took = time.perf_counter() - started
        cpu = _cpu_s(echo) - cpu_before
        reply = json.loads(raw)
        grown = _rss(echo) - before
        assert reply["data"]["code"] == "VALIDATION_ERROR"
        errors = reply["data"]["errors"]
        assert len(errors) == 20 and len(errors) + reply["data"]["errors_omitted"] >= 880_000
        assert len(raw) < 64 * 1024, len(raw)
        assert grown < 100 * MiB, f"server RSS grew by {grown / MiB:.0f} MiB"
        assert took < 5.0 and probe.worst_s < 5.0, (took, probe.worst_s)  # < 1 s unloaded
        assert _ask(ws, {"type": "step", "data": {"message": "still here"}})["type"] == "observation"
    print(f"\nwide action: {len(frame) / MiB:.1f} MiB answered in {took:.2f} s ({cpu:.2f} s of server CPU), "
          f"reply {len(raw)} B, "
          f"RSS +{grown / MiB:.1f} MiB, slowest /health {probe.worst_s:.2f} s")


@pytest.mark.timeout(120)
def test_a_frame_with_many_top_level_keys_needs_no_reset_to_be_refused_cheaply(echo):
    frame = '{"type":"step","data":{},' + _wide_object(290_000)[1:]
    with connect(_ws(echo), max_size=None) as ws, HealthProbe(echo.url) as probe:
        started = time.perf_counter()
        ws.send(frame)
        raw = ws.recv(timeout=60)
        took = time.perf_counter() - started
    reply = json.loads(raw)
    assert reply["data"]["code"] == "VALIDATION_ERROR" and len(raw) < 64 * 1024
    assert reply["data"]["errors"][0]["type"] == "extra_forbidden"
    assert took < 3.0 and probe.worst_s < 3.0, (took, probe.worst_s)
    print(f"\ntop-level keys: {len(frame) / MiB:.1f} MiB answered in {took:.2f} s, reply {len(raw)} B")


@pytest.mark.timeout(60)
def test_echoed_input_is_truncated(echo):
    with connect(_ws(echo)) as ws:
        _ask(ws, {"type": "reset", "data": {}})
        reply = _ask(ws, {"type": "step", "data": {"message": 7, "extra": "x" * 100_000}})
    errors = reply["data"]["errors"]
    extra = next(e for e in errors if e["type"] == "extra_forbidden")
    assert len(extra["input"]) < 400 and "99744 more characters" in extra["input"]


# ------------------------------------------------------------------ 2 ping flood, peers that stop reading

FAST_KEEPALIVE = {"ENVSDK_WS_PING_INTERVAL_S": "1", "ENVSDK_WS_PING_TIMEOUT_S": "2"}


def _dropped_within(raw: RawWebSocket, seconds: float) -> bool:
    """Whether the server closes `raw` within `seconds` (what it had sent is read and discarded)."""
    raw.sock.setblocking(True)
    raw.sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not raw.sock.recv(1 << 20):
                return True
        except TimeoutError:
            continue
        except OSError:  # reset: aborted by the server
            return True
    return False


@pytest.mark.timeout(90)
@pytest.mark.parametrize("module", ["envsdk.cli", "reliability.uvloop_echo"], ids=["asyncio", "uvloop"])
def test_unread_pings_cost_bounded_memory_and_the_peer_loses_its_slot(tmp_path, module):
    if module != "envsdk.cli":
        pytest.importorskip("uvloop")
    flood_s = 5.0
    with bounded_server(ECHO, tmp_path / "server.log", env=FAST_KEEPALIVE, module=module) as server:
        raw = RawWebSocket(server.port, rcvbuf=4096)
        assert raw.status == 101
        raw.send_text(json.dumps({"type": "reset", "data": {}}))
        before = _rss(server)
        ping = RawWebSocket.frame(0x9, b"") * 4096
        raw.sock.setblocking(False)
        sent, flood_started = 0, time.monotonic()
        with HealthProbe(server.url) as probe:
            while time.monotonic() < flood_started + flood_s:
                try:
                    sent += raw.sock.send(ping)
                except BlockingIOError:
                    time.sleep(0.002)
                except OSError:
                    break  # the server dropped us: what should happen
        grown = _rss(server) - before
        # Keepalive ping at 1 s, unanswered by 3 s: the drop is due well before 7 s.
        dropped = _dropped_within(raw, max(0.0, 7.0 - (time.monotonic() - flood_started)))
        dropped_after = time.monotonic() - flood_started
        slot_freed = httpx.get(server.url + "/health").json()["active_sessions"] == 0
        raw.close()
    # Pongs wait in at most 64 KiB of send buffer and a read parses at most 16 KiB of pings:
    # the growth is a fixed few hundred KiB, not a share of what was sent (20 s: < 1 MiB).
    assert grown < 4 * MiB, f"server RSS grew by {grown / MiB:.1f} MiB during {flood_s} s of unread pings"
    assert probe.worst_s < 2.0, f"/health took {probe.worst_s:.1f} s during the flood"
    assert dropped and slot_freed, "a peer that reads nothing kept its connection and slot past the keepalive"
    print(f"\nping flood: {sent / MiB:.1f} MiB of pings sent in {flood_s} s, server RSS +{grown / MiB:.1f} MiB, "
          f"slowest /health {probe.worst_s:.2f} s, dropped and slot freed {dropped_after:.1f} s after it began")


@pytest.mark.timeout(60)
def test_a_live_peer_that_stops_reading_loses_its_slot_after_keepalive(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log", env=FAST_KEEPALIVE) as server:
        raw = RawWebSocket(server.port, rcvbuf=4096)
        raw.send_text(json.dumps({"type": "reset", "data": {}}))
        # Replies of 200 KiB each pile up unread in the server's send buffer.
        for _ in range(40):
            try:
                raw.send_text(json.dumps({"type": "step", "data": {"message": "x" * 200_000}}))
            except OSError:
                break
        started = time.monotonic()
        while httpx.get(server.url + "/health").json()["active_sessions"] and time.monotonic() - started < 15:
            time.sleep(0.1)
        took = time.monotonic() - started
        assert httpx.get(server.url + "/health").json()["active_sessions"] == 0, "slot kept past keepalive"
        raw.close()
    assert took < 10, took


# ------------------------------------------------------------------ 3 HTTP routes: body limit, capacity


@pytest.mark.timeout(90)
def test_http_bodies_are_limited_and_stateless_calls_share_the_capacity(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log", args=["--max-concurrent-envs", "4"]) as server:
        before = _rss(server)
        big = b'{"seed": 1, "pad": "' + b"x" * (8 * MiB) + b'"}'
        started = time.perf_counter()
        response = httpx.post(server.url + "/reset", content=big, headers={"content-type": "application/json"},
                              timeout=30)
        took = time.perf_counter() - started
        assert response.status_code == 413 and response.json()["detail"]["limit"] == MiB
        assert _rss(server) - before < 20 * MiB and took < 5

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"pad": "'
            for _ in range(64):
                yield b"x" * 65536
            yield b'"}'

        chunked = httpx.post(server.url + "/reset", content=chunks(), timeout=30)
        assert chunked.status_code == 413

        # Twelve 2 s stateless steps at once against a capacity of 4.
        peak = 0

        def step(_: int) -> int:
            return httpx.post(server.url + "/step", json={"action": {"message": "sleep:2"}}, timeout=30).status_code

        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(step, i) for i in range(12)]
            while not all(f.done() for f in futures):
                peak = max(peak, httpx.get(server.url + "/health").json()["active_sessions"])
                time.sleep(0.05)
            statuses = [f.result() for f in futures]
        assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
        assert 1 <= peak <= 4, peak
        assert httpx.get(server.url + "/health").json()["active_sessions"] == 0


# ------------------------------------------------------------------ 4 slowloris


def _lower_open_files_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


@pytest.mark.timeout(120)
def test_half_open_upgrades_do_not_lock_out_an_honest_client(tmp_path):
    count = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 1100:
        pytest.skip(f"needs a hard open-files limit over {count + 1100}, have {hard}")
    if soft < count + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count + 1100, hard), hard))
    sockets: list[socket.socket] = []
    with bounded_server(ECHO, tmp_path / "server.log", preexec_fn=_lower_open_files_limit,
                       env={"ENVSDK_HANDSHAKE_TIMEOUT_S": "3"}) as server:
        try:
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                sock.sendall(f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n".encode())
                sockets.append(sock)
            time.sleep(0.5)
            started = time.perf_counter()
            with connect(_ws(server), open_timeout=2) as ws:
                assert _ask(ws, {"type": "reset", "data": {}}, timeout=2)["type"] == "observation"
            took = time.perf_counter() - started
            # The half-open ones are closed once the handshake timeout passes.
            time.sleep(4)
            closed = 0
            for sock in sockets[:50]:
                sock.settimeout(5)
                try:
                    closed += sock.recv(1) == b""
                except OSError:
                    closed += 1
            assert closed == 50
        finally:
            for sock in sockets:
                sock.close()
        log_bytes = server.log_path.stat().st_size
    assert took < 2.0 and log_bytes < 1 * MiB, (took, log_bytes)
    print(f"\nslowloris: {count} half-open upgrades, honest client in {took:.2f} s, log {log_bytes} B")


# ------------------------------------------------------------------ 5 DNS rebinding


@pytest.mark.timeout(60)
def test_a_rebound_host_name_is_refused_on_loopback_unless_allowed(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log") as server:
        evil = f"attacker.example:{server.port}"
        raw = RawWebSocket(server.port, host=evil, origin=f"http://{evil}")
        raw.send_text(json.dumps({"type": "reset", "data": {}}))
        opcode, payload = raw.recv()
        raw.close()
        assert opcode == 0x1 and json.loads(payload)["data"]["reason"] == "host_not_allowed"
        response = httpx.post(server.url + "/reset", json={}, headers={"Host": evil, "Origin": f"http://{evil}"})
        assert response.status_code == 403 and response.json()["detail"]["reason"] == "host_not_allowed"
        for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
            assert httpx.post(server.url + "/reset", json={}, headers={"Host": host}).status_code == 200
        assert httpx.get(server.url + "/health").json()["active_sessions"] == 0
    with bounded_server(ECHO, tmp_path / "allowed.log", args=["--allowed-hosts", "attacker.example"]) as server:
        evil = f"attacker.example:{server.port}"
        assert httpx.post(server.url + "/reset", json={}, headers={"Host": evil}).status_code == 200
        assert httpx.post(server.url + "/reset", json={}, headers={"Host": "127.0.0.1"}).status_code == 403


# ------------------------------------------------------------------ 6 slots held for free


@pytest.mark.timeout(60)
def test_silent_sockets_and_abandoned_handshakes_do_not_hold_the_slots(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log", args=["--max-concurrent-envs", "4"],
                       env={"ENVSDK_FIRST_FRAME_TIMEOUT_S": "1"}) as server:
        silent = [connect(_ws(server)) for _ in range(4)]
        try:
            assert httpx.get(server.url + "/health").json()["active_sessions"] == 4
            time.sleep(2.5)
            for ws in silent:
                with pytest.raises(ConnectionClosed):
                    ws.recv(timeout=5)
                assert ws.close_code == 1008
        finally:
            for ws in silent:
                ws.close()
        # Four handshakes that leave without a goodbye: sessions kept for a resume.
        for _ in range(4):
            ws = connect(_ws(server))
            assert _ask(ws, {"type": "session"})["type"] == "session"
            ws.socket.shutdown(socket.SHUT_RDWR)
            ws.close()
        time.sleep(0.3)
        started = time.perf_counter()
        with connect(_ws(server)) as ws:
            assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        assert time.perf_counter() - started < 2


# ------------------------------------------------------------------ 7 lone surrogates

SURROGATE_FRAMES = [
    r'{"type":"reset","data":{},"id":"\ud800"}',
    r'{"type":"\ud800"}',
    r'{"type":"reset","\ud800":1}',
    r'{"type":"step","data":{"\ud800":"x"}}',
    r'{"type":"step","data":{"message":"\ud800"}}',
    r'{"type":"reset","data":{"\udfff":1}}',
]


@pytest.mark.timeout(60)
def test_lone_surrogates_get_a_typed_error_and_the_connection_lives(echo):
    with connect(_ws(echo)) as ws:
        _ask(ws, {"type": "reset", "data": {}})
        for frame in SURROGATE_FRAMES:
            reply = _ask(ws, frame)
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", (frame, reply)
        assert _ask(ws, {"type": "step", "data": {"message": "ok"}})["type"] == "observation"
    assert _tracebacks(echo) == []


# ------------------------------------------------------------------ 8 resume tokens: not logged, used once


@pytest.mark.timeout(60)
def test_resume_tokens_are_not_logged_and_resume_only_once(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log", args=["--log-level", "info"]) as server:
        ws = connect(_ws(server))
        first = _ask(ws, {"type": "session"})["data"]
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.close()
        query = f"session_id={first['session_id']}&resume_token={first['resume_token']}"
        with connect(_ws(server, query)) as resumed:
            second = _ask(resumed, {"type": "session"})["data"]
            assert second["resumed"] and second["resume_token"] != first["resume_token"]
            resumed.socket.shutdown(socket.SHUT_RDWR)
        with connect(_ws(server, query)) as replayed:  # the used token again
            assert json.loads(replayed.recv(timeout=5))["data"]["code"] == "RESUME_FAILED"
        fresh = f"session_id={first['session_id']}&resume_token={second['resume_token']}"
        with connect(_ws(server, fresh)) as again:
            assert _ask(again, {"type": "session"})["data"]["resumed"]
        log = server.log()
    assert "WebSocket /ws" in log  # uvicorn logged the connections ...
    assert first["resume_token"] not in log and second["resume_token"] not in log  # ... without tokens
    assert "resume_token=***" in log


# A bearer token is the user's own string: the server takes all of it up to the query's next `&`,
# and a browser or curl sends `)` and `\\` as typed.
_ODD_TOKEN = "pa)ss\\wo#rd:"


@pytest.mark.timeout(60)
def test_odd_tokens_and_passwords_in_a_request_are_masked_in_the_log(tmp_path):
    with bounded_server(ECHO, tmp_path / "server.log", args=["--log-level", "info"],
                        env={"ENVSDK_TOKEN": _ODD_TOKEN}) as server:
        accepted = RawWebSocket(server.port, path=f"/ws?token={_ODD_TOKEN}&resume_token=re)sume")
        assert accepted.status == 101  # the server took the whole odd token as the token
        accepted.close()
        # An absolute request target, with a user:password@ (HTTP/1.1 allows the form).
        absolute = RawWebSocket(server.port, path=f"ws://user:p@ss@127.0.0.1:{server.port}/ws?token={_ODD_TOKEN}")
        absolute.close()
        log = server.log()
    assert '"WebSocket /ws?token=***&resume_token=***" [accepted]' in log
    assert f'"WebSocket ws://***@127.0.0.1:{server.port}/ws?token=***" 403' in log
    for piece in (")ss", "\\wo", "#rd", "rd:", ")sume", "user", "p@ss", "@ss@"):
        assert piece not in log, piece


# ------------------------------------------------------------------ 9 frame limit in bytes, Sudoku caps


@pytest.mark.timeout(60)
def test_the_frame_limit_counts_bytes_not_characters(tmp_path):
    with bounded_server("reliability.apps:small_frames", tmp_path / "server.log") as server:
        emoji = "\N{GRINNING FACE}" * 20_000  # 20,000 characters, 80,000 bytes > 64 KiB
        with connect(_ws(server)) as ws:
            _ask(ws, {"type": "reset", "data": {}})
            # Sent as UTF-8 text, not \u escapes (json.dumps' default would make it ASCII).
            frame = json.dumps({"type": "step", "data": {"message": emoji}}, ensure_ascii=False)
            assert len(frame) < 64 * 1024 < len(frame.encode())
            reply = _ask(ws, frame)
            assert reply["data"]["code"] == "FRAME_TOO_LARGE", reply["type"]
            small = json.dumps({"type": "step", "data": {"message": "\N{GRINNING FACE}" * 1000}}, ensure_ascii=False)
            assert _ask(ws, small)["type"] == "observation"


@pytest.mark.timeout(120)
def test_sudoku_caps_client_chosen_options_and_move_size(tmp_path):
    with bounded_server("", tmp_path / "server.log", module="servers.sudoku", args=["--board-workers", "1"],
                       timeout_s=60) as server:
        with connect(_ws(server)) as ws:
            reply = _ask(ws, {"type": "reset", "data": {"seed": 1, "error_allowance": 10**9}}, timeout=60)
            assert reply["type"] == "error" and "error_allowance" in reply["data"]["message"]
            assert _ask(ws, {"type": "reset", "data": {"seed": 1, "error_allowance": 5}}, timeout=60)["type"] == "observation"
            raw_reply = None
            for _ in range(3):
                ws.send(json.dumps({"type": "step", "data": {"message": "[1 1 1]" + "x" * MiB}}))
                raw_reply = ws.recv(timeout=30)
                assert json.loads(raw_reply)["data"].get("code") == "VALIDATION_ERROR"
            assert raw_reply is not None and len(raw_reply) < 64 * 1024
