"""The Harbor server as an operator runs it: it refuses to start without the ``mcp`` extra (its
tools are served over MCP), it says at start when its sessions cannot all have a container in
the store, a broken task is one line in its log (no traceback), and SIGTERM with a command
running ends that command with its container and exits within the drain timeout and a few
seconds, leaving no container and no process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envsdk import EnvClient
from envsdk.errors import EnvSDKError, ServerError, ServerShutdownError
from envsdk.sandbox.container import ContainerProvider
from envsdk.testing import free_port, running_server, wait_healthy
from servers.harbor import HarborLimits, create_harbor_app, read_task
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401 - fixtures

pytestmark = [pytest.mark.timeout(180)]

FIXTURES = Path(__file__).parent / "harbor_fixtures"
REPOSITORY = Path(__file__).resolve().parents[2]
LIMITS = HarborLimits(command_timeout_s=200.0, max_verifier_timeout_s=20.0, max_memory_mb=512, max_storage_mb=512)

#: Makes fastmcp absent for the interpreter that reads it, as when the extra is not installed.
HIDE_FASTMCP = """\
import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "fastmcp" or name.startswith("fastmcp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def test_without_the_mcp_extra_the_server_and_the_rollout_refuse_in_one_line(tmp_path: Path) -> None:
    hider = tmp_path / "hide"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDE_FASTMCP, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{hider}{os.pathsep}{REPOSITORY}"}
    hidden = subprocess.run([sys.executable, "-c", "import fastmcp"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert "No module named 'fastmcp'" in hidden.stderr

    served = subprocess.run(
        [sys.executable, "-m", "servers.harbor", "--tasks", str(FIXTURES / "minimal"), "--port", str(free_port())],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    lines = served.stderr.strip().splitlines()
    assert served.returncode == 2 and len(lines) == 1, served.stderr
    assert lines[0].startswith("python -m servers.harbor: error: ") and "fastmcp" in lines[0]
    assert "pip install -e '.[mcp]'" in lines[0] and "bash scripts/setup.sh mcp" in lines[0]

    work = tmp_path / "work"
    work.mkdir()
    rollout = subprocess.run(
        [str(Path(sys.executable).with_name("envsdk")), "rollout", "--env", "harbor", "--tasks",
         str(FIXTURES / "minimal"), "--policy", "noop", "--no-progress"],
        cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    errors = [line for line in rollout.stderr.splitlines() if "error" in line.lower()]
    assert rollout.returncode != 0 and "Traceback" not in rollout.stderr, rollout.stderr
    assert len(errors) == 1 and "pip install -e '.[mcp]'" in errors[0], rollout.stderr


@requires_containers
def test_a_broken_task_is_one_log_line_and_the_start_says_when_the_store_cannot_hold_every_session(
    container_provider: ContainerProvider, tmp_path: Path, caplog: pytest.LogCaptureFixture,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("minimal", "no-toml"):
        shutil.copytree(FIXTURES / name, tmp_path / "tasks" / name)
    space = container_provider.store_space()
    assert space is not None
    need = LIMITS.container_limits(read_task(FIXTURES / "minimal"), container_provider.limits).container_memory_mb
    many = space.available_mb // need + 1
    with caplog.at_level(logging.INFO, logger="envsdk"):
        create_harbor_app(tmp_path / "tasks", provider=container_provider, limits=LIMITS, max_concurrent_envs=1)
        assert not [r for r in caplog.records if "max_concurrent_envs" in r.getMessage()], caplog.text
        app = create_harbor_app(tmp_path / "tasks", provider=container_provider, limits=LIMITS,
                                max_concurrent_envs=many)
        warned = [r.getMessage() for r in caplog.records if "max_concurrent_envs" in r.getMessage()]
        assert len(warned) == 1 and "\n" not in warned[0], caplog.text
        assert str(space.store) in warned[0] and f"max_concurrent_envs {many}" in warned[0], warned[0]
        assert f"{need} MiB" in warned[0], warned[0]

        # The traceback of an env error is logged once a minute: start from none logged.
        monkeypatch.setattr("envsdk.server.sessions._TRACEBACK_LOGGED", {})
        caplog.clear()
        with running_server(app) as url:
            _reset_refused(url, "no-toml")
        said = [r.getMessage() for r in caplog.records if "raised TaskError" in r.getMessage()]
        assert len(said) == 1 and "task no-toml: task.toml: missing" in said[0], caplog.text
        assert "\n" not in said[0] and "Traceback" not in caplog.text, caplog.text


def _reset_refused(url: str, task: str) -> None:
    async def reset() -> None:
        async with EnvClient(url) as env:
            with pytest.raises(ServerError, match="task.toml: missing"):
                await env.reset(task=task)

    asyncio.run(reset())


def _processes_with(needle: bytes) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


@requires_containers
def test_sigterm_with_a_command_running_exits_within_the_drain_and_leaves_nothing(
    container_provider: ContainerProvider, tmp_path: Path,  # noqa: F811
) -> None:
    engine = container_provider.engine
    shutil.copytree(FIXTURES / "minimal", tmp_path / "tasks" / "term-check")
    port, drain_s = free_port(), 2.0
    server = subprocess.Popen(
        [sys.executable, "-m", "servers.harbor", "--tasks", str(tmp_path / "tasks"), "--port", str(port),
         "--log-level", "warning", "--drain-timeout", str(drain_s)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    outcome: list[BaseException | object] = []
    client: threading.Thread | None = None
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}", 120, "the Harbor server")

        async def play() -> None:
            async with EnvClient(f"http://127.0.0.1:{port}") as env:
                await env.reset(task="term-check")
                try:
                    outcome.append(await env.step({"tool": "bash", "command": "sleep 170.5"}))
                except EnvSDKError as exc:
                    outcome.append(exc)

        client = threading.Thread(target=asyncio.run, args=(play(),), daemon=True)
        client.start()
        deadline = time.monotonic() + 60
        while not _processes_with(b"sleep\x00170.5") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(b"sleep\x00170.5"), "the command never started"
        listed = engine.call(["ps", "--format", "{{.Names}} {{.Image}}"], timeout=60).stdout.decode()
        mine = [line.split()[0] for line in listed.splitlines() if "envsdk-task-term-check:" in line]
        assert len(mine) == 1

        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=drain_s + 30) == 128 + signal.SIGTERM
        took = time.monotonic() - started
        # The drain, then the containers removed and the sessions closed: seconds, not the
        # command's 170 s (nor the close deadline's 60 s).
        assert took < drain_s + 8, f"exited {took:.1f} s after SIGTERM"
        client.join(30)
        assert outcome and isinstance(outcome[0], ServerShutdownError), outcome
        assert engine.call(["ps", "-a", "-q", "--filter", f"name={mine[0]}"], timeout=60).stdout.strip() == b""
        assert _processes_with(b"sleep\x00170.5") == []
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        assert server.stderr is not None
        server.stderr.close()
