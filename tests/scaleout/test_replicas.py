"""``envsdk serve … --replicas N``: N real server processes, a replicas file a pool reads,
restart of a replica that dies, and a clean stop of them all on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.client import EnvPool
from envsdk.server.replicas import without_options

from .test_pool import active_sessions


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    urls_file = tmp_path / "urls.json"
    log = (tmp_path / "supervisor.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment",
            "--replicas", "2", "--replicas-file", str(urls_file), "--log-level", "warning",
            "--max-concurrent-envs", "4",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    pids: set[int] = set()
    try:
        _wait_for(lambda: urls_file.exists() or proc.poll() is not None, 60, "the replicas file")
        assert proc.poll() is None, (tmp_path / "supervisor.log").read_text()
        pids.update(r["pid"] for r in _read(urls_file)["replicas"])
        yield proc, urls_file
        if urls_file.exists():
            pids.update(r["pid"] for r in _read(urls_file)["replicas"])
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        for pid in pids:  # a failed test must not leave servers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()


def test_without_options_drops_the_supervisors_own_flags_in_both_spellings():
    argv = ["serve", "m:E", "--replicas", "3", "--port=9000", "--log-level", "warning", "--replicas-file=f", "--host", "h"]
    assert without_options(argv) == ["serve", "m:E", "--log-level", "warning"]


@pytest.mark.timeout(120)
async def test_replicas_serve_a_pool_restart_a_dead_replica_and_all_stop_on_sigterm(supervisor):
    proc, urls_file = supervisor
    first = _read(urls_file)
    urls = first["base_urls"]
    assert len(urls) == 2 and len(set(urls)) == 2
    pool = EnvPool(str(urls_file))
    clients = [await pool.acquire() for _ in range(2)]
    try:
        assert {c.base_url for c in clients} == set(urls)
        for c in clients:
            await c.reset()
            result = await c.step({"message": c.base_url})
            assert result.observation["echoed_message"] == c.base_url
        # The supervisor's other flags reached every replica: each holds 4 sessions at most.
        assert [s.max_sessions for s in pool.servers()] == [4, 4]
    finally:
        for c in clients:
            await c.close()

    victim = first["replicas"][0]
    os.kill(victim["pid"], signal.SIGKILL)
    _wait_for(lambda: _read(urls_file)["replicas"][0]["restarts"] == 1, 60, "the replica's restart")
    restarted = _read(urls_file)["replicas"][0]
    assert restarted["base_url"] == victim["base_url"] and restarted["pid"] != victim["pid"]
    assert active_sessions(victim["base_url"]) == 0  # a fresh process answers on the same port

    pids = [r["pid"] for r in _read(urls_file)["replicas"]]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143  # as a single server exits after SIGTERM
    assert not urls_file.exists()  # no pool reads stale URLs after a stop
    _wait_for(lambda: not any(_alive(p) for p in pids), 10, "every replica to exit")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["a folder", "a missing folder"])
def test_a_replicas_file_that_cannot_be_written_is_refused_before_any_replica_starts(tmp_path: Path, where: str) -> None:
    """Found once the replicas ran, it was a traceback (IsADirectoryError, FileNotFoundError) and
    left both replicas serving, orphaned, with a stray ``.tmp`` beside the path."""
    from envsdk.testing import free_ports

    target = tmp_path / "urls"
    if where == "a folder":
        target.mkdir()
    else:
        target = tmp_path / "nope" / "urls.json"
    port = free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment", "--port", str(port),
         "--replicas", "2", "--replicas-file", str(target), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=120)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
        assert str(target) in lines[0]
        assert not list(tmp_path.rglob("*.tmp"))
        assert not _replicas_on(port), "a replica outlived its supervisor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for replica in _replicas_on(port):  # each in a session of its own: not in the group above
            replica.kill()


@contextlib.contextmanager
def supervisor_process(
    urls_file: Path, *options: str, target: str = "envsdk.testing:EchoEnvironment",
    env: dict[str, str] | None = None, output: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], list[dict[str, Any]]]]:
    """`envsdk serve TARGET --replicas 2` writing `urls_file`, once the file is there: (the
    supervisor, the replicas it lists); its environment `env` (else this process's), its output
    to file `output` (else nowhere). Whatever is left of either is killed on the way out."""
    with contextlib.ExitStack() as files:
        sink = files.enter_context(output.open("wb")) if output is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, "-m", "envsdk.cli", "serve", target, *options,
             "--replicas", "2", "--replicas-file", str(urls_file), "--log-level", "warning"],
            env=env, stdout=sink, stderr=subprocess.STDOUT if output is not None else subprocess.DEVNULL,
        )
    pids: list[int] = []
    try:
        _wait_for(lambda: urls_file.exists() or proc.poll() is not None, 60, "the replicas file")
        assert proc.poll() is None, output.read_text() if output is not None else "the supervisor exited while starting"
        replicas = _read(urls_file)["replicas"]
        pids = [r["pid"] for r in replicas]
        yield proc, replicas
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pid in pids:  # each in a session of its own: killed one by one
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_supervisor(proc: subprocess.Popen[bytes], replicas: list[dict[str, Any]]) -> None:
    """SIGKILL the supervisor (it stops nothing itself), then wait for its replicas to exit."""
    proc.kill()
    proc.wait(timeout=10)
    _wait_for(lambda: not any(_alive(r["pid"]) for r in replicas), 10, "the orphaned replicas to exit")


@pytest.mark.timeout(120)
def test_replicas_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """A supervisor killed with SIGKILL stops nothing itself; its replicas (each in a session of
    its own, so no signal to its group reaches them) went on serving as orphans."""
    with supervisor_process(tmp_path / "urls.json") as (proc, replicas):
        assert len(replicas) == 2 and all(_health(r["base_url"]) for r in replicas)
        kill_supervisor(proc, replicas)
        assert not any(_health(r["base_url"]) for r in replicas)


def _health(base_url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _replicas_on(port: int) -> list[Any]:
    import psutil

    ports = {f"--port {port}", f"--port {port + 1}"}
    found = []
    for candidate in psutil.process_iter(["cmdline"]):
        line = " ".join(candidate.info["cmdline"] or [])
        if "EchoEnvironment" in line and any(line.endswith(p) or f"{p} " in line for p in ports):
            found.append(candidate)
    return found


def _start_supervisor(port: int, urls_file: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment", "--port", str(port),
             "--replicas", "2", "--replicas-file", str(urls_file), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT,
        )


def _time_wait_on(port: int) -> bool:
    import psutil

    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_TIME_WAIT
        for c in psutil.net_connections(kind="tcp4")
    )


def _stop_all(procs: list[subprocess.Popen[bytes]], pids: set[int]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    for pid in pids:  # each replica in a session of its own: killed one by one
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_replicas_restart_at_once_on_the_ports_they_just_served(tmp_path: Path) -> None:
    """The supervisor checked its ports with a bind without SO_REUSEADDR (uvicorn binds with
    it): for a minute after a stop, the TIME-WAIT left by the replicas' served connections made
    it refuse the same ports ("ports [...] are in use"), exit 2."""
    from envsdk.testing import free_ports

    port = free_ports(2)
    urls_file, log = tmp_path / "urls.json", tmp_path / "supervisor.log"
    procs: list[subprocess.Popen[bytes]] = []
    pids: set[int] = set()
    try:
        procs.append(_start_supervisor(port, urls_file, log))
        _wait_for(lambda: urls_file.exists() or procs[0].poll() is not None, 60, "the replicas file")
        assert procs[0].poll() is None, log.read_text()[-2000:]
        replicas = _read(urls_file)["replicas"]
        pids.update(r["pid"] for r in replicas)
        # A kept-alive connection to each replica, which the replica closes first as it stops:
        # its end (not the client's) lingers in TIME-WAIT once the client's end closes too.
        held = []
        for replica in replicas:
            connection = socket.create_connection(("127.0.0.1", int(replica["base_url"].rsplit(":", 1)[1])), timeout=5)
            held.append(connection)
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert connection.recv(4096).startswith(b"HTTP/1.1 200")
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in pids), 10, "every replica to exit")
        for connection in held:  # read to the server's end first: unread bytes make a close a reset
            while connection.recv(4096):
                pass
            connection.close()
        _wait_for(lambda: _time_wait_on(port), 10, "a TIME-WAIT on the first replica's port (else the test proves nothing)")

        procs.append(_start_supervisor(port, urls_file, log))
        _wait_for(lambda: urls_file.exists() or procs[1].poll() is not None, 60, "the restarted replicas file")
        assert procs[1].poll() is None, log.read_text()[-2000:]
        replicas = _read(urls_file)["replicas"]
        pids.update(r["pid"] for r in replicas)
        assert [r["base_url"] for r in replicas] == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        assert all(_health(r["base_url"]) for r in replicas)
    finally:
        _stop_all(procs, pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("signame", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_the_supervisor_exits_as_an_interrupted_program_after_stopping_its_replicas(
    tmp_path: Path, signame: str, status: int
) -> None:
    """The supervisor exited 0 on SIGTERM and SIGINT, where a single server exits 143 and 130
    (README, "Graceful shutdown"): a job runner could not tell a stop from a finished run."""
    urls_file, log = tmp_path / "urls.json", tmp_path / "supervisor.log"
    procs: list[subprocess.Popen[bytes]] = []
    pids: set[int] = set()
    try:
        from envsdk.testing import free_ports

        procs.append(_start_supervisor(free_ports(2), urls_file, log))
        _wait_for(lambda: urls_file.exists() or procs[0].poll() is not None, 60, "the replicas file")
        assert procs[0].poll() is None, log.read_text()[-2000:]
        replicas = _read(urls_file)["replicas"]
        pids.update(r["pid"] for r in replicas)
        procs[0].send_signal(getattr(signal, signame))
        assert procs[0].wait(timeout=30) == status, log.read_text()[-2000:]
        assert not urls_file.exists()
        _wait_for(lambda: not any(_alive(p) for p in pids), 10, "every replica to exit")
        assert not any(_health(r["base_url"]) for r in replicas)
        assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
    finally:
        _stop_all(procs, pids)


def test_envsdk_serve_refuses_replicas_whose_ports_would_pass_65535() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment", "--port", "65535",
         "--replicas", "2"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--replicas 2" in lines[0] and "--port 65535" in lines[0], lines[0]


@pytest.mark.timeout(120)
def test_a_supervisor_whose_stdout_cannot_be_written_keeps_serving(tmp_path: Path) -> None:
    """``serve --replicas 2 > /dev/full``: printing the replicas' URLs failed, and the supervisor
    stopped its replicas and died with a traceback. The URLs are in the replicas file; the
    fleet serves on, and stops on SIGTERM with the status a stopped server has."""
    from envsdk.testing import free_ports

    urls_file, log = tmp_path / "urls.json", tmp_path / "supervisor.log"
    procs: list[subprocess.Popen[bytes]] = []
    pids: set[int] = set()
    try:
        with open("/dev/full", "wb") as full, log.open("ab") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment", "--port",
                 str(free_ports(2)), "--replicas", "2", "--replicas-file", str(urls_file), "--log-level", "warning"],
                stdout=full, stderr=err,
            ))
        _wait_for(lambda: urls_file.exists() or procs[0].poll() is not None, 60, "the replicas file")
        replicas = _read(urls_file)["replicas"]
        pids.update(r["pid"] for r in replicas)
        time.sleep(2)  # the URLs have been printed (the supervisor prints them once it wrote the file)
        assert procs[0].poll() is None, log.read_text()[-2000:]
        assert all(_health(r["base_url"]) for r in replicas)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=30) == 143, log.read_text()[-2000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
        _wait_for(lambda: not any(_alive(p) for p in pids), 10, "every replica to exit")
    finally:
        _stop_all(procs, pids)


@pytest.mark.timeout(120)
def test_replicas_whose_stdout_is_closed_serve(tmp_path: Path) -> None:
    """``--replicas 2 >&-``: every replica died at start in uvicorn's log formatter (its
    sys.stdout is None), was restarted and died again, until the supervisor gave up."""
    urls_file = tmp_path / "urls.json"
    with (tmp_path / "supervisor.log").open("wb") as log:
        proc = subprocess.Popen(
            ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "envsdk.cli", "serve",
             "envsdk.testing:EchoEnvironment", "--replicas", "2", "--replicas-file", str(urls_file)],
            stderr=log,
        )
    pids: set[int] = set()
    try:
        _wait_for(lambda: urls_file.exists() or proc.poll() is not None, 60, "the replicas file")
        assert proc.poll() is None, (tmp_path / "supervisor.log").read_text()
        replicas = _read(urls_file)["replicas"]
        pids.update(r["pid"] for r in replicas)
        assert all(_health(r["base_url"]) for r in replicas)
        time.sleep(1)
        assert [r["restarts"] for r in _read(urls_file)["replicas"]] == [0, 0]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in (tmp_path / "supervisor.log").read_text()
