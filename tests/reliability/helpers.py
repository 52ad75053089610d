"""Helpers of the reliability tests: an envsdk server in a child process (so it can be
killed, restarted and signalled), and log checks."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from envsdk.testing import free_port, stop_process

TESTS_DIR = Path(__file__).resolve().parent.parent
# Variables of the caller's shell that would change what the child serves.
_SCRUBBED = ("HOST", "PORT", "MAX_CONCURRENT_ENVS", "ENVSDK_TOKEN", "ENVSDK_ALLOWED_HOSTS")


@dataclass
class ServerProcess:
    """A running `envsdk serve` child: its process, port, base URL and stderr log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def start_server(
    target: str, log_path: Path, *, port: int | None = None, args: Sequence[str] = (),
    env: dict[str, str] | None = None, timeout_s: float = 30.0, module: str = "envsdk.cli",
    preexec_fn: Callable[[], object] | None = None,
) -> ServerProcess:
    """Start ``envsdk serve <target> --port <port> <args>`` and wait until /health answers.

    `module` other than ``envsdk.cli`` runs ``python -m <module> --port <port> <args>`` instead
    (e.g. ``servers.sudoku``; `target` is then ignored); `preexec_fn` runs in the child before
    it starts (e.g. to lower its resource limits)."""
    port = port or free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    child_env.update({"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), child_env.get("PYTHONPATH", "")]),
                      "ENVSDK_WEB": "0", **(env or {})})
    with open(log_path, "ab") as log:
        command = ["serve", target] if module == "envsdk.cli" else []
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *command, "--port", str(port), "--log-level", "warning", *args],
            env=child_env, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=preexec_fn,
        )
    server = ServerProcess(proc, port, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} during startup:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(server)
            raise TimeoutError(f"the server did not answer /health within {timeout_s} s")
        time.sleep(0.05)


def stop_server(server: ServerProcess, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
    """Send `sig` (if still running) and wait; SIGKILL past `timeout_s`. Returns the exit status."""
    return stop_process(server.proc, timeout_s, sig)


@contextlib.contextmanager
def serve_process(target: str, log_path: Path, **kwargs: object) -> Iterator[ServerProcess]:
    """`start_server` as a context manager: the child is always stopped at exit."""
    server = start_server(target, log_path, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        stop_server(server)


def tracebacks(records: Sequence[logging.LogRecord]) -> list[str]:
    """Log records that carry a traceback or are errors: what a quiet server never logs."""
    return [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR]
