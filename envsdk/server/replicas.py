"""Several server processes on one machine: ``envsdk serve … --replicas N`` and
``python -m servers.sudoku --replicas N``.

`ReplicaSet` starts N server processes on N ports (consecutive from a first port, or free ones),
waits until each answers ``GET /health``, writes their base URLs where an `EnvPool` reads them
(``--replicas-file``: JSON ``{"base_urls": [...], "replicas": [{index, base_url, pid,
restarts}], "supervisor_pid": …}``), and restarts a replica whose process exits, on the same
port, at most ``max_restarts`` times each. `serve_replicas` runs one until SIGINT or SIGTERM,
then stops every replica as a single server stops: each gets SIGTERM and drains (requests in
flight are answered within its ``drain_timeout_s``, then its envs are closed), and only a
replica still running past that bound (plus its env closes and a margin) is killed; a second
SIGINT stops waiting, as it does for a server. Then the file is removed.
On Linux a replica also gets SIGTERM from the kernel when its supervisor dies any other way
(``kill -9``, a crash), so none is left serving as an orphan.

One server process holds thousands of sessions; replicas are for environments whose steps need
CPU (one core per replica) and for fault isolation. Past one machine, use `envsdk.ray`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from envsdk._process import flush_out, print_out
from envsdk.server.config import DEFAULT_DEADLINES_S, ServerConfig, positive_int
from envsdk.server.launch import PortInUseError, ensure_port_free

__all__ = [
    "ReplicaSet",
    "Replica",
    "ReplicaStartError",
    "serve_replicas",
    "replica_ports",
    "without_options",
    "write_replicas_file",
    "ReplicaCommand",
    "REPLICA_OPTIONS",
    "add_replica_arguments",
    "check_replicas_file",
    "MAX_REPLICAS",
    "replica_count",
    "STOP_MARGIN_S",
    "HURRY_GRACE_S",
]

logger = logging.getLogger("envsdk.server.replicas")

#: The command line of replica ``index`` listening on ``port`` (``sys.executable -m …``).
ReplicaCommand = Callable[[int], Sequence[str]]


#: The options a supervisor consumes (or sets per replica) and does not pass on to its replicas.
REPLICA_OPTIONS = ("--replicas", "--replicas-file", "--host", "--port")


#: The most replicas one supervisor runs. Each is a server process (with game workers of its
#: own) meant to have a core to itself; past this many, spread them over machines (`envsdk.ray`).
MAX_REPLICAS = 64


#: How long past a replica's own shutdown bound (its drain timeout, then the deadline of its env
#: closes) the supervisor waits before it kills the replica: the time a busy machine may take
#: to tear down a Python process.
STOP_MARGIN_S = 5.0

#: How long the replicas get to exit after a second SIGINT (which ends their drains at once)
#: before they are killed.
HURRY_GRACE_S = 3.0


def replica_count(text: str) -> int:
    """argparse type of ``--replicas``: an integer from 1 to `MAX_REPLICAS`."""
    value = positive_int(text)
    if value > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"at most {MAX_REPLICAS} replicas (each is a server process), got {value}")
    return value


def add_replica_arguments(parser: argparse.ArgumentParser, *, ports: str) -> None:
    """Add ``--replicas N`` and ``--replicas-file F`` (the `REPLICA_OPTIONS` a supervisor
    consumes) to a server's argparse parser; `ports` says where the replicas listen."""

    parser.add_argument(
        "--replicas", type=replica_count, default=1,
        help=f"run N server processes on {ports}, restarted when they die; prints their base "
        f"URLs (default 1: this process serves, no supervisor; at most {MAX_REPLICAS}: each is a "
        "process meant to have a core to itself, past that use envsdk.ray over machines)",
    )
    parser.add_argument(
        "--replicas-file", default=None,
        help="write the replicas' base URLs to this JSON file, where an EnvPool reads them",
    )


