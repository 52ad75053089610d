"""The container store is shared: a provider admits a container only where the store can hold
everything it may write, beside every container already admitted (by any process on the same
store), and refuses the rest in one line naming the store, what is free and what the container
needs. Containers that fill their disk then never fill the store. The promises of a process
that was killed go with its containers, and a server's shutdown removes its containers at once,
even with a command running in one.

Everything here runs on a small private store (a tmpfs of its own, unmounted at the end), never
on the shared one."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envsdk.sandbox import container
from envsdk.sandbox.container import (
    STORE_SLACK_MB,
    ContainerEngine,
    ContainerLimits,
    ContainerProvider,
    ContainerSandbox,
    StoreFullError,
    host_reserve_mb,
)
from envsdk.sandbox.images import prepare_base
from tests._containers import requires_containers

pytestmark = [requires_containers, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
BASE = "debian:bookworm-slim"
#: Room for the base image (about 80 MiB) and two small containers' budgets.
STORE_MB = 400
MIB = 1 << 20


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerEngine]:
    """podman on a private store of `STORE_MB` with the Debian base image; at the end every
    container of it removed and its tmpfs unmounted."""
    root = tmp_path_factory.mktemp("store")
    engine = ContainerEngine("podman", root=root, store_mb=STORE_MB)
    try:
        prepare_base(engine, [BASE], image_map={}, pull=False)
        yield engine
    finally:
        engine.call(["rm", "-a", "-f", "-v", "-t", "0"], timeout=60, check=False)  # the store is this module's
        assert engine.store is not None and engine.runroot is not None and engine.store_ledger is not None
        subprocess.run(["umount", "-R", str(engine.store)], check=False, capture_output=True, timeout=60)
        shutil.rmtree(engine.runroot, ignore_errors=True)
        for leftover in engine.lock_dir.glob(f"{engine.store_ledger.stem}.*"):
            leftover.unlink()
        assert str(root) not in Path("/proc/self/mountinfo").read_text()


def _limits(need_mb: int) -> ContainerLimits:
    """Small limits whose container needs `need_mb` MiB of the store in all."""
    # A start waits for room half its start time: 3 s here.
    limits = ContainerLimits(memory_mb=48, storage_mb=16, pids=32, output_bytes=64 << 10, timeout_s=10.0,
                             start_timeout_s=6.0)
    return ContainerLimits(**{**limits.__dict__, "storage_mb": need_mb - limits.container_memory_mb + 16})


@pytest.fixture(scope="module")
def provider(engine: ContainerEngine) -> ContainerProvider:
    """A provider whose containers are just under half of the store's room each: two fit."""
    space = ContainerProvider(engine).store_space()
    assert space is not None and space.containers == 0
    limits = _limits(space.available_mb // 2 - 4)
    assert limits.container_memory_mb * 2 <= space.available_mb < limits.container_memory_mb * 3
    return ContainerProvider(engine, limits=limits)


def _store_free(engine: ContainerEngine) -> int:
    assert engine.store is not None
    stats = os.statvfs(engine.store)
    return stats.f_bavail * stats.f_frsize


def _names(engine: ContainerEngine) -> list[str]:
    return engine.call(["ps", "-a", "--format", "{{.Names}}"], timeout=60).stdout.decode().split()


def test_a_start_past_the_store_is_refused_in_one_line_and_filled_disks_leave_the_store_usable(
    engine: ContainerEngine, provider: ContainerProvider,
) -> None:
    need = provider.limits.container_memory_mb
    first = provider.start(BASE)
    second = provider.start(BASE)
    try:
        space = provider.store_space()
        assert space is not None and (space.containers, space.promised_mb) == (2, 2 * need)
        started = time.monotonic()
        with pytest.raises(StoreFullError) as refused:
            provider.start(BASE)
        assert 2.5 < time.monotonic() - started < 10  # it waited for room, then gave up
        said = str(refused.value)
        assert "\n" not in said and str(engine.store) in said, said
        assert f"{space.free_mb} MiB free" in said and f"needs {need} MiB" in said, said
        # What to do comes first: the wire keeps the first 256 characters of an error.
        assert f"grow the store (mount -o remount,size=<MB>m {engine.store})" in said[:256], said
        assert len(_names(engine)) == 2  # nothing was made for the refused one

        # Both fill their disk as far as they can: each is stopped at its own budget, and the
        # store keeps room for the engine's own files and for the other's.
        for box in (first, second):
            filled = box.bash("dd if=/dev/zero of=/fill bs=1M count=1000 status=none", timeout=30)
            assert filled.returncode == 128 + signal.SIGKILL, filled
        assert _store_free(engine) > 16 * MIB
        # At its budget, a new process of the container may be killed out of memory before it
        # frees anything (as the provider says): the rm is tried again until it runs, then the
        # container is usable.
        for _ in range(5):
            if second.bash("rm -f /fill").returncode == 0:
                break
        assert second.bash("head -c 4M /dev/zero > /small && echo ok").stdout == b"ok\n"
        assert len(_names(engine)) == 2

        # A start waits for room: the first closing a second later lets the third in.
        closer = threading.Timer(1.0, first.close)
        closer.start()
        third = provider.start(BASE)
        closer.join()
        third.close()
    finally:
        first.close()
        second.close()
    space = provider.store_space()
    assert space is not None and (space.containers, space.promised_mb) == (0, 0)


def test_admission_stops_at_what_the_hosts_memory_holds_when_the_store_is_larger(
    engine: ContainerEngine, provider: ContainerProvider, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The store is a tmpfs: its pages are the host's RAM or swap. A store grown past them (a
    # bench grew one to 40 GB on a 24 GB host) must not promise containers more than that.
    space = provider.store_space()
    assert space is not None and space.containers == 0 and space.memory_mb > 0
    need = provider.limits.container_memory_mb
    # A host whose memory holds, beside its reserve and what the store holds, one container.
    memory = host_reserve_mb(1) + space.used_mb + need + STORE_SLACK_MB + 8
    monkeypatch.setattr(container, "_host_memory_mb", lambda: memory)
    space = provider.store_space()
    assert space is not None and space.host_bound and space.available_mb == need + 8 < space.free_mb
    assert provider.describe()["store_space"]["host_room_mb"] == need + STORE_SLACK_MB + 8
    first = provider.start(BASE)
    try:
        with pytest.raises(StoreFullError) as refused:
            provider.start(BASE)
    finally:
        first.close()
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"this host's memory has 8 MiB left for containers and a container of {BASE}")
    assert "retry once containers end" in said[:256] and "growing it adds no room" in said, said
    assert f"{memory} MiB of RAM and swap" in said, said

    # A store larger than the host's RAM and swap is said once, when an engine prepares it.
    monkeypatch.setattr(container, "_host_memory_mb", lambda: STORE_MB // 2)
    with caplog.at_level(logging.WARNING, logger="envsdk.sandbox"):
        ContainerEngine("podman", root=engine.root, store_mb=STORE_MB).prepare()
    warned = [r.getMessage() for r in caplog.records if "more than this host's" in r.getMessage()]
    assert len(warned) == 1 and f"a tmpfs of {STORE_MB} MiB, more than this host's {STORE_MB // 2} MiB" in warned[0]


HOLDER = """
import sys, time
from pathlib import Path
from envsdk.sandbox.container import ContainerEngine, ContainerLimits, ContainerProvider
engine = ContainerEngine("podman", root=Path(sys.argv[1]), store_mb=int(sys.argv[2]))
limits = ContainerLimits(**eval(sys.argv[3]))
box = ContainerProvider(engine, limits=limits).start("debian:bookworm-slim")
print(box.name, flush=True)
time.sleep(600)
"""


def test_the_store_is_shared_by_processes_and_a_killed_ones_promise_goes_with_its_container(
    engine: ContainerEngine, provider: ContainerProvider, caplog: pytest.LogCaptureFixture,
) -> None:
    assert engine.root is not None
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(engine.root), str(STORE_MB), repr(provider.limits.__dict__)],
        stdout=subprocess.PIPE, cwd=REPO, start_new_session=True,
    )
    mine: list[ContainerSandbox] = []
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().decode().strip()
        assert held in _names(engine)
        mine.append(provider.start(BASE))
        # This process has one container; the store's other promise is the holder's.
        with pytest.raises(StoreFullError, match="promised to 2 running containers"):
            provider.start(BASE)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    try:
        with caplog.at_level(logging.INFO, logger="envsdk.sandbox"):
            mine.append(provider.start(BASE))
        assert held not in _names(engine)  # the killed holder's container went with its promise
        removed = [r.getMessage() for r in caplog.records if "removed 1 container" in r.getMessage()]
        assert len(removed) == 1 and "\n" not in removed[0], caplog.text
    finally:
        for box in mine:
            box.close()


def test_remove_all_ends_a_running_command_at_once_and_leaves_no_container(
    engine: ContainerEngine, provider: ContainerProvider,
) -> None:
    box = provider.start(BASE)
    ran: list[object] = []
    thread = threading.Thread(target=lambda: ran.append(box.bash("sleep 60", timeout=60)))
    thread.start()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        assert provider.remove_all() == 1
        thread.join(15)
        assert not thread.is_alive() and time.monotonic() - started < 10
        assert getattr(ran[0], "returncode", None) == -9
        assert _names(engine) == []
        space = provider.store_space()
        assert space is not None and space.containers == 0
        box.close()  # the container is gone already: no error
        assert provider.remove_all() == 0
        again = provider.start(BASE)  # the provider still starts containers
        again.close()
    finally:
        box.close()
        thread.join(15)
