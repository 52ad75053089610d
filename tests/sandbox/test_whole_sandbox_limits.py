"""Limits that hold for a sandbox as a whole, on both providers: nothing runs between runs (a
timer, a forged "done", a forked child), memory and processes bounded for all of the sandbox's
processes together (cgroups), RAM-backed files counted in ``disk_bytes`` (bubblewrap) or gone
at close (plain processes), and no cgroup left behind (after close, or by a killed server)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from envsdk.sandbox import ProcessProvider, Sandbox, SandboxProvider
from tests.sandbox.conftest import TEST_LIMITS, cpu_seconds, processes_of

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups and a user id per sandbox need root")


def idle_cpu(box: Sandbox, seconds: float = 1.5) -> float:
    """CPU seconds the sandbox's processes use over `seconds` while no run is in progress."""
    before = cpu_seconds([box])
    time.sleep(seconds)
    after = cpu_seconds([box])
    return sum(spent - before.get(pid, 0.0) for pid, spent in after.items())


@pytest.fixture
def box(provider: SandboxProvider) -> Iterator[Sandbox]:
    sandbox = provider.start()
    try:
        yield sandbox
    finally:
        sandbox.close()


# ------------------------------------------------------------------ nothing runs between runs

TIMER = (
    "import signal\n"
    "def spin(*_):\n"
    "    while True:\n"
    "        pass\n"
    "signal.signal(signal.SIGALRM, spin)\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
)
#: The worker's control pipe is ``sys.argv[1]``: a snippet that writes the worker's own "done"
#: line there is answered at once while it goes on.
FORGED_DONE = "import os, sys\nos.write(int(sys.argv[1]), b'0\\n')\nwhile True:\n    pass\n"
FORKED_SPINNER = "import os\nif os.fork() == 0:\n    while True:\n        pass\n"


@pytest.mark.parametrize("code", [TIMER, FORGED_DONE, FORKED_SPINNER], ids=["timer", "forged_done", "forked_child"])
def test_nothing_a_snippet_started_runs_after_it_is_answered(box: Sandbox, code: str) -> None:
    done = box.run_python(code, timeout=2.0)
    assert done.returncode == 0 and done.duration_s < 1.5, done
    time.sleep(0.2)  # the timer fires (and the forged snippet spins) only after the reply
    assert idle_cpu(box) < 0.15
    # The sandbox still serves: the next snippet finishes, or restarts the interpreter.
    box.run_python("pass", timeout=1.0)
    assert box.run_python("print('alive')").stdout == b"alive\n"


def test_a_forged_done_buys_no_time_beyond_the_next_runs_deadline(box: Sandbox) -> None:
    box.run_python(FORGED_DONE, timeout=2.0)
    started = time.monotonic()
    next_run = box.run_python("print('next')", timeout=1.0)
    assert time.monotonic() - started < 1.0 + 1.0
    assert next_run.timed_out and "restarted" in next_run.note
    assert idle_cpu(box, 1.0) < 0.1


def test_a_stray_control_line_restarts_the_interpreter(box: Sandbox) -> None:
    """Two "done" lines: the second would answer the next snippet before it ran."""
    box.run_python("x = 1")
    box.run_python("import os, sys\nos.write(int(sys.argv[1]), b'0\\n0\\n')")
    after = box.run_python("print('x' in globals())")
    assert after.restarted and after.stdout == b"False\n"


def test_interpreter_state_survives_between_runs(box: Sandbox) -> None:
    """Frozen between runs, the interpreter keeps its names (and a command run in between does
    not disturb it)."""
    box.run_python("import time\nx = 41\nstarted = time.monotonic()")
    assert box.run(["true"]).returncode == 0
    done = box.run_python("print(x + 1)")
    assert done.stdout == b"42\n" and not done.restarted


def test_a_command_cannot_wake_the_interpreter_for_good(box: Sandbox) -> None:
    """A command may send the frozen interpreter SIGCONT; once the command is answered it is
    frozen again."""
    box.run_python(FORGED_DONE, timeout=2.0)
    woken = box.run(["python3", "-c", "import os, signal\nos.kill(-1, signal.SIGCONT)"])
    assert woken.returncode == 0, woken.stderr
    time.sleep(0.2)
    assert idle_cpu(box) < 0.15


# ------------------------------------------------------------------ memory and processes

HOLD_MEMORY = (
    "import os, time\n"
    "kids = []\n"
    "for _ in range(4):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        block = b'x' * (200 << 20)\n"
    "        time.sleep(1.5)\n"
    "        os.write(1, b'held\\n')\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "for pid in kids:\n"
    "    os.waitpid(pid, 0)\n"
)


