"""Attacks from inside a container, each while an honest container of the same provider keeps
answering within its deadline: a fork bomb (held by the process limit), a memory hog and a
disk fill (held by the memory limit, the disk in bytes), the network (none: no route, no DNS,
not the host's loopback), the host's files and processes (not visible); and nothing left of
either container afterwards (containers, mounts, processes, cgroups)."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from envsdk.sandbox.container import (
    ContainerLimits,
    ContainerProvider,
    ContainerSandbox,
    EngineOutputTooLarge,
)
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401 - fixtures
from tests.sandbox.test_container_provider import leftovers, merged_dir

pytestmark = [requires_containers, pytest.mark.timeout(120)]

BASE = "debian:bookworm-slim"
ATTACKER_LIMITS = ContainerLimits(
    cpus=0.5, memory_mb=96, storage_mb=64, pids=40, output_bytes=64 << 10, timeout_s=10.0, start_timeout_s=30.0,
)
MIB = 1 << 20


@pytest.fixture(scope="module")
def honest(container_provider: ContainerProvider) -> Iterator[ContainerSandbox]:  # noqa: F811
    box = container_provider.start(BASE)
    yield box
    box.close()


@pytest.fixture(scope="module")
def attacker(container_provider: ContainerProvider) -> Iterator[ContainerSandbox]:  # noqa: F811
    box = container_provider.start(BASE, limits=ATTACKER_LIMITS)
    yield box
    box.close()


@contextmanager
def honest_keeps_answering(box: ContainerSandbox, deadline_s: float = 5.0) -> Iterator[None]:
    """Run ``echo`` in `box` over and over while the block runs; then every one must have
    answered, right, within `deadline_s`."""
    answers: list[tuple[int, bytes, float]] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            started = time.monotonic()
            run = box.bash("echo ok", timeout=deadline_s)
            answers.append((run.returncode, run.stdout, time.monotonic() - started))
            stop.wait(0.05)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(deadline_s + 10)
    assert answers, "the honest container never answered"
    assert all(code == 0 and out == b"ok\n" for code, out, _ in answers), answers
    assert max(took for _, _, took in answers) < deadline_s


def cgroup_value(box: ContainerSandbox, controller: str, name: str) -> int:
    """A cgroup v1 file of the container, read on the host."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] == "cgroup" and controller in tail.split()[2].split(","):
            path = Path(fields.split()[4]) / "libpod_parent" / f"libpod-{box.id}" / name
            if path.exists():
                return int(path.read_text())
    raise AssertionError(f"no {controller} cgroup of {box.id[:12]}")


def test_a_fork_bomb_is_held_by_the_process_limit(honest: ContainerSandbox, attacker: ContainerSandbox) -> None:
    with honest_keeps_answering(honest):
        run = attacker.bash(":(){ :|:& };: ; sleep 60", timeout=4)
    assert (run.returncode, run.timed_out) == (-9, True)
    allowed = cgroup_value(attacker, "pids", "pids.max")
    assert allowed <= ATTACKER_LIMITS.pids + 8
    assert cgroup_value(attacker, "pids", "pids.current") < 10  # the bomb is gone, not just stopped
    assert attacker.bash("echo still here").stdout == b"still here\n"


def test_a_memory_hog_is_killed_and_the_container_lives(honest: ContainerSandbox, attacker: ContainerSandbox) -> None:
    limit = cgroup_value(attacker, "memory", "memory.limit_in_bytes")
    assert limit == ATTACKER_LIMITS.container_memory_mb * MIB
    with honest_keeps_answering(honest):
        run = attacker.bash("head -c 2G /dev/zero | tail > /dev/null", timeout=30)
    assert run.returncode == 128 + 9 and not run.timed_out  # tail, killed by the kernel out of memory
    assert cgroup_value(attacker, "memory", "memory.max_usage_in_bytes") <= limit
    assert attacker.bash("echo still here").stdout == b"still here\n"
    # conmon marks the kill with a file named oom in its working folder: the engine's own,
    # never the folder the server (here, pytest) was started from.
    assert not (Path.cwd() / "oom").exists()
    assert (attacker.engine.work_dir / "oom").exists()


