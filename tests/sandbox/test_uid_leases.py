"""Sandbox user ids are leased host-wide: two server processes on one host never hand out the
same id, so closing one's sandbox (which kills every process of its id) never touches the
other's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from envsdk.sandbox import ProcessProvider
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
