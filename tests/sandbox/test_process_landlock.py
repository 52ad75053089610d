"""The plain-process provider confines its sandboxes with Landlock: host files outside /usr and
the workspace, TCP, and (when the server is not root) signals and ptrace of the server are
out of reach, checked from inside a real sandbox against real host files and sockets."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import envsdk
from envsdk.sandbox import ProcessProvider, Sandbox
from envsdk.sandbox.process import landlock_abi
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock: the process provider cannot hide host files here"),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def box() -> Iterator[Sandbox]:
    sandbox = ProcessProvider(TEST_LIMITS).start()
    try:
        yield sandbox
    finally:
        sandbox.close()


def _python(box: Sandbox, code: str) -> str:
    result = box.run_python(textwrap.dedent(code))
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_the_provider_says_what_landlock_adds() -> None:
    provider = ProcessProvider(TEST_LIMITS)
    assert provider.confined and provider.landlock == landlock_abi()
    described = provider.describe()
    assert "files outside /usr and the workspace" in described["isolates"]
    assert f"Landlock ABI {landlock_abi()}" in described["isolation"]
    assert ("tcp network" in described["isolates"]) == (landlock_abi() >= 4)


def _world_readable(path: str) -> bool:
    """Whether any user may read `path` (and pass every folder above it): then only Landlock
    can explain a refusal."""
    current = Path(path)
    if not os.stat(current).st_mode & 0o004:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in current.parents)


def test_host_files_outside_usr_and_the_workspace_cannot_be_opened(box: Sandbox) -> None:
    """The server's code, its virtual environment (where an installed task set lives) and /etc,
    each world-readable: all refused; /usr and the workspace work."""
    candidates = [str(REPO / "README.md"), envsdk.__file__, sys.prefix, "/etc/hostname", "/etc/passwd"]
    targets = [path for path in candidates if os.path.exists(path) and _world_readable(path)]
    assert "/etc/passwd" in targets, targets
    out = _python(box, f"""
        import os
        for path in {targets!r}:
            try:
                if os.path.isdir(path):
                    os.listdir(path)
                else:
                    open(path, 'rb').read()
                print('READ', path)
            except PermissionError:
                print('refused', path)
        with open('mine.txt', 'w') as f:
            f.write('ok')
        print(open('mine.txt').read(), open('/usr/lib/os-release').read().count('='))
    """)
    assert [line.split()[0] for line in out.splitlines()[:-1]] == ["refused"] * len(targets), out
    assert out.splitlines()[-1].startswith("ok ") and int(out.split()[-1]) > 0, out


def test_ordinary_programs_still_run(box: Sandbox) -> None:
    """Shell tools, subprocesses, multiprocessing (/dev/shm), /tmp and /dev/null keep working."""
    result = box.run(["sh", "-c", "echo hi > /tmp/envsdk-ll-$$ && cat /tmp/envsdk-ll-$$ && rm /tmp/envsdk-ll-$$ && ls /usr/bin | wc -l > /dev/null && echo done"])
    assert (result.returncode, result.stdout) == (0, b"hi\ndone\n"), result.stderr
    out = _python(box, """
        import multiprocessing, subprocess
        with multiprocessing.Pool(2) as pool:
            print(sum(pool.map(abs, [-1, -2, -3])))
        print(subprocess.run(['echo', 'child'], capture_output=True).stdout.decode().strip())
    """)
    assert out.split() == ["6", "child"], out


@pytest.mark.skipif(landlock_abi() < 4, reason="Landlock ABI < 4 has no network rules: TCP is open to the sandbox here")
def test_tcp_is_refused_udp_is_not(box: Sandbox) -> None:
    """TCP connect (to a listening host socket) and bind fail with EACCES; UDP is not covered
    by Landlock: the README lists it as what the provider cannot stop, and this pins it."""
    listener = socket.create_server(("127.0.0.1", 0))
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    try:
        out = _python(box, f"""
            import socket
            for what in ('connect', 'bind'):
                s = socket.socket()
                try:
                    s.connect(('127.0.0.1', {listener.getsockname()[1]})) if what == 'connect' else s.bind(('127.0.0.1', 0))
                    print(what, 'ok')
                except PermissionError:
                    print(what, 'refused')
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b'udp', ('127.0.0.1', {receiver.getsockname()[1]}))
        """)
        assert out.splitlines() == ["connect refused", "bind refused"], out
        assert receiver.recv(16) == b"udp"
    finally:
        listener.close()
        receiver.close()


_NOT_ROOT_SERVER = """
import ctypes, os, sys
from envsdk.sandbox.process import ProcessProvider
box = ProcessProvider().start()
assert box.uid is None
pid = os.getpid()
code = '''
import ctypes, os
pid = %d
for what, attempt in (("signal", lambda: os.kill(pid, 0)), ("mem", lambda: open(f"/proc/{pid}/mem", "rb")),
                      ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())):
    try:
        attempt()
        print(what, "ok")
    except OSError as exc:
        print(what, "refused", exc.errno)
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", "ok" if libc.ptrace(16, pid, 0, 0) == 0 else "refused")
''' % pid
result = box.run_python(code)
box.close()
sys.stdout.write(result.stdout.decode() + result.stderr.decode())
"""


@pytest.mark.skipif(landlock_abi() < 6, reason="Landlock ABI < 6 has no signal scope: a server not run as root can be signalled by its sandboxes here")
def test_a_server_not_run_as_root_cannot_be_signalled_or_traced() -> None:
    """Not root, the sandbox runs as the server's own user: only Landlock stands between them.
    Without it a sandbox attaches ptrace to the server (which stops it) and reads its memory."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a server as another user")
    python = Path("/usr/bin/python3")
    site = Path(pytest.__file__).resolve().parents[1]
    if f"{sys.version_info.major}.{sys.version_info.minor}" not in str(site) or not python.exists():
        pytest.skip(f"the host's /usr/bin/python3 cannot import this environment's packages ({site})")
    check = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(python), "-c", "import envsdk, pydantic"],
        env={"PYTHONPATH": f"{REPO}:{site}", "HOME": "/", "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=60,
    )
    if check.returncode != 0:
        pytest.skip(f"user 65534 cannot import envsdk from this checkout: {check.stderr.decode()[-200:]}")
    result = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(python), "-c", _NOT_ROOT_SERVER],
        env={"PYTHONPATH": f"{REPO}:{site}", "HOME": "/", "PATH": "/usr/bin:/bin"},
        capture_output=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert [line.split()[:2] for line in lines] == [["signal", "refused"], ["mem", "refused"], ["environ", "refused"],
                                                     ["ptrace", "refused"]], lines