def test_a_disk_fill_is_bounded_in_bytes(
    honest: ContainerSandbox, attacker: ContainerSandbox, container_provider: ContainerProvider,  # noqa: F811
) -> None:
    store = container_provider.engine.store
    assert store is not None

    def used() -> int:
        stats = os.statvfs(store)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize

    before = used()
    with honest_keeps_answering(honest):
        run = attacker.bash("dd if=/dev/zero of=/fill bs=1M count=2000 status=none", timeout=30)
    assert run.returncode == 128 + 9 and not run.timed_out
    grown = used() - before
    assert 16 * MIB < grown <= ATTACKER_LIMITS.container_memory_mb * MIB
    stats = os.statvfs(store)
    assert stats.f_bavail * stats.f_frsize > 1 << 30  # the store's tmpfs is far from full
    assert attacker.bash("rm -f /fill && echo removed").stdout == b"removed\n"
    assert used() - before < 8 * MIB


def test_there_is_no_network(honest: ContainerSandbox, attacker: ContainerSandbox) -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 9))  # no packet: only picks the host's outward address
        host_ip = probe.getsockname()[0]
    finally:
        probe.close()
    try:
        with honest_keeps_answering(honest):
            run = attacker.bash(
                "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; "
                f"for ip in 127.0.0.1 {host_ip} 1.1.1.1; do echo \"$ip $( (echo hi > /dev/tcp/$ip/{port}) 2>&1 | head -1)\"; done; "
                "getent hosts example.com || echo no-dns",
                timeout=20,
            )
        with pytest.raises(OSError):
            server.accept()
    finally:
        server.close()
    lines = run.stdout.decode().splitlines()
    assert lines[0] == "lo" and lines[-1] == "no-dns"
    assert lines[1:4] == [
        "127.0.0.1 bash: connect: Connection refused",  # its own loopback: nothing listens there
        f"{host_ip} bash: connect: Network is unreachable",
        "1.1.1.1 bash: connect: Network is unreachable",
    ]
    assert run.duration_s < 10


def test_the_host_files_and_processes_are_not_visible(honest: ContainerSandbox, attacker: ContainerSandbox) -> None:
    marker = Path("/tmp") / f"envsdk-secret-{secrets.token_hex(8)}"
    marker.write_text("host secret")
    honest.bash("echo honest > /tmp/honest-file; sleep 300 > /dev/null 2>&1 &")
    try:
        # The names are split in the script, so that its own command line does not show them.
        run = attacker.bash(
            "find / -xdev \\( -name 'envsdk''-secret-*' -o -name 'honest''-file' \\) 2>/dev/null; "
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; "
            f"kill -0 {os.getpid()} 2>&1; cut -d' ' -f5 /proc/self/mountinfo",
        )
    finally:
        marker.unlink()
    listing = run.stdout.decode()
    assert "envsdk-secret" not in listing and "honest-file" not in listing
    assert "pytest" not in listing and "sleep 300" not in listing and "/work" not in listing
    assert "No such process" in listing
    processes = [line for line in listing.splitlines() if line.startswith(("bash", "sleep", "timeout", "tr"))]
    assert len(processes) < 8


def test_a_list_of_changes_too_long_to_read_is_refused_in_bytes(attacker: ContainerSandbox) -> None:
    # How many files an agent makes decides how long the engine's list of changes is; the list
    # is read up to a byte cap, never whole into the server's memory.
    made = attacker.bash(
        "mkdir -p /root/many && cd /root/many && for i in $(seq 1500); do : > "
        "\"file-with-a-rather-long-name-so-the-list-grows-quickly-$i\"; done; ls | wc -l", timeout=10,
    )
    assert made.returncode == 0 and made.stdout.strip() == b"1500", made
    whole = attacker.changes()
    assert sum(path.startswith("/root/many/") for _, path in whole) == 1500
    with pytest.raises(EngineOutputTooLarge, match=r"wrote more than 65536 bytes"):
        attacker.changes(max_bytes=64 << 10)
    attacker.bash("rm -rf /root/many", timeout=10)
    assert not any(path.startswith("/root/many") for _, path in attacker.changes())


def test_nothing_is_left_of_either_container(honest: ContainerSandbox, attacker: ContainerSandbox) -> None:
    traces = [(box, merged_dir(box)) for box in (honest, attacker)]
    attacker.bash("sleep 300 > /dev/null 2>&1 & setsid sleep 301 > /dev/null 2>&1 < /dev/null &")
    for box, _ in traces:
        box.close()
    for box, merged in traces:
        assert leftovers(box.engine, box.id, merged) == []
        assert not (Path("/sys/fs/cgroup/pids") / "libpod_parent" / f"libpod-{box.id}").exists()
