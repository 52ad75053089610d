"""The sandbox layer on both providers: runs, the persistent interpreter, files, limits, reaping."""

from __future__ import annotations

import time

import pytest

from envsdk.sandbox import (
    ProcessProvider,
    Sandbox,
    SandboxClosed,
    SandboxDied,
    SandboxLimits,
    SandboxPathError,
    SandboxPool,
    SandboxProvider,
)
from tests.sandbox.conftest import TEST_LIMITS, processes_of, provider_named

pytestmark = pytest.mark.timeout(90)


def test_run_answers_like_subprocess(provider: SandboxProvider) -> None:
    with provider.start() as box:
        done = box.run(["python3", "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(3)"], input=b"hi")
        assert (done.returncode, done.stdout, done.timed_out) == (3, b"HI\n", False)
        missing = box.run(["no-such-command"])
    assert missing.returncode != 0


def test_interpreter_keeps_names_between_snippets(provider: SandboxProvider) -> None:
    with provider.start() as box:
        assert box.run_python("x = 41").returncode == 0
        assert box.run_python("print(x + 1)").stdout == b"42\n"
        failed = box.run_python("1 / 0")
        assert failed.returncode == 1 and b"ZeroDivisionError" in failed.stderr
        assert box.run_python("import sys; sys.exit(7)").returncode == 7
        assert box.run_python("print(x)").stdout == b"41\n"


def test_snippet_past_its_deadline_is_killed_and_the_interpreter_restarts(provider: SandboxProvider) -> None:
    with provider.start() as box:
        box.run_python("x = 1")
        started = time.monotonic()
        hung = box.run_python("while True: pass", timeout=1.0)
        assert hung.timed_out and hung.returncode == -9 and "restarted" in hung.note
        assert time.monotonic() - started < 1.0 + 3.0
        after = box.run_python("print('x' in globals())")
        assert after.stdout == b"False\n" and after.restarted


def test_files_stay_inside_the_workspace(provider: SandboxProvider) -> None:
    with provider.start() as box:
        box.write_file("a/b.txt", b"hello")
        assert box.read_file("a/b.txt") == b"hello"
        assert box.run(["cat", "a/b.txt"]).stdout == b"hello"
        for bad in ("../escape.txt", "/etc/passwd", "a/../../x"):
            with pytest.raises(SandboxPathError):
                box.write_file(bad, b"x")
        box.run(["ln", "-s", "/etc/hostname", "link"])
        with pytest.raises(SandboxPathError):
            box.read_file("link")


def test_output_is_capped_and_counted(provider: SandboxProvider) -> None:
    cap = TEST_LIMITS.output_bytes
    with provider.start() as box:
        loud = box.run_python(f"import sys\nfor _ in range(8): sys.stdout.write('x' * {cap})")
        flood = box.run(["python3", "-c", f"import sys\nwhile True: sys.stdout.write('x' * {cap})"])
    assert (loud.returncode, len(loud.stdout), loud.stdout_bytes, loud.truncated) == (0, cap, 8 * cap, True)
    # Past 16 times the cap the run is killed rather than read for nothing.
    assert flood.returncode == -9 and not flood.timed_out and "output limit" in flood.note
    assert len(flood.stdout) == cap and 16 * cap < flood.stdout_bytes < 64 * cap


def test_close_reaps_every_process_and_file(provider: SandboxProvider) -> None:
    box = provider.start()
    # A daemonised grandchild, started by a command that returns at once.
    box.run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)\n    os._exit(0)\nos.wait()"
    )
    workspace = box.slot.workspace
    assert processes_of(box.uid, box.pid)
    box.close()
    box.close()  # idempotent
    assert gone(box)
    assert workspace is None or not workspace.exists()
    with pytest.raises(SandboxClosed):
        box.run(["true"])


def test_a_killed_agent_is_a_typed_error_and_the_sandbox_is_reaped(provider: SandboxProvider) -> None:
    box = provider.start()
    with pytest.raises(SandboxDied):
        box.run(["sh", "-c", "kill -9 $PPID"])
    assert not box.alive
    assert gone(box)


def gone(box: Sandbox, within_s: float = 10.0) -> bool:
    """Whether every process of `box` is gone within `within_s` (the kernel reaps a PID
    namespace's processes asynchronously)."""
    deadline = time.monotonic() + within_s
    while processes_of(box.uid, box.pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="cpu_s"):
        SandboxLimits(cpu_s=0)


def test_warm_pool_hands_out_started_sandboxes() -> None:
    pool = SandboxPool(provider_named("bubblewrap"), warm=2)
    try:
        deadline = time.monotonic() + 30
        while pool.ready < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.ready == 2
        started = time.monotonic()
        box = pool.take()
        took = time.monotonic() - started
        with box:
            assert box.run_python("print(1)").stdout == b"1\n"
        assert pool.taken_warm == 1 and took < 0.05
    finally:
        pool.close()
    assert pool.ready == 0


def test_process_provider_says_it_is_weaker() -> None:
    described = ProcessProvider().describe()
    assert described["isolation"].startswith("weaker")
    assert "network" not in described["isolates"]
