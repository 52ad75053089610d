"""`ProcessProvider`: plain processes with rlimits, a user id per sandbox and process groups.

Weaker than `envsdk.sandbox.bubblewrap.BubblewrapProvider`, and labelled so: there is no
namespace. What it does: every run gets the CPU, address-space, process-count, file-size and
open-file rlimits; the agent is a child subreaper that kills whatever a run leaves (daemonised
grandchildren included); `close` kills the whole process tree and removes the workspace
folder. When the server runs as root, each sandbox runs as a user id of its own, so the
process-count limit is per sandbox, its code cannot signal the server or other sandboxes, and
`close` also kills every process of that user id (one that left the process tree included) and
removes what that user id left in the host's shared places: files and folders in `SHARED_DIRS`
(``/dev/shm`` is RAM) and the world-writable folders below them, and SysV IPC objects
(shared memory, semaphores, message queues).

What it cannot stop: network access (any address, the server's own port included); reading
every world-readable file and the process list of the machine; writing to world-writable
places outside the workspace (``/tmp``), so the disk is bounded only per file
(``file_bytes``), not in total, while the sandbox lives (RAM-backed ``/dev/shm`` files count
in its memory cgroup, where there is one); when the server does not run as root, the
process-count limit counts every process of the server's user (it is then not applied),
sandbox code can signal the server, and what it leaves in shared places stays.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from envsdk.sandbox.base import SandboxProvider, SandboxSlot, kill_user

__all__ = ["SHARED_DIRS", "ProcessProvider", "remove_user_files", "remove_user_ipc"]

#: The host's places any user may write to, where a sandbox's user can leave files behind.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
_IPC_RMID = 0


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
    """Plain processes: rlimits, a user id per sandbox (as root), process-group reaping. No
    namespaces: see the module docstring for what it cannot stop."""

    name = "process"
    isolation = "weaker: rlimits and process groups only (no network, file or process-table isolation)"
    isolates = (
        "cpu", "memory", "processes (as root)", "file size", "open files", "leftover processes",
        "leftover shared files and IPC (as root)",
    )

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
