"""Helpers for tests and benchmarks: a real uvicorn server on a free loopback port, and a
trivial echo environment.

``running_server(app)`` starts uvicorn in a background thread on 127.0.0.1 and stops it when
the block exits, so every test that starts a server also stops it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import uvicorn

from envsdk.env import Environment
from envsdk.types import Action, Observation, State

__all__ = [
    "free_port",
    "free_ports",
    "stop_process",
    "wait_healthy",
    "running_server",
    "EchoAction",
    "EchoObservation",
    "EchoEnvironment",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 that nothing listens on right now:
    ``serve --replicas N --port P`` serves on P..P+N-1, and a free P says nothing about P+1."""
    for _ in range(200):
        base = free_port()
        if base + count > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"found no {count} consecutive free ports on 127.0.0.1")


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Stop a child process: `sig` (SIGTERM), then SIGKILL if it has not exited within
    `timeout_s`. Returns its exit code; never waits unboundedly."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(5)


def wait_healthy(proc: subprocess.Popen[Any], base_url: str, timeout_s: float, what: str) -> None:
    """Poll ``base_url/health`` until the server started as `proc` answers. Raises
    ``RuntimeError("<what> did not start")`` once `proc` has exited or `timeout_s` have passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/health", timeout=1).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


@contextlib.contextmanager
def running_server(
    app: Any, *, port: int | None = None, startup_timeout_s: float = 20.0, **uvicorn_kwargs: Any
) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 in a thread; yield its ``http://`` base URL.

    The server is asked to exit when the block ends and the thread is joined (bounded).
    """
    port = port or free_port()
    kwargs: dict[str, Any] = {"log_level": "warning", "lifespan": "on"}
    kwargs.update(uvicorn_kwargs)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, **kwargs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn on port {port} exited during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"uvicorn on port {port} did not start in {startup_timeout_s}s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Echoes each message back; reward = len(message)/10; ``done`` when the message is "done".

    A message ``"sleep:<seconds>"`` sleeps (in a worker thread) before answering and
    ``"raise"`` raises, for deadline and error tests.
    """

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        import uuid

        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return EchoObservation(echoed_message="ready", reward=0.0)

    def step(self, action: EchoAction) -> EchoObservation:
        msg = action.message
        if msg.startswith("sleep:"):
            time.sleep(float(msg.split(":", 1)[1]))
        elif msg == "raise":
            raise RuntimeError("echo env raised on purpose")
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=msg,
            message_length=len(msg),
            reward=len(msg) / 10.0,
            done=msg == "done",
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        return self._state
