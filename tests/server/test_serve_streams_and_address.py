"""A server started with its standard output closed or unwritable, on a port or an address it
cannot have: it serves, or says why not in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from envsdk.testing import free_port

REPO = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment"]
SUDOKU = [sys.executable, "-m", "servers.sudoku", "--board-workers", "1"]

pytestmark = pytest.mark.timeout(180)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "LOG_LEVEL")}
    return {**env, "ENVSDK_WEB": "0", **extra}


class _Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, stderr: IO[bytes]) -> None:
        self.proc, self.port, self._stderr = proc, port, stderr

    def wait_healthy(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not healthy in time: {self.stderr()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stderr(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    started: list[_Server] = []

    def run(command: list[str], stdout: str, close_stderr: bool = False) -> _Server:
        """`command --port P`, its stdout ``closed`` (``>&-``) or ``full`` (``> /dev/full``)."""
        port = free_port()
        argv = [*command, "--port", str(port)]
        stderr = open(tmp_path / f"stderr{len(started)}", "w+b")  # noqa: SIM115 (closed at teardown)
        if stdout == "closed":
            redirect = ">&- 2>&-" if close_stderr else ">&-"
            proc = subprocess.Popen(["sh", "-c", f'exec "$@" {redirect}', "sh", *argv], cwd=REPO, env=_env(),
                                    stderr=stderr, start_new_session=True)
        else:
            with open("/dev/full", "wb") as full:
                proc = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=full, stderr=stderr, start_new_session=True)
        server = _Server(proc, port, stderr)
        started.append(server)
        return server

    yield run
    for server in started:
        server.stop()
        server._stderr.close()


def _requests(port: int) -> None:
    for _ in range(5):
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("command", [SERVE, SUDOKU], ids=["envsdk-serve", "sudoku"])
def test_a_server_whose_stdout_is_closed_serves(start: object, command: list[str]) -> None:
    """``>&-`` was an AttributeError ('NoneType' has no isatty) from uvicorn's log formatter: exit 1."""
    server = start(command, "closed")  # type: ignore[operator]
    server.wait_healthy()
    _requests(server.port)
    assert "Traceback" not in server.stderr(), server.stderr()[-3000:]


def test_a_server_whose_stdout_and_stderr_are_closed_serves(start: object) -> None:
    """``>&- 2>&-`` exited 1 without a word."""
    server = start(SERVE, "closed", close_stderr=True)  # type: ignore[operator]
    server.wait_healthy()
    _requests(server.port)


@pytest.mark.parametrize("command", [SERVE, SUDOKU], ids=["envsdk-serve", "sudoku"])
def test_a_server_whose_stdout_cannot_be_written_serves_quietly(start: object, command: list[str]) -> None:
    """``> /dev/full``: a 'Logging error' traceback on stderr for every request's access line."""
    server = start(command, "full")  # type: ignore[operator]
    server.wait_healthy()
    _requests(server.port)
    server.stop()
    stderr = server.stderr()
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr[-3000:]
    said = [line for line in stderr.splitlines() if "standard output" in line]
    assert len(said) <= 1, stderr[-3000:]


def _one_error_line(done: subprocess.CompletedProcess[str], prefix: str) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_a_port_variable_past_the_port_range_is_a_usage_error(port: str) -> None:
    """PORT=70000 got as far as the bind: an OverflowError traceback, exit 1."""
    done = subprocess.run(SERVE, cwd=REPO, env=_env(PORT=port), capture_output=True, text=True, timeout=60, check=False)
    line = _one_error_line(done, "envsdk serve: error: ")
    assert done.returncode == 2 and f"PORT='{port}'" in line and "0-65535" in line, line


@pytest.mark.parametrize("port", [70000, -1])
def test_serve_refuses_a_port_past_the_range_with_a_value_error(port: int) -> None:
    from envsdk.server import create_app, serve
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    app = create_app(EchoEnvironment, EchoAction, EchoObservation)
    with pytest.raises(ValueError, match=rf"{port} is not a port number \(0-65535\)"):
        serve(app, port=port)


@pytest.mark.parametrize(("command", "prefix"), [(SERVE, "envsdk serve: error: "), (SUDOKU, "")],
                         ids=["envsdk-serve", "sudoku"])
def test_a_host_address_not_on_this_machine_is_one_line(command: list[str], prefix: str) -> None:
    """--host 8.8.8.8 was uvicorn's 'ERROR: [Errno 99] ...' after the app's start-up, exit 3."""
    done = subprocess.run([*command, "--host", "8.8.8.8", "--port", str(free_port())], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=150, start_new_session=True,
                          check=False)
    line = _one_error_line(done, prefix)
    assert done.returncode == 1 and "--host" in line and "8.8.8.8" in line, line
    assert "error" in line
