"""The ``envsdk`` command as a user runs it: the installed console script, started in a
temporary folder (never the repository root) with no PYTHONPATH.

``ENVSDK_CLI`` names another ``envsdk`` executable to test and ``ENVSDK_REPO`` its checkout (e.g.
an older one's, to see a test fail there); by default they are the one beside this interpreter
and this repository.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.testing import free_port, stop_process

REPO = Path(os.environ.get("ENVSDK_REPO") or Path(__file__).resolve().parents[2])
ENVSDK = Path(os.environ.get("ENVSDK_CLI") or Path(sys.executable).with_name("envsdk"))

def start_interruptible(command: list[str], **options: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen(command, **options)`` for a child a test presses Ctrl-C on (SIGINT).

    A child inherits an ignored SIGINT, and Python then never installs its KeyboardInterrupt
    handler. A test run started in the background of a non-interactive shell (``bash .ci/run &``)
    ignores SIGINT, so its children ran on through the Ctrl-C and finished with status 0. Here
    the child starts while SIGINT is handled (exec resets a handled signal to its default)."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(command, **options)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


#: The env a README reader writes: the README's snippet with its `...` bodies filled in.
FILLED_BODIES = {
    "def reset(": [
        "        self._state = State(episode_id=episode_id, step_count=0)",
        "        return MyObservation(text=f'say something (seed {seed})')",
    ],
    "def step(": [
        "        self._state.step_count += 1",
        "        done = self._state.step_count >= 3",
        "        return MyObservation(text=f'you said {action.message!r}', reward=float(len(action.message)), done=done)",
    ],
    "def state(": ["        return self._state"],
}


def readme_snippet() -> str:
    """The README's env (its block ``my-env``, under "Serve your own environment"), as printed."""
    from tests.docs.blocks import doc_block

    return doc_block("README.md", "my-env").text


def readme_env_source() -> str:
    """`readme_snippet` with each ``...`` body replaced by a working one (`FILLED_BODIES`);
    every other line is kept exactly."""
    lines: list[str] = []
    for line in readme_snippet().splitlines():
        stripped = line.strip()
        if stripped.endswith(": ...") and stripped.startswith("def "):
            key = next(k for k in FILLED_BODIES if stripped.startswith(k))
            lines.append(line[: -len(" ...")])
            lines.extend(FILLED_BODIES[key])
        else:
            assert "..." not in line, f"an unfilled `...` in the README snippet: {line!r}"
            lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENVSDK_TOKEN", "OPENAI_BASE_URL")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def envsdk(*args: str, cwd: Path, timeout: float = 180, env: dict[str, str] | None = None) -> Result:
    """Run ``envsdk ARGS`` in `cwd` and wait for it (bounded by `timeout`)."""
    done = subprocess.run(
        [str(ENVSDK), *args], cwd=cwd, env=env or user_env(), capture_output=True, text=True, timeout=timeout
    )
    return Result(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(result: Result, *needles: str) -> None:
    """A failure a user reads at once: non-zero, no traceback, one ``error`` line naming the fix."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A user's folder holding ``my_env.py`` (the README's env, filled in)."""
    (tmp_path / "my_env.py").write_text(readme_env_source(), encoding="utf-8")
    return tmp_path


ServeFn = Callable[..., str]


@contextlib.contextmanager
def harbor_server(tasks: Path, cwd: Path, seconds: float = 600) -> Iterator[str]:
    """``python -m servers.harbor --tasks <tasks>`` started in `cwd` on a free port: its base URL
    once ``/health`` answers (images are built first: `seconds` bounds it); stopped on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servers.harbor", "--tasks", str(tasks), "--port", str(port)],
        cwd=cwd, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        yield await_health(proc, f"http://127.0.0.1:{port}", seconds=seconds)
    finally:
        stop_process(proc, timeout_s=60)


def await_health(proc: subprocess.Popen[str], url: str, seconds: float = 90) -> str:
    """`url` once the server `proc` started answers ``/health`` with 200; an AssertionError with
    its output if it exits first, or when `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server at {url} did not start")


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """``serve(target, *flags, cwd=folder)`` starts ``envsdk serve`` (or, with ``module=``,
    ``python -m module``) on a free port and returns its base URL once ``/health`` answers.
    Every server is stopped at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, cwd: Path, module: str | None = None, env: dict[str, str] | None = None) -> str:
        port = free_port()
        command = [sys.executable, "-m", module, *args] if module else [str(ENVSDK), "serve", *args]
        proc = subprocess.Popen(
            [*command, "--port", str(port)], cwd=cwd, env=env or user_env(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        return await_health(proc, url)

    yield start
    for proc in procs:
        stop_process(proc)
