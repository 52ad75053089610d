"""A game server stopped by SIGTERM, at any moment of its start-up or once it serves, exits
with 143 (as the shell reports a program a SIGTERM ended) and leaves no process behind.

A SIGTERM during start-up was raised as SystemExit wherever the main thread was: in a
finaliser it was dropped (the server then served on), in the start of a worker process the
exit waited forever for a worker waiting for its parent; and a server that had started exited
with status 0, which a job runner reads as a clean finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from envsdk.testing import free_port

REPO = Path(__file__).resolve().parents[2]
TERMINATED = 128 + signal.SIGTERM


def _group_gone(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _terminate(module: str, after_s: float | None) -> tuple[int | None, str]:
    """Start `python -m module`, SIGTERM it `after_s` seconds in (None: once /health answers);
    (its exit status, or None if it did not exit within 60 s; its stderr)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), "--log-level", "warning"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "ENVSDK_WEB": "0"},
    )
    try:
        if after_s is None:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and server.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                raise AssertionError("the server did not start")
        else:
            time.sleep(after_s)
        server.send_signal(signal.SIGTERM)
        try:
            status: int | None = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = None
        assert _group_gone(server.pid, 15), "a process of the server's group outlived it"
        return status, server.communicate(timeout=10)[1] if status is not None else ""
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena"])
def test_a_serving_game_server_exits_143_on_sigterm_and_leaves_no_process(module: str) -> None:
    status, stderr = _terminate(module, None)
    assert status == TERMINATED, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]


@pytest.mark.timeout(600)
def test_a_sigterm_at_any_moment_of_the_start_up_stops_the_server() -> None:
    # From Python's start to the first request served: imports, the game workers' start, uvicorn's.
    for after_s in (0.3, 0.7, 1.0, 1.2, 1.4, 1.7, 2.2):
        status, stderr = _terminate("servers.sudoku", after_s)
        # Killed by the signal itself (-15) before the handler exists, else exited with 143.
        assert status in (TERMINATED, -signal.SIGTERM), f"SIGTERM {after_s} s in: status {status}\n{stderr[-2000:]}"
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-2000:]


# Start-up garbage with a finaliser (regex's parser leaves cycles of them), a SIGTERM arriving
# while the collector runs it, once the start-up is over.
_SIGTERM_IN_A_FINALISER = textwrap.dedent("""
    import gc, os, signal
    from envsdk.server.launch import SigtermDuringStartUp

    class Garbage:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)

    gc.disable()  # the collector runs when this script says
    sigterm = SigtermDuringStartUp.install()
    cycle = Garbage()
    cycle.me = cycle
    del cycle
    sigterm.arm()
    gc.collect()  # its next run, once the server serves
    print("served on")
""")


@pytest.mark.timeout(60)
def test_a_sigterm_while_start_up_garbage_is_collected_stops_the_server() -> None:
    """Collected after `arm`, the finaliser took the SIGTERM's SystemExit, which Python drops:
    the server served on (a sweep's SIGTERM 1.4 s in, once the start-up imported less)."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGTERM_IN_A_FINALISER], cwd=REPO, capture_output=True, text=True, timeout=50, check=False,
    )
    assert done.returncode == TERMINATED and "served on" not in done.stdout, done


@pytest.mark.timeout(240)
@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena"])
def test_a_game_server_on_a_port_in_use_says_so_in_one_line(module: str) -> None:
    """It was a PortInUseError traceback (`envsdk serve` said one line for the same case)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", module, "--port", str(port)], cwd=REPO, capture_output=True, text=True,
            timeout=180, env={**os.environ, "ENVSDK_WEB": "0"}, start_new_session=True,
        )
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-2000:]
    assert f"port {port}" in lines[0] and "in use" in lines[0]
