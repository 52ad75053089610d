"""Sandbox user ids are leased host-wide: two server processes on one host never hand out the
same id, so closing one's sandbox (which kills every process of its id) never touches the
other's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from envsdk.sandbox import ProcessProvider, process_tree, user_processes
from envsdk.sandbox.base import SandboxSlot
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = pytest.mark.timeout(120)

OTHER_SERVER = textwrap.dedent(
    """
    from envsdk.sandbox import ProcessProvider
    from tests.sandbox.conftest import TEST_LIMITS
    for _ in range(3):
        sandbox = ProcessProvider(TEST_LIMITS).start()
        print(sandbox.uid, flush=True)
        sandbox.close()
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes get user ids of their own only when the server runs as root")
def test_another_server_process_never_gets_this_ones_user_id() -> None:
    with ProcessProvider(TEST_LIMITS).start() as mine:
        assert mine.run_python("x = 1").returncode == 0
        other = subprocess.run(
            [sys.executable, "-c", OTHER_SERVER], capture_output=True, text=True, timeout=90,
            cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        assert other.returncode == 0, other.stderr
        theirs = {int(line) for line in other.stdout.split()}
        assert len(theirs) >= 1 and mine.uid not in theirs
        # Their closes killed every process of their ids; this sandbox and its state live on.
        assert mine.alive and mine.run_python("print(x)").stdout == b"1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes get user ids of their own only when the server runs as root")
def test_a_user_id_is_leased_again_once_its_sandbox_closed() -> None:
    first = ProcessProvider(TEST_LIMITS).start()
    uid = first.uid
    second = ProcessProvider(TEST_LIMITS).start()
    assert second.uid != uid
    first.close()
    second.close()
    assert first.slot._lease is None and second.slot._lease is None


DIES_HOLDING = textwrap.dedent(
    """
    import os, subprocess
    from envsdk.sandbox import ProcessProvider
    from tests.sandbox.conftest import TEST_LIMITS
    sandbox = ProcessProvider(TEST_LIMITS).start()
    # A process of the sandbox's id outside its supervisor's tree, as one that escaped it.
    subprocess.Popen(["sleep", "300"], user=sandbox.uid, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(sandbox.uid, flush=True)
    os._exit(0)
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes get user ids of their own only when the server runs as root")
def test_a_user_id_left_by_a_dead_server_is_cleared_before_it_is_used_again() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", DIES_HOLDING], capture_output=True, text=True, timeout=60,
        cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert dead.returncode == 0, dead.stderr
    uid = int(dead.stdout)
    # The dead server left a process under that id.
    assert user_processes(uid)
    SandboxSlot._next = uid - SandboxSlot.BASE_UID  # the next lease tries that id first
    with ProcessProvider(TEST_LIMITS).start() as sandbox:
        assert sandbox.uid == uid
        assert set(user_processes(uid)) == {sandbox.process.pid, *process_tree(sandbox.process.pid)}
    assert user_processes(uid) == []
