"""`ProcessProvider`: plain processes with rlimits, a user id per sandbox and process groups,
confined by Landlock where the kernel has it.

Weaker than `envsdk.sandbox.bubblewrap.BubblewrapProvider`, and labelled so: there is no
namespace. What it does: every run gets the CPU, address-space, process-count, file-size and
open-file rlimits; the agent is a child subreaper that kills whatever a run leaves (daemonised
grandchildren included); `close` kills the whole process tree and removes the workspace
folder. With Landlock (Linux 5.13 or later, on in most distributions' kernels; `landlock_abi`)
the agent confines itself and all it starts before any sandbox code runs: it reads and runs
files under ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links to it) and the interpreter's
own prefix, reads and writes existing files of ``/dev`` and ``/proc``, writes only its
workspace and the shared places of `SHARED_DIRS`; every other file of the host (the server's
code, its virtual environment and the task data it reads, home folders, ``/etc``) cannot be
opened. From Landlock ABI 4 it cannot bind or connect TCP sockets; from ABI 6 it cannot
signal, nor reach by abstract unix socket, any process outside its sandbox. When the server
runs as root, each sandbox runs as a user id of its own, so the process-count limit is per
sandbox, its code cannot signal the server or other sandboxes, and `close` also kills every
process of that user id (one that left the process tree included) and removes what that user
id left in the host's shared places: files and folders in `SHARED_DIRS` (``/dev/shm`` is RAM)
and the world-writable folders below them, and SysV IPC objects (shared memory, semaphores,
message queues).

What it cannot stop: UDP and other non-TCP network access; reading the process list and what
every other process shows in ``/proc``, and what other users leave readable in the shared
places (``/tmp``: keep task data out of them); the disk is bounded only per file
(``file_bytes``), not in total, while the sandbox lives (RAM-backed ``/dev/shm`` files count in
its memory cgroup, where there is one); a system-wide install of the server's Python packages
under ``/usr`` is readable (install envsdk in a virtual environment); without Landlock, every
world-readable file and the network. When the server does not run as root, the process-count
limit counts every process of the server's user (it is then not applied) and what sandbox code
leaves in shared places stays; without Landlock's signal scope (ABI 6) its code can also
signal the server.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from envsdk.sandbox.base import SandboxLimits, SandboxProvider, SandboxSlot, kill_user

__all__ = ["READABLE_DIRS", "SHARED_DIRS", "ProcessProvider", "landlock_abi", "remove_user_files", "remove_user_ipc"]

#: The host's places any user may write to, where a sandbox's user can leave files behind.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
#: What a confined sandbox may read and run (besides its interpreter's prefix).
READABLE_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_IPC_RMID = 0
_LANDLOCK_CREATE_RULESET = 444


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (too old, or not enabled)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def remove_user_files(uid: int, folders: tuple[str, ...] = SHARED_DIRS) -> None:
    """Remove every file and folder of user `uid` in `folders`, and in the world-writable
    folders below them: the only places that user can have made one (its own folders go
    whole). Symbolic links are removed, never followed."""
    todo = list(folders)
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid == uid and stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path)
                elif info.st_uid == uid:
                    os.unlink(entry.path)
                elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                    todo.append(entry.path)
            except OSError:
                continue  # gone meanwhile


def remove_user_ipc(uid: int) -> None:
    """Remove every SysV shared-memory segment, semaphore set and message queue that user
    `uid` owns or created (from ``/proc/sysvipc``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, id_column in (("shm", "shmid"), ("sem", "semid"), ("msg", "msqid")):
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except OSError:
            continue
        header = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(header, line.split()))
            if str(uid) not in (row.get("uid"), row.get("cuid")):
                continue
            ipc_id = int(row[id_column])
            if kind == "shm":
                libc.shmctl(ipc_id, _IPC_RMID, None)
            elif kind == "sem":
                libc.semctl(ipc_id, 0, _IPC_RMID)
            else:
                libc.msgctl(ipc_id, _IPC_RMID, None)


class ProcessProvider(SandboxProvider):
    """Plain processes: rlimits, a user id per sandbox (as root), process-group reaping, and
    Landlock where the kernel has it (``confined``). No namespaces: see the module docstring
    for what it cannot stop."""

    name = "process"

    def __init__(self, limits: SandboxLimits | None = None, python: str = "/usr/bin/python3") -> None:
        super().__init__(limits, python)
        #: The kernel's Landlock ABI (0: none, the sandbox then sees every world-readable file).
        self.landlock = landlock_abi()
        self.confined = self.landlock >= 1
        if self.confined:
            self.isolation = (
                f"weaker: rlimits, process groups and Landlock ABI {self.landlock} (files outside /usr and the"
                " workspace hidden); no network or process-table namespace"
            )
        else:
            self.isolation = "weaker: rlimits and process groups only (no network, file or process-table isolation)"
        self.isolates = (
            "cpu", "memory", "processes (as root)", "file size", "open files", "leftover processes",
            "leftover shared files and IPC (as root)",
            *(("files outside /usr and the workspace",) if self.confined else ()),
            *(("tcp network",) if self.landlock >= 4 else ()),
            *(("signals to other processes",) if self.landlock >= 6 else ()),
        )

    def agent_settings(self, slot: SandboxSlot) -> dict[str, Any]:
        if not self.confined:
            return {}
        real = os.path.realpath(self.python)
        prefix = os.path.dirname(os.path.dirname(real))
        read = [*READABLE_DIRS]
        if not any(real.startswith(folder + "/") for folder in READABLE_DIRS):
            read.append(prefix)  # an interpreter outside /usr needs its standard library
        return {"confine": {"read": read, "write": [str(slot.workspace), *SHARED_DIRS],
                            "devices": ["/dev"], "proc": ["/proc"]}}

    def prepare(self, slot: SandboxSlot) -> None:
        slot.workspace = Path(tempfile.mkdtemp(prefix="envsdk-sandbox-"))
        if slot.uid is not None:
            os.chown(slot.workspace, slot.uid, slot.uid)
        os.chmod(slot.workspace, 0o700)

    def command(self, agent: list[str], slot: SandboxSlot) -> list[str]:
        return agent

    def popen_options(self, slot: SandboxSlot) -> dict[str, Any]:
        options: dict[str, Any] = {"cwd": slot.workspace, "env": {"PATH": "/usr/bin:/bin", "HOME": str(slot.workspace)}}
        if slot.uid is not None:
            options.update(user=slot.uid, group=slot.uid, extra_groups=[])
        return options

    def cleanup(self, slot: SandboxSlot) -> None:
        # Without a PID namespace, a process whose parent died (the agent, killed from inside)
        # leaves the sandbox's process tree; its user id still finds it.
        if slot.uid is not None:
            kill_user(slot.uid)
            remove_user_files(slot.uid)
            remove_user_ipc(slot.uid)
        if slot.workspace is not None:
            shutil.rmtree(slot.workspace, ignore_errors=True)
