"""The sandbox interface: `SandboxLimits`, `CompletedRun`, `Sandbox`, `SandboxProvider`, the errors.

A provider knows one thing: how to start the sandbox's agent process isolated in its own way
(`SandboxProvider.command`). Everything else (the request/reply protocol with the agent,
deadlines, output caps, reaping) is `Sandbox`'s job and the same for every provider.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envsdk.errors import EnvSDKError
from envsdk.sandbox._reap import kill_until_gone
from envsdk.sandbox.cgroups import SandboxCgroup, host_cgroups

__all__ = [
    "SandboxLimits",
    "CompletedRun",
    "Sandbox",
    "SandboxProvider",
    "SandboxError",
    "SandboxStartError",
    "SandboxDied",
    "SandboxTimeout",
    "SandboxClosed",
    "SandboxPathError",
    "SpawnedProcess",
    "kill_tree",
    "kill_user",
    "process_tree",
    "user_processes",
]

_AGENT_SOURCE = (Path(__file__).parent / "_agent.py").read_text(encoding="utf-8")
#: How long past a request's own timeout the host waits for the agent's reply before it
#: treats the agent as hung and kills the whole sandbox.
REPLY_GRACE_S = 5.0
#: Niceness of a sandbox's agent (its runs add 10 more).
SANDBOX_NICE = 5


class SandboxError(EnvSDKError):
    """Something went wrong with a sandbox itself (not with the code run in it)."""


class SandboxStartError(SandboxError):
    """The sandbox could not be started (missing tool, refused namespace, slow start)."""


class SandboxDied(SandboxError):
    """The sandbox's agent is gone (killed from inside, or out of resources); the sandbox is
    closed and must be replaced."""


class SandboxTimeout(SandboxError):
    """The agent did not answer within the request's timeout plus a grace period; the whole
    sandbox was killed."""


class SandboxClosed(SandboxError):
    """The sandbox was closed; start another."""


class SandboxPathError(SandboxError, ValueError):
    """A file path that does not name a file inside the workspace."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox may use. Every run in it (each command, each interpreter snippet)
    gets its own CPU-time budget, and no code of it runs once it is answered; the rest bound
    each process, and ``memory_bytes`` and ``processes`` also the whole sandbox where the host
    has cgroups (`envsdk.sandbox.cgroups`; `SandboxProvider.describe` says which hold).

    cpu_s: CPU seconds per run (RLIMIT_CPU; all threads count), then SIGKILL.
    memory_bytes: address space per process (RLIMIT_AS), and the RAM of the whole sandbox
        (memory cgroup: its processes, its tmpfs files, its shared memory).
    processes: processes and threads per sandbox (RLIMIT_NPROC, counted per sandbox user;
        pids cgroup: ``processes`` plus the sandbox's own four).
    file_bytes: largest file a process may write (RLIMIT_FSIZE).
    open_files: open file descriptors per process (RLIMIT_NOFILE).
    disk_bytes: all the sandbox may write, together (bubblewrap: one tmpfs holding /, the
        workspace, /tmp and /dev/shm; plain processes: not bounded but per file).
    output_bytes: stdout and stderr kept per run, each; the rest is read and counted, up to
        16 times this, where the run is killed (output limit exceeded).
    timeout_s: default wall-clock deadline of a run.
    start_timeout_s: how long starting a sandbox may take.
    """

    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    processes: int = 64
    file_bytes: int = 64 << 20
    open_files: int = 256
    disk_bytes: int = 256 << 20
    output_bytes: int = 1 << 20
    timeout_s: float = 10.0
    start_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class CompletedRun:
    """The outcome of one run, in `subprocess.CompletedProcess`'s words.

    ``returncode`` is negative for a signal (``-9``: killed at the deadline or by a limit).
    ``stdout``/``stderr`` hold at most ``SandboxLimits.output_bytes`` each;
    ``stdout_bytes``/``stderr_bytes`` count everything the run wrote. ``restarted``: the
    persistent interpreter was (re)started for this run, so earlier state is gone; ``note``
    says why when the run ended it.
    """

    args: Any
    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    timed_out: bool
    duration_s: float
    restarted: bool = False
    note: str = ""

    @property
    def truncated(self) -> bool:
        return self.stdout_bytes > len(self.stdout) or self.stderr_bytes > len(self.stderr)


def process_tree(root: int) -> list[int]:
    """The pids of every live descendant of `root` (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def kill_tree(root: int) -> None:
    """Stop, then kill, `root` and every descendant until none is left (stopped processes
    cannot fork while the others are being killed)."""
    for _ in range(100):
        pids = [root, *process_tree(root)]
        alive = False
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    alive = True
                except (ProcessLookupError, PermissionError):
                    pass
        if not alive or not process_tree(root):
            return
        time.sleep(0.01)


def user_processes(uid: int) -> list[int]:
    """The pids of every live process whose real user id is `uid` (from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        uids = status.split(b"\nUid:", 1)[1].split(None, 1)[0] if b"\nUid:" in status else b""
        state = status.split(b"\nState:", 1)[1].split(None, 1)[0] if b"\nState:" in status else b""
        if uids == str(uid).encode() and state != b"Z":
            found.append(int(name))
    return found


def kill_user(uid: int) -> None:
    """Stop, then kill, every process of user `uid` until none is left (a sandbox's own user
    id: this reaches processes that escaped its process tree)."""
    kill_until_gone(lambda: user_processes(uid))


class SandboxProvider:
    """Starts sandboxes. Subclasses implement `command` (and `prepare`/`cleanup` when they need
    host-side resources); `start` is the same for all.

    ``name`` and ``isolation`` describe the provider (``/health`` shows them);
    ``isolates`` lists what it keeps from the sandboxed code. Each sandbox gets cgroups of its
    own where the host allows (`envsdk.sandbox.cgroups`); a provider's first `start` removes
    those a killed server left behind.
    """

    name: str = "abstract"
    isolation: str = ""
    isolates: tuple[str, ...] = ()

    def __init__(self, limits: SandboxLimits | None = None, python: str = "/usr/bin/python3") -> None:
        self.limits = limits or SandboxLimits()
        self.python = python
        self.cgroups = host_cgroups()
        self._orphans_removed = False

    def command(self, agent: list[str], slot: SandboxSlot) -> list[str]:
        """The argv that runs `agent` (the interpreter and its arguments) isolated."""
        raise NotImplementedError

    def popen_options(self, slot: SandboxSlot) -> dict[str, Any]:
        """Extra `subprocess.Popen` keyword arguments (user, cwd, ...)."""
        return {}

    def prepare(self, slot: SandboxSlot) -> None:
        """Host-side set-up before the agent starts (e.g. a workspace folder)."""

    def agent_settings(self, slot: SandboxSlot) -> dict[str, Any]:
        """What the agent applies to itself before it serves, beside the limits (``confine``:
        the folders it may reach, `envsdk.sandbox.process`)."""
        return {}

    def cleanup(self, slot: SandboxSlot) -> None:
        """Host-side clean-up after every process of the sandbox is gone."""

    def describe(self) -> dict[str, Any]:
        """What the provider isolates and its limits; ``whole_sandbox``: the limits that also
        hold for each sandbox as a whole (the others hold per process)."""
        return {"provider": self.name, "isolation": self.isolation, "isolates": list(self.isolates),
                "limits": asdict(self.limits), "whole_sandbox": self.cgroups.holds}

    def start(self) -> Sandbox:
        """A started sandbox (its agent answered). Raises `SandboxStartError`."""
        if not self._orphans_removed:
            self._orphans_removed = True
            self.cgroups.remove_orphans()
        slot = SandboxSlot.allocate()
        try:
            self.prepare(slot)
            slot.cgroup = self.cgroups.create(self.limits, slot.uid)
            settings = {**asdict(self.limits), **self.agent_settings(slot)}
            agent = [self.python, "-I", "-S", "-c", _AGENT_SOURCE, json.dumps(settings)]
            # The whole sandbox runs below the server's priority (its runs lower still), so
            # code spinning in it slows other sandboxes, not the server answering them.
            argv = ["nice", "-n", str(SANDBOX_NICE), *self.command(agent, slot)]
            if slot.cgroup is not None:
                argv = [*slot.cgroup.enter_argv(), *argv]
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True, **self.popen_options(slot),
            )
        except (OSError, SandboxError) as exc:
            self.cleanup(slot)
            slot.release()
            raise SandboxStartError(f"cannot start a {self.name} sandbox: {exc}") from exc
        sandbox = Sandbox(self, process, slot)
        try:
            sandbox._await_ready(self.limits.start_timeout_s)
        except SandboxError as exc:
            detail = sandbox._stderr_tail()
            sandbox.close()
            raise SandboxStartError(f"{self.name} sandbox did not start: {exc} {detail}".strip()) from exc
        return sandbox


class SandboxSlot:
    """A sandbox's host identity: a user id of its own (when the server runs as root, so that
    process counts and signals are per sandbox), its cgroups (where the host has them) and an
    optional host workspace folder."""

    BASE_UID = 1_900_000
    SIZE = 65_536
    #: Where user ids are leased, host-wide: one lock file per id, locked while a sandbox of
    #: any server process holds it (the kernel drops the lock when that process dies).
    LEASES = Path("/run/envsdk/sandbox-uids")
    _lock = threading.Lock()
    _next = 0

    def __init__(self, uid: int | None, lease: int | None = None) -> None:
        self.uid = uid
        self._lease = lease
        self.cgroup: SandboxCgroup | None = None
        self.workspace: Path | None = None

    @classmethod
    def allocate(cls) -> SandboxSlot:
        """A slot with a user id no other sandbox on this host holds (as root; else none).
        Processes left under that id by a server that died holding it are killed first."""
        if os.geteuid() != 0:
            return cls(None)
        try:
            cls.LEASES.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise SandboxStartError(f"cannot lease a sandbox user id in {cls.LEASES}: {exc}") from exc
        with cls._lock:
            for _ in range(cls.SIZE):
                uid = cls.BASE_UID + cls._next
                cls._next = (cls._next + 1) % cls.SIZE
                fd = os.open(cls.LEASES / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                # A lease file left non-empty is one whose holder died with the sandbox open:
                # what that sandbox left under this id goes before the id is used again.
                if os.pread(fd, 1, 0):
                    kill_user(uid)
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                return cls(uid, fd)
        raise SandboxStartError(f"all {cls.SIZE} sandbox user ids are in use")

    def release(self) -> None:
        """Remove the cgroups (killing what is left in them), then free the user id."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        lease, self._lease = self._lease, None
        if lease is not None:
            os.ftruncate(lease, 0)
            os.close(lease)


class Sandbox:
    """One started sandbox: a workspace, a persistent Python interpreter, runs with limits.

    Methods block; each has a deadline. One request at a time (calls from several threads are
    serialised). `close` kills every process of the sandbox and removes what it left; it is
    idempotent and also runs when the agent dies or hangs.
    """

    def __init__(self, provider: SandboxProvider, process: subprocess.Popen[bytes], slot: SandboxSlot) -> None:
        self.provider = provider
        self.limits = provider.limits
        self.process = process
        self.slot = slot
        self._lock = threading.Lock()
        self._buffer = b""
        self._closed = False

    @property
    def pid(self) -> int:
        """The host pid of the sandbox's outermost process."""
        return self.process.pid

    @property
    def uid(self) -> int | None:
        """The host user id every process of this sandbox runs as (None: the server's own)."""
        return self.slot.uid

    @property
    def alive(self) -> bool:
        return not self._closed and self.process.poll() is None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, command: Sequence[str], *, input: bytes | None = None, timeout: float | None = None) -> CompletedRun:
        """Run `command` (an argv; ``command[0]`` is looked up on the sandbox's PATH) in the
        workspace with `input` on stdin; killed, with everything it started, at `timeout`
        (default ``limits.timeout_s``)."""
        seconds = self._timeout(timeout)
        reply = self._call(
            {"op": "run", "argv": list(command), "timeout_s": seconds,
             "input": base64.b64encode(input or b"").decode()},
            seconds,
        )
        return self._completed(list(command), reply)

    def run_python(self, code: str, *, timeout: float | None = None) -> CompletedRun:
        """Run `code` in the sandbox's persistent interpreter (names defined by one snippet are
        there for the next). An exception's traceback goes to stderr with returncode 1; a
        snippet past `timeout` restarts the interpreter (``restarted`` on the next run)."""
        seconds = self._timeout(timeout)
        return self._completed(code, self._call({"op": "python", "code": code, "timeout_s": seconds}, seconds))

    def write_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` (relative to the workspace)."""
        if len(data) > self.limits.file_bytes:
            raise SandboxPathError(f"{len(data)} bytes is over the file size limit ({self.limits.file_bytes})")
        self._call({"op": "write", "path": path, "data": base64.b64encode(data).decode()}, self.limits.timeout_s)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The first `max_bytes` (default ``limits.output_bytes``) of workspace file `path`."""
        cap = max_bytes if max_bytes is not None else self.limits.output_bytes
        reply = self._call({"op": "read", "path": path, "max_bytes": cap}, self.limits.timeout_s)
        return base64.b64decode(reply["data"])

    def spawn(self, command: Sequence[str]) -> SpawnedProcess:
        """Start `command` in the workspace, with a run's limits, as a process the host then
        talks to line by line (`SpawnedProcess.exchange`) until `SpawnedProcess.close`. One
        at a time: spawning another, or any `run`, ends it."""
        reply = self._call({"op": "spawn", "argv": list(command)}, self.limits.timeout_s)
        return SpawnedProcess(self, list(command), int(reply["pid"]))

    def spawn_python(self, source: str, *, cpu_s: int | None = None) -> SpawnedProcess:
        """`spawn` for Python `source`, run as the main module of a fork of the sandbox's
        agent (its own session, a run's limits, none of the agent's descriptors): a fresh
        process without an interpreter's start-up. The agent holds nothing secret, but what
        it imported is there: the source runs with the sandbox's interpreter and isolation,
        not in an empty one. `cpu_s`: CPU seconds it may use (at most ``limits.cpu_s``), then
        SIGXCPU ends it."""
        request: dict[str, Any] = {"op": "spawn", "python": source}
        if cpu_s is not None:
            request["cpu_s"] = cpu_s
        reply = self._call(request, self.limits.timeout_s)
        return SpawnedProcess(self, ["<python>"], int(reply["pid"]))

    def close(self) -> None:
        """Kill every process of the sandbox, then remove its host-side files. Idempotent."""
        with self._lock:
            self._close_locked()

    # ---------------------------------------------------------------- internals

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        kill_tree(self.process.pid)
        if self.slot.cgroup is not None:
            # Before the provider's clean-up: what left the process tree writes no more files.
            self.slot.cgroup.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self.provider.cleanup(self.slot)
        self.slot.release()

    def _timeout(self, timeout: float | None) -> float:
        seconds = self.limits.timeout_s if timeout is None else timeout
        if not seconds > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        return float(seconds)

    def _completed(self, args: Any, reply: dict[str, Any]) -> CompletedRun:
        return CompletedRun(
            args=args, returncode=int(reply["returncode"]),
            stdout=base64.b64decode(reply["stdout"]), stderr=base64.b64decode(reply["stderr"]),
            stdout_bytes=int(reply["stdout_bytes"]), stderr_bytes=int(reply["stderr_bytes"]),
            timed_out=bool(reply["timed_out"]), duration_s=float(reply["duration_s"]),
            restarted=bool(reply["restarted"]), note=str(reply["note"]),
        )

    def _stderr_tail(self) -> str:
        stream = self.process.stderr
        if stream is None or self.process.poll() is None:
            return ""
        return stream.read(2000).decode("utf-8", "replace").strip()

    def _await_ready(self, timeout_s: float) -> None:
        with self._lock:
            reply = self._read_reply(time.monotonic() + timeout_s, 1024)
        if reply.get("ready") is not True:
            raise SandboxStartError(f"unexpected first reply {reply!r}")

    def _call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # Base64 grows bytes by 4/3: room for both streams (or a file) and the JSON around them.
        cap = 4 * max(self.limits.output_bytes, self.limits.file_bytes) + 65536
        with self._lock:
            if self._closed:
                raise SandboxClosed("the sandbox is closed")
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
            except OSError:
                self._close_locked()
                raise SandboxDied("the sandbox's agent is gone (it was killed or ran out of resources)") from None
            reply = self._read_reply(time.monotonic() + timeout_s + REPLY_GRACE_S, cap)
        if "error" in reply:
            if reply["error"] == "ValueError" or request["op"] in ("read", "write"):
                raise SandboxPathError(f"{request['op']} {request.get('path')!r}: {reply['message']}")
            raise SandboxError(f"{request['op']}: {reply['message']}")
        return reply

    def _read_reply(self, deadline: float, cap: int) -> dict[str, Any]:
        """One JSON line from the agent by `deadline`, at most `cap` bytes; on a hang, EOF or an
        oversized reply the sandbox is closed and `SandboxTimeout`/`SandboxDied` raised."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self._close_locked()
                    raise SandboxTimeout("the sandbox's agent did not answer in time; the sandbox was killed")
                chunk = os.read(fd, 1 << 20)
                if not chunk or len(self._buffer) + len(chunk) > cap:
                    self._close_locked()
                    raise SandboxDied("the sandbox's agent is gone (it was killed or ran out of resources)")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply


class SpawnedProcess:
    """A process started by `Sandbox.spawn`: its stdin and stdout carry one line in, one line
    out. Whatever it writes to stderr is kept (up to ``output_bytes``) for `close`."""

    def __init__(self, sandbox: Sandbox, args: list[str], pid: int) -> None:
        self.sandbox = sandbox
        self.args = args
        self.pid = pid
        #: Why the channel ended ('' while it is open): no answer in time, output closed, a
        #: line over ``output_bytes``.
        self.ended = ""
        self.closed = False

    def exchange(self, line: bytes, timeout: float) -> bytes | None:
        """Send `line` (without its newline) and return the process's next line, or None when
        it gave none by `timeout`, closed its output or wrote a line over ``output_bytes``; it
        is then killed and `ended` says why. A line may not contain a newline."""
        if b"\n" in line:
            raise ValueError("a line sent to a spawned process may not contain a newline")
        if self.ended:
            return None
        seconds = self.sandbox._timeout(timeout)
        reply = self.sandbox._call(
            {"op": "exchange", "data": base64.b64encode(line).decode(), "timeout_s": seconds}, seconds
        )
        if reply["status"] != "ok":
            self.ended = str(reply.get("detail") or reply["status"])
            return None
        return base64.b64decode(reply["data"])

    def close(self) -> CompletedRun:
        """Kill the process and whatever it started; its exit status and stderr."""
        reply = self.sandbox._call({"op": "finish"}, self.sandbox.limits.timeout_s)
        self.ended, self.closed = self.ended or "closed", True
        return CompletedRun(
            args=self.args, returncode=int(reply["returncode"]), stdout=b"",
            stderr=base64.b64decode(reply["stderr"]), stdout_bytes=0, stderr_bytes=int(reply["stderr_bytes"]),
            timed_out=False, duration_s=float(reply["duration_s"]),
        )
