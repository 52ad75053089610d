"""`BubblewrapProvider`: each sandbox in its own Linux namespaces, through bubblewrap (``bwrap``).

Per sandbox: new user, PID, network, mount, IPC and UTS namespaces (``--unshare-all``); only
``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links to it) visible, read-only; one private
tmpfs of ``disk_bytes`` as the root, holding ``/workspace``, ``/tmp``, ``/dev/shm`` and whatever
else the sandbox writes, so every file it can make counts in that one budget; a ``/dev`` of
the usual device nodes (null, zero, full, random, urandom, tty; no pseudo-terminals) made on
that root, not bwrap's ``--dev``, whose tmpfs is writable and half the machine's RAM in size;
a fresh ``/proc`` that shows the sandbox's own processes only; a cleared environment; no
network interface but loopback. The sandbox's processes run as ``nobody`` inside and, when
the server runs as root, as a user id of their own outside (`SandboxSlot`), so the kernel
counts their processes per sandbox and they hold no privilege on the host. bwrap dies with the
server (``--die-with-parent``), and the kernel kills every process of a PID namespace when
its first process dies, so nothing outlives `Sandbox.close`: no process, no mount (the tmpfs
lives in the sandbox's mount namespace) and no file. ``--die-with-parent`` follows the
kernel's parent-death signal, which fires when the *thread* that started bwrap exits: start
sandboxes from a thread that lives as long as they should (a `SandboxPool`'s own thread, or
the session's lane, which outlives its sandbox).

Interpreter: ``python`` (default ``/usr/bin/python3``) must live under ``/usr``.
"""

from __future__ import annotations

import shutil

from envsdk.sandbox.base import SandboxProvider, SandboxSlot, SandboxStartError

__all__ = ["BubblewrapProvider", "bwrap_path"]

#: The host's device nodes a sandbox sees (bound one by one, as bwrap's own ``--dev`` does).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def bwrap_path() -> str | None:
    """Where ``bwrap`` is, or None."""
    return shutil.which("bwrap")


class BubblewrapProvider(SandboxProvider):
    """Namespaces through bubblewrap: no network, read-only /usr only, one private tmpfs for
    all the sandbox writes, own PID namespace, a user id per sandbox (see the module docstring)."""

    name = "bubblewrap"
    isolation = (
        "namespaces: user, pid, net, mount, ipc, uts; read-only /usr; one private tmpfs of disk_bytes"
        " for all it writes (/workspace, /tmp, /dev/shm)"
    )
    isolates = (
        "cpu", "memory", "processes", "file size", "open files", "disk (one tmpfs)", "network",
        "files outside /usr and the workspace", "other processes", "environment", "leftover processes",
    )

    def prepare(self, slot: SandboxSlot) -> None:
        if bwrap_path() is None:
            raise SandboxStartError("bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
        if not self.python.startswith("/usr/"):
            raise SandboxStartError(f"the sandbox's python must live under /usr, got {self.python!r}")

    def command(self, agent: list[str], slot: SandboxSlot) -> list[str]:
        size = str(self.limits.disk_bytes)
        devices = [arg for node in DEVICES for arg in ("--dev-bind", node, node)]
        return [
            bwrap_path() or "bwrap",
            "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--die-with-parent", "--new-session", "--hostname", "sandbox",
            # The root first: every later folder is made on it, in the one disk budget.
            "--size", size, "--tmpfs", "/",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc",
            "--dir", "/dev", *devices,
            "--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
            "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr",
            "--perms", "1777", "--dir", "/dev/shm",
            "--perms", "1777", "--dir", "/tmp",
            "--dir", "/workspace",
            "--chdir", "/workspace",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/workspace",
            "--", *agent,
        ]

    def popen_options(self, slot: SandboxSlot) -> dict[str, object]:
        # bwrap's own first process (PID 1 of the sandbox, readable from inside) keeps the
        # environment it was started with: never the server's.
        options: dict[str, object] = {"env": {"PATH": "/usr/bin:/bin"}}
        if slot.uid is not None:
            options.update(user=slot.uid, group=slot.uid, extra_groups=[])
        return options