def sandbox_rss(box: Sandbox) -> int:
    total = 0
    for proc in processes_of(box.uid, box.pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@root_only
def test_processes_together_cannot_exceed_memory_bytes(box: Sandbox) -> None:
    """Four processes of 200 MiB each, under the 512 MiB per-process limit: together they are
    over the sandbox's 512 MiB, so some of them are killed; the sandbox goes on."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], sandbox_rss(box))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done = box.run(["python3", "-c", HOLD_MEMORY], timeout=8.0)
    finally:
        stop.set()
        sampler.join()
    held = done.stdout.count(b"held")
    assert held * 200 * MIB < TEST_LIMITS.memory_bytes, (f"peak {peak[0] / MIB:.0f} MiB", done)
    # RSS counts the interpreters' shared pages once per process: a little slack for that.
    assert peak[0] < TEST_LIMITS.memory_bytes + 64 * MIB, f"peak {peak[0] / MIB:.0f} MiB"
    assert box.run_python("print('alive')").stdout == b"alive\n"


@root_only
def test_processes_are_bounded_for_the_whole_sandbox(box: Sandbox) -> None:
    from envsdk.sandbox.cgroups import OWN_PROCESSES

    cgroup = box.slot.cgroup
    assert cgroup is not None
    pids = cgroup.paths["pids"]
    assert int((pids / "pids.max").read_text()) == TEST_LIMITS.processes + OWN_PROCESSES
    bomb = "import os, time\nfor _ in range(200):\n    try:\n        os.fork() or time.sleep(3)\n    except OSError:\n        break\n"
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], int((pids / "pids.current").read_text()))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        box.run(["python3", "-c", bomb], timeout=2.0)
    finally:
        stop.set()
        sampler.join()
    assert 0 < peak[0] <= TEST_LIMITS.processes + OWN_PROCESSES
    assert box.run_python("print('alive')").stdout == b"alive\n"


@root_only
def test_memory_limit_is_set_for_the_sandbox(box: Sandbox) -> None:
    cgroup = box.slot.cgroup
    assert cgroup is not None
    memory = cgroup.paths["memory"]
    assert int((memory / "memory.limit_in_bytes").read_text()) == TEST_LIMITS.memory_bytes
    if (memory / "memory.memsw.limit_in_bytes").exists():
        assert int((memory / "memory.memsw.limit_in_bytes").read_text()) == TEST_LIMITS.memory_bytes
    members = {int(pid) for pid in (memory / "cgroup.procs").read_text().split()}
    assert {p.pid for p in processes_of(box.uid, box.pid)} <= members


@root_only
def test_describe_says_which_whole_sandbox_limits_hold(provider: SandboxProvider) -> None:
    assert provider.describe()["whole_sandbox"] == ["memory_bytes", "processes"]


def test_without_writable_cgroups_the_per_process_limits_remain(tmp_path: Path) -> None:
    """Where no cgroup can be made (here: a server whose cgroup file systems are read-only, in
    a mount namespace of its own), ``describe`` says no whole-sandbox limit holds and
    sandboxes still start with their per-process limits."""
    script = (
        "import json\nfrom envsdk.sandbox import ProcessProvider, SandboxLimits\n"
        "provider = ProcessProvider(SandboxLimits(timeout_s=5.0))\n"
        "with provider.start() as box:\n"
        "    out = box.run_python('print(6 * 7)').stdout.decode()\n"
        "print(json.dumps([provider.describe()['whole_sandbox'], out, box.slot.cgroup is None]))\n"
    )
    argv = [sys.executable, "-c", script]
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare (util-linux) to make the cgroup file systems read-only")
        read_only = 'for d in /sys/fs/cgroup/*/; do mount -o remount,bind,ro "$d" || exit 1; done; exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", read_only, "sh", *argv]
    done = subprocess.run(argv, check=False, cwd=REPO, capture_output=True, timeout=45)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [[], "42\n", True]


# ------------------------------------------------------------------ RAM-backed files


def test_every_writable_place_of_a_bubblewrap_sandbox_shares_disk_bytes(provider: SandboxProvider) -> None:
    """/dev, /dev/shm, / itself, /tmp and the workspace: whatever is writable is one tmpfs of
    ``disk_bytes``; /dev/shm still works for multiprocessing."""
    if provider.name != "bubblewrap":
        pytest.skip("the plain-process provider has no private file system")
    fill = (
        "import os\ntotal = 0\n"
        "for folder in ('/dev/shm', '/dev', '/', '/tmp', '/workspace'):\n"
        "    for n in range(4):\n"
        "        try:\n"
        "            with open(os.path.join(folder, f'fill{n}'), 'wb') as f:\n"
        "                for _ in range(16):\n"
        "                    f.write(b'0' * (1 << 20))\n"
        "                    f.flush()\n"
        "                    total += 1 << 20\n"
        "        except OSError:\n"
        "            pass\n"
        "print(total)\n"
    )
    with provider.start() as box:
        done = box.run(["python3", "-c", fill], timeout=8.0)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) <= TEST_LIMITS.disk_bytes
        box.run(["sh", "-c", "rm -f /dev/shm/fill* /dev/fill* /fill* /tmp/fill* fill*"])
        lock = box.run(["python3", "-c", "import multiprocessing\nmultiprocessing.Lock()\nprint('ok')"])
        assert lock.stdout == b"ok\n", lock.stderr


@root_only
def test_a_plain_process_sandbox_leaves_no_shared_files_or_ipc(tmp_path: Path) -> None:
    """Files in /dev/shm, /tmp, /var/tmp (and a world-writable folder below them) and SysV
    shared memory made by the sandbox's user are gone after close."""
    token = secrets.token_hex(6)
    shared = Path("/tmp") / f"envsdk-open-{token}"
    shared.mkdir()
    shared.chmod(0o1777)
    paths = [Path(f"/dev/shm/envsdk-{token}"), Path(f"/tmp/envsdk-{token}"), Path(f"/var/tmp/envsdk-{token}"),
             shared / "inside"]
    code = (
        "import ctypes\n"
        f"for path in {[str(p) for p in paths]!r}:\n"
        "    with open(path, 'wb') as f:\n"
        "        f.write(b'0' * (1 << 20))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "shm = libc.shmget(0, 1 << 20, 0o1600)\n"
        "assert shm >= 0, ctypes.get_errno()\n"
        "print(shm)\n"
    )
    box = ProcessProvider(TEST_LIMITS).start()
    try:
        made = box.run_python(code)
        assert made.returncode == 0, made.stderr
        segment = int(made.stdout)
        assert all(path.exists() for path in paths)
    finally:
        box.close()
        try:
            assert not any(path.exists() for path in paths)
            segments = Path("/proc/sysvipc/shm").read_text().split("\n")[1:]
            assert all(line.split()[1] != str(segment) for line in segments if line.split())
        finally:
            subprocess.run(["rm", "-rf", *map(str, paths), str(shared)], check=False)
            subprocess.run(["ipcrm", "-m", str(segment)], capture_output=True, check=False)


# ------------------------------------------------------------------ cgroups left behind


@root_only
def test_close_removes_the_sandbox_cgroups(provider: SandboxProvider) -> None:
    box = provider.start()
    try:
        assert box.slot.cgroup is not None
        paths = list(box.slot.cgroup.paths.values())
        assert paths and all(path.is_dir() for path in paths)
        box.run_python("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n")
    finally:
        box.close()
    assert not any(path.exists() for path in paths)


@root_only
def test_cgroups_of_a_killed_server_are_removed_at_the_next_start() -> None:
    """A server killed with its sandbox open leaves its cgroups; the next provider to start a
    sandbox kills what is in them and removes them."""
    script = (
        "import json, os, signal\nfrom envsdk.sandbox import ProcessProvider, SandboxLimits\n"
        "box = ProcessProvider(SandboxLimits(timeout_s=5.0)).start()\n"
        "print(json.dumps([str(p) for p in box.slot.cgroup.paths.values()]), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    dead = subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO, capture_output=True, timeout=30)
    assert dead.returncode == -signal.SIGKILL, dead.stderr[-2000:]
    orphans = [Path(p) for p in json.loads(dead.stdout)]
    # Something still in the orphan: a process the dead server's sandbox would have left.
    straggler = subprocess.Popen(["sleep", "60"])
    try:
        (orphans[0] / "cgroup.procs").write_text(str(straggler.pid))
        fresh = ProcessProvider(TEST_LIMITS)
        with fresh.start() as box:
            assert box.run(["true"]).returncode == 0
        assert straggler.wait(timeout=10) == -signal.SIGKILL
        assert not any(path.exists() for path in orphans)
        assert not any(path.parent.exists() for path in orphans)
    finally:
        straggler.kill()
        straggler.wait()
