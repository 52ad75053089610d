"""Hostile code against the coding server, over a real socket, with an honest session measured
alongside: each attack gets a typed reply within its deadline, the honest session keeps at
least 80% of its step rate, the server's memory stays bounded, and afterwards nothing of the
attacker's sandbox is left (processes of its user id, its workspace, mounts), checked from the
host.

The plain-process provider is weaker by design; the attacks it cannot stop are not run on it
(they would succeed): filling the disk with many files below the per-file limit and, on a kernel
without Landlock, network access and reading world-readable files outside the workspace.
`test_process_provider_weaknesses` pins what it shows that bubblewrap hides, so the README's
list stays true.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from envsdk.client.sync import OpenEnvWrapper
from envsdk.sandbox.process import landlock_abi
from envsdk.testing import running_server
from servers.coding import create_coding_app
from tests.sandbox.conftest import TEST_LIMITS, ensure_bwrap, processes_of, sandbox_of

pytestmark = pytest.mark.timeout(300)

SECRET = "envsdk-attack-secret-" + secrets.token_hex(8)
SERVER_FILE = str(Path(__file__).resolve())


@dataclass
class Served:
    url: str
    app: Any
    provider: str
    port: int


@dataclass
class Honest:
    """An honest session stepping as fast as it can in a thread; `times` holds when each step's
    reply came back."""

    url: str
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with OpenEnvWrapper(self.url) as env:
            env.reset(seed=0, max_steps=64, episode_id="honest")
            n = 0
            while not self.stop.is_set():
                result = env.step({"code": f"x = {n}\nprint(x)"})
                if result.observation["stdout"] != f"{n}\n":
                    self.errors.append(repr(result.observation))
                self.times.append(time.monotonic())
                n += 1
                if result.done:
                    env.reset(seed=0, max_steps=64, episode_id="honest")

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.times if start <= t <= end) / (end - start)


@pytest.fixture(scope="module", params=["bubblewrap", "process"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    if request.param == "bubblewrap" and (reason := ensure_bwrap()) is not None:
        pytest.skip(reason)
    os.environ["ENVSDK_ATTACK_SECRET"] = SECRET
    app = create_coding_app(provider=request.param, limits=TEST_LIMITS, warm=2, max_concurrent_envs=8)
    try:
        with running_server(app) as url:
            yield Served(url, app, request.param, int(url.rsplit(":", 1)[1]))
    finally:
        os.environ.pop("ENVSDK_ATTACK_SECRET", None)
        app.state.envsdk_sandbox_pool.close()


@pytest.fixture(scope="module")
def honest(served: Served) -> Iterator[Honest]:
    session = Honest(served.url)
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(session.times) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield session
    session.stop.set()
    thread.join(timeout=30)


def attack_code(name: str, port: int) -> str:
    return {
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "allocate_10_gib": "x = bytearray(10 * 1024 ** 3)",
        "infinite_loop": "while True:\n    pass",
        "busy_8_threads": (
            "import threading\ndef spin():\n    while True:\n        pass\n"
            "ts = [threading.Thread(target=spin) for _ in range(8)]\n"
            "for t in ts:\n    t.start()\nfor t in ts:\n    t.join()"
        ),
        "write_10_gib_one_file": (
            "chunk = b'0' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(10240):\n        f.write(chunk)"
        ),
        "write_10_gib_many_files": (
            "chunk = b'0' * (1 << 20)\nfor i in range(1280):\n    with open(f'f{i}', 'wb') as f:\n"
            "        for _ in range(8):\n            f.write(chunk)"
        ),
        "print_1_gib": "import sys\nc = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(c)",
        "ignore_sigterm": (
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)"
        ),
        "daemon_grandchild": (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        while True:\n            time.sleep(1)\n    os._exit(0)\nos.wait()\nprint('parent done')"
        ),
        "open_100k_files": "fs = []\nfor _ in range(100000):\n    fs.append(open('/dev/null'))",
        "connect_server_port": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "connect_any_address": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
        "read_server_environment": (
            "import glob, os\nfor p in glob.glob('/proc/[0-9]*/environ'):\n    try:\n"
            "        print(open(p, 'rb').read())\n    except OSError:\n        pass\nprint(dict(os.environ))"
        ),
        "read_files_outside_workspace": f"print(open({SERVER_FILE!r}).read()[:100])",
        "kill_server_pid": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
    }[name]


#: Attacks the process provider cannot stop (see the module docstring): not run on it. Landlock
#: hides host files (any ABI) and refuses TCP (ABI 4 on) where the kernel has it.
PROCESS_CANNOT_STOP = {
    "write_10_gib_many_files",
    *(("connect_server_port", "connect_any_address") if landlock_abi() < 4 else ()),
    *(("read_files_outside_workspace",) if landlock_abi() < 1 else ()),
}

#: What each attack's reply must say: "error" (exit status 1, an exception), "killed" (negative
#: status: the deadline or a limit), "ok" (exit 0 with the damage contained), or a set.
EXPECTED: dict[str, set[str]] = {
    "fork_bomb": {"killed"},
    "allocate_10_gib": {"error"},
    "infinite_loop": {"killed"},
    "busy_8_threads": {"killed"},
    "write_10_gib_one_file": {"error"},
    "write_10_gib_many_files": {"error"},
    "print_1_gib": {"ok", "killed"},
    "ignore_sigterm": {"killed"},
    "daemon_grandchild": {"ok"},
    "open_100k_files": {"error"},
    "connect_server_port": {"error"},
    "connect_any_address": {"error"},
    "read_server_environment": {"ok"},
    "read_files_outside_workspace": {"error"},
    "kill_server_pid": {"error"},
}


def verdict(exit_code: int) -> str:
    return "ok" if exit_code == 0 else "error" if exit_code == 1 else "killed" if exit_code < 0 else f"exit {exit_code}"


def attack_once(attack: str, served: Served, honest: Honest, try_no: int) -> tuple[float, float]:
    """One attack in its own session: every check on its reply and its sandbox's remains;
    returns the honest session's step rate while it ran (at least 4 s, its close included)
    and just before."""
    server = psutil.Process()
    rss_before = server.memory_info().rss
    episode = f"attack-{attack}-{try_no}"
    with OpenEnvWrapper(served.url) as env:
        env.reset(seed=1, max_steps=64, episode_id=episode)
        box = sandbox_of(served.app, episode)
        before = len(processes_of(box.uid, box.pid))
        started = time.monotonic()
        result = env.step({"code": attack_code(attack, served.port)})
        ended = time.monotonic()
        obs = result.observation
        # A typed reply, within the run's deadline plus the agent's grace.
        assert verdict(obs["exit_code"]) in EXPECTED[attack], obs
        assert ended - started < TEST_LIMITS.timeout_s + 5.0
        assert len(obs["stdout"].encode()) <= TEST_LIMITS.output_bytes
        assert SECRET not in obs["stdout"] + obs["stderr"]
        if attack == "daemon_grandchild":
            # The run's leftovers are gone while the session goes on.
            assert len(processes_of(box.uid, box.pid)) <= before
        follow = env.step({"code": "print('still here')"})
        assert follow.observation["stdout"] == "still here\n"
    window = max(ended - started, 4.0)
    time.sleep(max(0.0, started + window - time.monotonic()))
    assert honest.errors == []
    assert server.memory_info().rss - rss_before < 200 << 20
    # Nothing of the attacker's sandbox remains, seen from the host. The server closes the
    # sandbox after the session ends: its last processes are killed, then its workspace removed,
    # so both are waited for (a fork bomb's last processes went a moment before the folder).
    workspace = box.slot.workspace
    deadline = time.monotonic() + 15
    while (processes_of(box.uid, box.pid) or (workspace is not None and workspace.exists())) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert processes_of(box.uid, box.pid) == []
    if workspace is not None:
        assert not workspace.exists()
    return honest.rate(started, started + window), honest.rate(started - 2 * window, started)


@pytest.mark.parametrize("attack", list(EXPECTED))
def test_attack_is_contained(attack: str, served: Served, honest: Honest) -> None:
    """The honest session keeps 80% of its step rate. The machine is shared (other test runs
    come and go within seconds, a disk flushes another test's writes), so a rate below the bar
    is measured again with a fresh attack, up to three times: an attack that really starves the
    honest session fails every time (on a 2-core machine a 10 GiB write once fell to 69% and
    then 77% of a baseline taken seconds before)."""
    if served.provider == "process" and attack in PROCESS_CANNOT_STOP:
        pytest.skip("the process provider cannot stop this attack (documented)")
    if served.provider == "process" and os.geteuid() != 0 and attack in ("fork_bomb", "kill_server_pid"):
        pytest.skip("the process provider shares the server's user id when not root")
    rates = []
    for try_no in range(3):
        during, baseline = attack_once(attack, served, honest, try_no)
        rates.append(f"{during:.1f} during vs {baseline:.1f} before")
        if during >= 0.8 * baseline:
            return
    pytest.fail(f"honest steps/s fell below 80% three times: {rates}")


def _mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """Each mount point of a ``/proc/<pid>/mountinfo`` text with its filesystem type and options."""
    mounts = {}
    for line in filter(None, mountinfo.splitlines()):
        where, _, after = line.partition(" - ")
        fstype, _, options = after.split(" ", 2)
        mounts[where.split()[4]] = (fstype, options)
    return mounts


def test_no_sandbox_mount_reaches_the_host(served: Served) -> None:
    """A sandbox's root (a tmpfs of its disk budget, holding /workspace and /tmp) is mounted in its
    own mount namespace: the sandbox sees it, the server's host has no such mount."""
    if served.provider == "process":
        pytest.skip("the process provider mounts nothing (it has no mount namespace): nothing could reach the host")
    with OpenEnvWrapper(served.url) as env:
        env.reset(seed=1)
        seen = env.step({"code": "print(open('/proc/self/mountinfo').read())"})
        host = _mounts(Path("/proc/self/mountinfo").read_text())
    inside = _mounts(seen.observation["stdout"])
    assert inside["/"][0] == "tmpfs" and f"size={TEST_LIMITS.disk_bytes // 1024}k" in inside["/"][1], inside
    assert inside["/"] not in host.values(), inside["/"]
    assert "/workspace" not in host


def test_process_provider_weaknesses(served: Served) -> None:
    """What the README says the process provider cannot stop, pinned: with no PID namespace the
    server's own process is in the sandbox's /proc (bubblewrap's /proc shows its own only), and
    UDP is not covered by Landlock. Files and TCP are refused where Landlock is (the attacks)."""
    if served.provider != "process":
        pytest.skip("pins the process provider's documented weaknesses")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(10)
    code = (
        f"import os, socket\nprint({os.getpid()} in [int(p) for p in os.listdir('/proc') if p.isdigit()])\n"
        f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'out', ('127.0.0.1', {receiver.getsockname()[1]}))"
    )
    try:
        with OpenEnvWrapper(served.url) as env:
            env.reset(seed=1)
            seen = env.step({"code": code})
            assert seen.observation["exit_code"] == 0 and seen.observation["stdout"].strip() == "True", seen.observation
            assert receiver.recv(16) == b"out"
    finally:
        receiver.close()
