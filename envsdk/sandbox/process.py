"""`ProcessProvider`: plain processes with rlimits, a user id per sandbox and process groups.

Weaker than `envsdk.sandbox.bubblewrap.BubblewrapProvider`, and labelled so: there is no
namespace. What it does: every run gets the CPU, address-space, process-count, file-size and
open-file rlimits; the agent is a child subreaper that kills whatever a run leaves (daemonised
grandchildren included); `close` kills the whole process tree and removes the workspace
folder. When the server runs as root, each sandbox runs as a user id of its own, so the
process-count limit is per sandbox, its code cannot signal the server or other sandboxes, and
`close` also kills every process of that user id (one that left the process tree included).

What it cannot stop: network access (any address, the server's own port included); reading
every world-readable file and the process list of the machine; writing to world-writable
places outside the workspace (``/tmp``), so the disk is bounded only per file
(``file_bytes``), not in total; when the server does not run as root, the process-count limit
counts every process of the server's user (it is then not applied) and sandbox code can
signal the server.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from envsdk.sandbox.base import SandboxProvider, SandboxSlot, kill_user

__all__ = ["ProcessProvider"]


class ProcessProvider(SandboxProvider):
    """Plain processes: rlimits, a user id per sandbox (as root), process-group reaping. No
    namespaces: see the module docstring for what it cannot stop."""

    name = "process"
    isolation = "weaker: rlimits and process groups only (no network, file or process-table isolation)"
    isolates = ("cpu", "memory", "processes (as root)", "file size", "open files", "leftover processes")

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
        if slot.workspace is not None:
            shutil.rmtree(slot.workspace, ignore_errors=True)