def without_options(argv: Sequence[str], options: Sequence[str] = REPLICA_OPTIONS) -> list[str]:
    """`argv` without each of `options` and its value (``--opt value`` or ``--opt=value``):
    a supervisor's command line turned into its replicas' (which get their own host and port)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in options:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


class ReplicaStartError(RuntimeError):
    """A replica did not answer ``/health`` in time, or its process exited while starting."""


@dataclass
class Replica:
    """One server process of a `ReplicaSet`; ``restarts`` counts the restarts done so far."""

    index: int
    port: int
    base_url: str
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    failed: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _port_taken(host: str, port: int) -> bool:
    try:
        ensure_port_free(host, port)  # the single server's check: TIME-WAIT leaves a port free
    except PortInUseError:
        return True
    return False


def replica_ports(n: int, *, host: str = "127.0.0.1", first_port: int | None = None) -> list[int]:
    """``n`` ports: ``first_port … first_port + n - 1`` (each must be free), or ``n`` distinct
    free ports chosen by the OS when ``first_port`` is None or 0. `ValueError` when the ports
    would pass 65535."""
    if n < 1:
        raise ValueError(f"replicas must be >= 1, got {n}")
    bind_host = "0.0.0.0" if host in ("0.0.0.0", "::", "") else "127.0.0.1"
    if first_port:
        if first_port + n - 1 > 65535:
            raise ValueError(
                f"--replicas {n} from --port {first_port} would use ports up to {first_port + n - 1}, "
                "past 65535: pick a lower --port or fewer --replicas"
            )
        ports = list(range(first_port, first_port + n))
        taken = [p for p in ports if _port_taken(bind_host, p)]
        if taken:
            raise ReplicaStartError(
                f"ports {taken} are in use; pick another --port (replicas use {first_port}..{first_port + n - 1})"
            )
        return ports
    socks = []
    try:
        for _ in range(n):  # held open together so the OS gives n distinct ports
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((bind_host, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _public_host(host: str) -> str:
    """The host name clients use for a server bound to `host` (all interfaces: this machine's
    fully qualified name)."""
    if host in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return host


def _kill_leftovers(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of an exited replica's process group: the worker processes of a
    replica that crashed (or was killed) would otherwise outlive it as orphans."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


#: prctl(2)'s option that names the signal a process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the child gets SIGTERM when the thread that forked it ends
    (Linux's parent-death signal; the new program keeps it), or None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the signal was armed: none will come
            os._exit(1)

    return arm


class _Spawner:
    """Starts processes from one thread of its own that ends at `close`: the parent-death signal
    comes when the *thread* that forked a child ends, so a replica started (or restarted) from a
    short-lived thread would be stopped with it."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], concurrent.futures.Future[subprocess.Popen[bytes]]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="envsdk-replicas-spawner", daemon=True)
        self._thread.start()

    def popen(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv)`` in a session of its own; on Linux it gets SIGTERM when this
        process dies."""
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        arm = _die_with_parent()

        def start() -> subprocess.Popen[bytes]:
            # PLW1509: `arm` calls a prctl looked up beforehand and getppid, and takes no lock
            # another thread could hold across the fork.
            return subprocess.Popen(list(argv), env=env, start_new_session=True, preexec_fn=arm)  # noqa: PLW1509

        self._requests.put((start, done))
        return done.result()

    def close(self) -> None:
        """End the thread (the processes it started that still run get their parent-death signal)."""
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            start, done = request
            try:
                done.set_result(start())
            except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread, by popen
                done.set_exception(exc)


def check_replicas_file(path: Path) -> None:
    """`ValueError` for a replicas file that cannot be written, said before any replica starts
    (found once they ran, it left them serving after the supervisor's traceback)."""
    if path.is_dir():
        raise ValueError(f"the replicas file {path} is a folder: name a file in it")
    if not path.parent.is_dir():
        raise ValueError(f"the replicas file {path} is in a folder that does not exist ({path.parent})")


def write_replicas_file(path: Path, description: Mapping[str, object]) -> None:
    """Write `description` (``{"base_urls": [...], "replicas": [...], …}``) to the replicas file
    `path` as JSON, whole then renamed, so that a pool reading it never sees half a file;
    `ReplicaStartError` when it cannot be written."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReplicaStartError(f"cannot write the replicas file {path}: {exc.strerror or exc}") from None


def _health_ok(port: int, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


class ReplicaSet:
    """N server processes made by ``command(port)``, watched and restarted; see the module
    docstring.

    Use as a context manager (`start` on enter, `stop` on exit) or call them yourself. The
    monitor thread checks every ``monitor_interval_s``; a replica that exits is restarted on its
    port after ``restart_delay_s``; after ``max_restarts`` restarts it is given up (logged, and
    dropped from ``base_urls`` and the replicas file). ``env`` is added to the replicas'
    environment.

    ``drain_timeout_s`` is the replicas' own drain timeout (`ServerConfig.drain_timeout_s`;
    None: its default, which the CLIs' servers use): `stop` waits that long, plus the deadline
    of the env closes that follow and `STOP_MARGIN_S`, for the replicas to exit on their own.
    """

    def __init__(
        self,
        command: ReplicaCommand,
        n: int,
        *,
        host: str = "127.0.0.1",
        first_port: int | None = None,
        replicas_file: str | Path | None = None,
        max_restarts: int = 5,
        startup_timeout_s: float = 60.0,
        monitor_interval_s: float = 0.5,
        restart_delay_s: float = 0.5,
        drain_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if drain_timeout_s is None:
            drain_timeout_s = float(ServerConfig.model_fields["drain_timeout_s"].default)
        if drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {drain_timeout_s}")
        self.command = command
        self.host = host
        self.replicas_file = Path(replicas_file) if replicas_file is not None else None
        self.max_restarts = max_restarts
        self.startup_timeout_s = startup_timeout_s
        self.monitor_interval_s = monitor_interval_s
        self.restart_delay_s = restart_delay_s
        self.drain_timeout_s = drain_timeout_s
        #: How long `stop` waits for the replicas to exit before it kills them: what a single
        #: server takes at most to stop (drain, then env closes), plus a margin.
        self.stop_timeout_s = drain_timeout_s + DEFAULT_DEADLINES_S["close"] + STOP_MARGIN_S
        self.env = {**os.environ, **(env or {})}
        public = _public_host(host)
        self.replicas = [
            Replica(index=i, port=p, base_url=f"http://{public}:{p}")
            for i, p in enumerate(replica_ports(n, host=host, first_port=first_port))
        ]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._hurried = threading.Event()
        self._hurry_deadline = math.inf
        self._monitor: threading.Thread | None = None
        self._spawner: _Spawner | None = None

    # ------------------------------------------------------------ views

    @property
    def base_urls(self) -> list[str]:
        """The base URLs of the replicas not given up."""
        return [r.base_url for r in self.replicas if not r.failed]

    def describe(self) -> dict[str, object]:
        """What the replicas file holds."""
        return {
            "base_urls": self.base_urls,
            "replicas": [
                {"index": r.index, "base_url": r.base_url, "pid": r.pid, "restarts": r.restarts}
                for r in self.replicas
                if not r.failed
            ],
            "supervisor_pid": os.getpid(),
        }

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> ReplicaSet:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> list[str]:
        """Start every replica, wait until all answer ``/health``, write the replicas file and
        start the monitor. Returns the base URLs. On a failed start every replica is stopped
        and `ReplicaStartError` raised."""
        self._check_file()
        self._spawner = _Spawner()
        try:
            for replica in self.replicas:
                self._spawn(replica)
            deadline = time.monotonic() + self.startup_timeout_s
            for replica in self.replicas:
                self._wait_healthy(replica, deadline)
            self._write_file()
        except BaseException:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._watch, name="envsdk-replicas", daemon=True)
        self._monitor.start()
        return self.base_urls

    def stop(self) -> None:
        """Stop the monitor and every replica, as a single server stops: SIGTERM to each, so
        that it drains (its requests in flight are answered, then its envs closed), then SIGKILL
        to one still running ``stop_timeout_s`` later, or `HURRY_GRACE_S` after `hurry`. Removes
        the replicas file. Idempotent."""
        self._stopping.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=self.monitor_interval_s + self.startup_timeout_s)
        with self._lock:
            started = [(r, r.process) for r in self.replicas if r.process is not None]
            for _, proc in started:
                if proc.poll() is None:
                    proc.terminate()
            deadline = time.monotonic() + self.stop_timeout_s
            for replica, proc in started:
                self._wait_stopped(replica, proc, deadline)
            if self._spawner is not None:
                self._spawner.close()
        if self.replicas_file is not None:
            self.replicas_file.unlink(missing_ok=True)

    def hurry(self) -> None:
        """Stop waiting for the replicas' drains (a second Ctrl-C): each still running gets
        SIGINT, which ends its drain as a second SIGINT ends a server's, and `stop` kills those
        left `HURRY_GRACE_S` later. Safe to call from a signal handler while `stop` runs."""
        if self._hurried.is_set():
            return
        self._hurry_deadline = time.monotonic() + HURRY_GRACE_S
        self._hurried.set()
        for replica in self.replicas:
            proc = replica.process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)

    def check(self) -> list[int]:
        """One monitor round: restart replicas whose process exited (within their restart
        budget). Returns the indices restarted."""
        restarted = []
        for replica in self.replicas:
            if self._stopping.is_set():
                break
            proc = replica.process
            if replica.failed or proc is None or proc.poll() is None:
                continue
            with self._lock:
                if self._stopping.is_set():
                    break
                _kill_leftovers(proc)
                if replica.restarts >= self.max_restarts:
                    replica.failed = True
                    logger.error(
                        "replica %d (%s) exited with %s and used its %d restarts; giving up on it",
                        replica.index, replica.base_url, proc.returncode, self.max_restarts,
                    )
                    self._write_file()
                    continue
                replica.restarts += 1
                logger.warning(
                    "replica %d (%s) exited with %s; restart %d of %d",
                    replica.index, replica.base_url, proc.returncode, replica.restarts, self.max_restarts,
                )
                time.sleep(self.restart_delay_s)
                self._spawn(replica)
            try:
                self._wait_healthy(replica, time.monotonic() + self.startup_timeout_s)
            except ReplicaStartError as exc:
                logger.warning("%s", exc)  # the next round sees it exited (or kills a hung one)
                if replica.process is not None and replica.process.poll() is None:
                    replica.process.kill()
                    replica.process.wait(timeout=5)
                continue
            with self._lock:
                self._write_file()
            restarted.append(replica.index)
        return restarted

    # ------------------------------------------------------------ internals

    def _spawn(self, replica: Replica) -> None:
        argv = list(self.command(replica.port))
        # A session (and process group) of its own: a Ctrl-C in the terminal reaches the
        # supervisor only, which then stops the replicas itself (instead of racing its monitor
        # restarting them), and the group lets it kill what a dead replica left behind.
        assert self._spawner is not None, "start() the set first"
        replica.process = self._spawner.popen(argv, self.env)

    def _wait_stopped(self, replica: Replica, proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Wait until `proc` (`replica`'s, sent SIGTERM) exits; SIGKILL it past `deadline`, or
        past the grace `hurry` gave."""
        while proc.poll() is None:
            now = time.monotonic()
            until = min(deadline, self._hurry_deadline)
            if now >= until:
                why = (
                    "after a second interrupt" if until < deadline
                    else f"{self.stop_timeout_s:g} s after SIGTERM (its drain timeout: {self.drain_timeout_s:g} s)"
                )
                logger.warning("replica %d (%s) was still running %s; killed", replica.index, replica.base_url, why)
                proc.kill()
                proc.wait(timeout=5)
                break
            time.sleep(min(0.1, until - now))
        _kill_leftovers(proc)

    def _wait_healthy(self, replica: Replica, deadline: float) -> None:
        proc = replica.process
        assert proc is not None
        while not _health_ok(replica.port, timeout=1.0):
            if proc.poll() is not None:
                raise ReplicaStartError(
                    f"replica {replica.index} on port {replica.port} exited with {proc.returncode} while starting"
                )
            if time.monotonic() > deadline or self._stopping.is_set():
                raise ReplicaStartError(
                    f"replica {replica.index} on port {replica.port} did not answer /health "
                    f"within {self.startup_timeout_s} s"
                )
            time.sleep(0.1)

    def _check_file(self) -> None:
        if self.replicas_file is not None:
            check_replicas_file(self.replicas_file)

    def _write_file(self) -> None:
        if self.replicas_file is not None:
            write_replicas_file(self.replicas_file, self.describe())

    def _watch(self) -> None:
        while not self._stopping.wait(self.monitor_interval_s):
            self.check()


def serve_replicas(
    command: ReplicaCommand,
    n: int,
    *,
    host: str = "127.0.0.1",
    first_port: int | None = None,
    replicas_file: str | Path | None = None,
    max_restarts: int = 5,
    drain_timeout_s: float | None = None,
) -> int:
    """Run N replicas until SIGINT/SIGTERM (the CLIs' ``--replicas N``); print their base URLs
    (one line each, then one JSON line ``{"base_urls": [...]}``). Then stop them as a single
    server stops (`ReplicaSet.stop`: each drains within ``drain_timeout_s``, its servers'
    drain timeout, None for the default); a second SIGINT stops waiting (`ReplicaSet.hurry`),
    a second SIGTERM changes nothing, as for a server. Returns the exit status: 130 after
    SIGINT and 143 after SIGTERM, once every replica stopped (as a single server exits), 1 when
    every replica was given up, 2 when they could not be started."""
    stop = threading.Event()
    received: list[int] = []
    started: list[ReplicaSet] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if received and signum == signal.SIGINT and started:
            started[0].hurry()
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            replicas = ReplicaSet(
                command, n, host=host, first_port=first_port, replicas_file=replicas_file,
                max_restarts=max_restarts, drain_timeout_s=drain_timeout_s,
            )
            started.append(replicas)
            urls = replicas.start()
        except (ReplicaStartError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            # For scripts; a standard output nobody can read does not stop the fleet (the
            # replicas file, when one is given, has the URLs too).
            for url in urls:
                print_out(url)
            print_out(json.dumps({"base_urls": urls}))
            flush_out()
            if replicas_file is not None:
                print(f"replica URLs written to {replicas_file}", file=sys.stderr, flush=True)
            while not stop.wait(1.0):
                if not replicas.base_urls:
                    print("error: every replica failed past its restarts", file=sys.stderr)
                    return 1
            print(
                f"stopping {len(replicas.base_urls)} replicas: requests in flight get up to "
                f"{replicas.drain_timeout_s:g} s to finish (press Ctrl-C again to stop at once)",
                file=sys.stderr, flush=True,
            )
        finally:
            replicas.stop()
        return 128 + received[0]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
