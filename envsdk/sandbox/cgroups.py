"""Whole-sandbox limits through cgroup v1: memory and process count for all of a sandbox's
processes together, where rlimits only bound each process.

Where the host has cgroup v1's ``memory`` and ``pids`` controllers and the server may create
cgroups in them (it runs as root, or was given a delegated hierarchy), each sandbox gets one
cgroup per controller::

    <controller mount>/envsdk/<server pid>-<its start time>/sandbox-<n>

with ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, where present, so swap
adds nothing) set to ``memory_bytes`` and ``pids.max`` to ``processes + OWN_PROCESSES``. The
top of a mounted hierarchy is a container's own cgroup when the server runs in one; on a bare
host it is the machine's root cgroup, outside the server's own (a service manager's or a job
runner's folder, not the server's to fill). The sandbox's first process joins its cgroups
before it starts anything (`SandboxCgroup.enter_argv`: a shell in front of the provider's
command, which then becomes it), so every process and thread it ever has is counted. Only
``cgroup.procs`` is handed to the sandbox's user id (for that shell), never a limit file.
Everything the sandbox holds counts: its processes' memory, its tmpfs files (a bubblewrap
sandbox's disk, or the host's ``/dev/shm``) and SysV shared memory. Past ``memory_bytes`` the
kernel's OOM killer kills one of the sandbox's processes (a run's first: the agent raises
their ``oom_score_adj``); a fork past ``pids.max`` fails with EAGAIN.

`SandboxCgroup.remove` (at close) kills whatever is still in the cgroups and removes them. A
server killed before it could leaves them behind: `SandboxCgroups.remove_orphans` (each
provider's first start) kills the processes in the cgroups of servers that are gone and
removes them.

Where the controllers are missing or not writable (not root; cgroup v2 only, which this module
does not drive), `host_cgroups` holds none and the per-process limits are all there is;
`SandboxProvider.describe` says which whole-sandbox limits hold.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from envsdk.sandbox._reap import kill_until_gone

if TYPE_CHECKING:
    from envsdk.sandbox.base import SandboxLimits

__all__ = ["OWN_PROCESSES", "SandboxCgroup", "SandboxCgroups", "host_cgroups"]

#: Processes (and threads) a sandbox runs for itself, on top of its runs' ``processes``:
#: bubblewrap's two (its monitor and the namespace's init), the agent and the interpreter.
OWN_PROCESSES = 4
#: Which `SandboxLimits` field each controller bounds for the whole sandbox.
CONTROLLERS = {"memory": "memory_bytes", "pids": "processes"}
#: Run by the sandbox's first process: join every cgroup named before ``--``, then become the
#: command after it (exit status 125 when a cgroup cannot be joined).
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_SERVER_DIR = re.compile(r"(\d+)-(\d+)")


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _controller_mounts() -> dict[str, Path]:
    """Where each cgroup v1 controller of `CONTROLLERS` is mounted."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount, _, tail = line.partition(" - ")
        fields, extra = mount.split(), tail.split()
        if len(extra) < 3 or extra[0] != "cgroup":
            continue
        for option in extra[2].split(","):
            if option in CONTROLLERS:
                found.setdefault(option, Path(fields[4]))
    return found


class SandboxCgroup:
    """One sandbox's cgroups, by controller."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def enter_argv(self) -> list[str]:
        """The argv prefix that puts the process it starts into these cgroups, then runs the
        rest of the argv in its place (same pid)."""
        procs = [str(path / "cgroup.procs") for path in self.paths.values()]
        return ["/bin/sh", "-c", _ENTER, "envsdk-cgroup", *procs, "--"]

    def processes(self) -> set[int]:
        """The pids of every process still in these cgroups."""
        found: set[int] = set()
        for path in self.paths.values():
            try:
                found.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return found

    def kill(self) -> None:
        """Stop, then kill, every process in these cgroups until none is left (stopped, they
        cannot fork while the others are being killed)."""
        kill_until_gone(self.processes, rounds=200)

    def remove(self) -> None:
        """Kill what is left in the cgroups and remove them. Idempotent."""
        self.kill()
        for path in self.paths.values():
            # A killed process leaves its cgroup a moment after it is gone from cgroup.procs.
            for _ in range(200):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    self.kill()
                    time.sleep(0.01)


class SandboxCgroups:
    """Where this server puts its sandboxes' cgroups: one folder of its own per controller
    (`server_dirs`, empty where cgroups cannot be used)."""

    def __init__(self, server_dirs: dict[str, Path]) -> None:
        self.server_dirs = server_dirs
        self.pid = os.getpid()
        self._names = itertools.count()

    @classmethod
    def detect(cls) -> SandboxCgroups:
        """This server's folders in every controller of `CONTROLLERS` that is mounted (cgroup
        v1) and lets it create cgroups; they are removed at exit when empty."""
        server = f"{os.getpid()}-{_start_time(os.getpid())}"
        dirs: dict[str, Path] = {}
        for controller, mount in _controller_mounts().items():
            path = mount / "envsdk" / server
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            dirs[controller] = path
        found = cls(dirs)
        atexit.register(found._remove_server_dirs)
        return found

    @property
    def holds(self) -> list[str]:
        """The `SandboxLimits` fields that hold for each sandbox as a whole."""
        return [limit for controller, limit in CONTROLLERS.items() if controller in self.server_dirs]

    def create(self, limits: SandboxLimits, uid: int | None) -> SandboxCgroup | None:
        """A new sandbox's cgroups with `limits` set, joinable by user `uid` (None: this
        process's own); None where there are no controllers. Raises OSError."""
        if not self.server_dirs:
            return None
        cgroup = SandboxCgroup({})
        name = f"sandbox-{next(self._names)}"
        try:
            for controller, parent in self.server_dirs.items():
                path = parent / name
                path.mkdir()
                cgroup.paths[controller] = path
                if controller == "memory":
                    # The memory limit first: the kernel refuses memory+swap below it.
                    (path / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                    if (path / "memory.memsw.limit_in_bytes").exists():
                        (path / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
                else:
                    (path / "pids.max").write_text(str(limits.processes + OWN_PROCESSES))
                if uid is not None:
                    os.chown(path / "cgroup.procs", uid, uid)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def remove_orphans(self) -> None:
        """Kill the processes in, and remove, the sandbox cgroups of servers that are gone."""
        for server_dir in self.server_dirs.values():
            try:
                others = [entry for entry in server_dir.parent.iterdir() if entry != server_dir]
            except OSError:
                continue
            for other in others:
                match = _SERVER_DIR.fullmatch(other.name)
                if match is None or _start_time(int(match[1])) == int(match[2]):
                    continue
                try:
                    sandboxes = [entry for entry in other.iterdir() if entry.is_dir()]
                except FileNotFoundError:
                    continue  # another provider removed it meanwhile
                for sandbox in sandboxes:
                    SandboxCgroup({"orphan": sandbox}).remove()
                try:
                    other.rmdir()
                except FileNotFoundError:
                    pass

    def _remove_server_dirs(self) -> None:
        if os.getpid() != self.pid:
            return
        for path in self.server_dirs.values():
            try:
                path.rmdir()
            except OSError:
                pass  # a sandbox still open at exit; the next server's provider removes it


_lock = threading.Lock()
_host: SandboxCgroups | None = None


def host_cgroups() -> SandboxCgroups:
    """This process's `SandboxCgroups`, found once (again in a forked child: a folder is per
    server process)."""
    global _host
    with _lock:
        if _host is None or _host.pid != os.getpid():
            _host = SandboxCgroups.detect()
        return _host
