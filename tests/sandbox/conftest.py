"""Providers for the sandbox tests: bubblewrap (installed on demand where possible, else skipped
with the reason) and plain processes."""

from __future__ import annotations

import os
import shutil
import subprocess

from typing import Any

import psutil
import pytest

from envsdk.sandbox import BubblewrapProvider, ProcessProvider, SandboxLimits, SandboxProvider, bwrap_path


def ensure_bwrap() -> str | None:
    """Why bubblewrap cannot be used here, or None once ``bwrap`` is installed."""
    if bwrap_path() is not None:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "bwrap is not installed and cannot be installed here (not root, or no apt-get)"
    result = subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-qq", "bubblewrap"],
        capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=900,
    )
    if result.returncode != 0 or bwrap_path() is None:
        return f"bwrap is not installed and apt-get could not install it: {result.stderr[-300:]!r}"
    return None


#: Small limits so that every attack ends in seconds.
TEST_LIMITS = SandboxLimits(
    cpu_s=3, memory_bytes=512 << 20, processes=32, file_bytes=16 << 20, open_files=128,
    disk_bytes=32 << 20, output_bytes=64 << 10, timeout_s=4.0,
)


def provider_named(name: str, limits: SandboxLimits = TEST_LIMITS) -> SandboxProvider:
    if name == "bubblewrap":
        reason = ensure_bwrap()
        if reason is not None:
            pytest.skip(reason)
        return BubblewrapProvider(limits)
    return ProcessProvider(limits)


@pytest.fixture(params=["bubblewrap", "process"])
def provider(request: pytest.FixtureRequest) -> SandboxProvider:
    return provider_named(request.param)


def processes_of(uid: int | None, root_pid: int) -> list[psutil.Process]:
    """Live processes of a sandbox, seen from the host: its user id's (when it has one of its
    own), else its root process and that process's descendants."""
    if uid is not None:
        found = []
        for proc in psutil.process_iter(["uids", "status"]):
            try:
                if proc.info["uids"].real == uid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, TypeError):
                continue
        return found
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(boxes: list[Any]) -> dict[int, float]:
    """CPU seconds (user + system) each live process of the sandboxes `boxes` has used, seen
    from the host."""
    used = {}
    for box in boxes:
        for proc in processes_of(box.uid, box.pid):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used[proc.pid] = times.user + times.system
    return used


def sandbox_of(app: Any, episode_id: str) -> Any:
    """The sandbox of the coding server `app`'s session that plays `episode_id`."""
    for session in app.state.envsdk_sessions.sessions():
        env = session.env
        if env is not None and env.state.episode_id == episode_id:
            return env._sandbox
    raise AssertionError(f"no session plays episode {episode_id}")
