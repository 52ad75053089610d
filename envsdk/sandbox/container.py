"""`ContainerProvider`: sandboxes that are OCI containers, through podman (or a Docker daemon).

A task brings its machine as a Dockerfile; the provider builds it into an image
(`ContainerProvider.build_image`: cached by the content of the build context, under a build
deadline, offline: base images named by ``FROM`` come from `envsdk.sandbox.images`), starts
containers of it (`ContainerProvider.start`) and drives each through a `ContainerSandbox`:
``bash``/``run`` with a deadline and output caps, files in and out, every process stopped
(``stop_processes``: a restart; ``kill_processes``: where they are, nothing restarted) and the
container removed (``close``).

Each container gets, from `ContainerLimits`: ``--cpus``; ``--memory`` (and ``--memory-swap``,
the same: swap adds nothing) of ``memory_mb + storage_mb`` plus its exec tmpfs (below) and its
``tmpfs`` folders (root's tmpfs mounts, made anew, empty, at every start and restart);
``--pids-limit`` of ``pids`` plus the few processes the provider runs in it; ``--network none``
unless ``network``; ``--security-opt no-new-privileges``; labels that name its owner (this
process's pid and start time) so a later provider removes the containers of a server that was
killed (`ContainerProvider.remove_orphans`, run by each provider's first start). Its first
process is a bash that reaps what commands leave behind (`FIRST_PROCESS`), so the image needs
bash and coreutils.

Disk. No kernel quota is available for podman's store on these machines, so podman's store
lives on a tmpfs the engine mounts (as root): a container's files are then RAM, charged to its
memory cgroup, and ``memory_mb + storage_mb`` bounds its processes and its files together. Past
it the kernel's OOM killer ends a process of the container, a command's first (commands raise
their OOM score; the kept shell and the first process do not); the files stay, so until some
are removed each new process may be killed too, but the host and other containers are not
touched. Where the store is not a tmpfs (a Docker daemon, podman without root) a storage limit
cannot be held and `ContainerProvider.start` refuses unless ``allow_unbounded_disk=True``.

The store is shared (by every provider of every process on the machine that uses it), and its
tmpfs has a size: each container alone is bounded, but not their sum. So `ContainerProvider.start`
admits a container only where the store can hold all it may write (its whole memory limit)
beside what every running container was promised: what is free now (`os.statvfs`), less the
promises of running containers, less `STORE_SLACK_MB` for the engine, must cover it. The store's
pages are the host's RAM or swap, and a store can be mounted (or grown) larger than those: then
what the host can hold is the bound (its RAM and swap, less `host_reserve_mb` for everything
else and what the store holds now), and a store larger than the host's RAM and swap is said in
a warning when an engine prepares it. A start waits for that room (others end) for up to half
its ``start_timeout_s``; then a one-line `StoreFullError` (a `ContainerStartError`) says what to
do first (wait, grow the store, or, where the host is the bound, only wait), then the numbers.
Promises are kept in a small file under the engine's lock folder (`ContainerEngine.store_ledger`,
locked while read and written) with each container's owner; a promise of an owner that is gone
is dropped with its container (removed then). A container's files count both in what the store
has used and in its promise while it runs, so the store admits fewer containers than it could
once some have written much, never more (what a container wrote cannot be told, cheaply and
exactly, from what it holds in shared memory).

Commands. ``podman exec`` costs 0.1-0.15 s a call (its command-line client starts each time),
so each container keeps one bash running (started once by ``exec -i``, stdin and stdout
attached: `KEPT_SHELL`); a command is one line to it, answered with its exit status and output.
Each command runs in a subshell of it, as with ``bash -c`` (no state is kept between commands
but files), in a process group of its own: at the deadline the kept shell's watchdog kills the
group (the command and what it started in the background), again until none is left. What a command leaves running
past its end, within its deadline, keeps running (a service the agent started), as in a
terminal; what it writes later is dropped; `ContainerSandbox.stop_processes` ends it. stdout
and stderr go to files on a small tmpfs of the container (``/run/envsdk``), kept apart; at most
``output_bytes`` of each is returned and the byte counts are exact; together they may fill that
tmpfs (`EXEC_TMPFS_FACTOR` times ``output_bytes``), past which the command's writes fail (its
``note`` says so). A kept shell that dies (killed from inside, out of memory) or does not answer
by the deadline plus `REPLY_GRACE_S` is replaced, and the `CompletedRun` of that call says so.

Isolation is the engine's: namespaces (the container sees its own processes, files and
network), its default capabilities and seccomp filter, no new privileges. podman runs as root
here without a user namespace, so root inside is root on the host for whatever crosses those
walls (a kernel flaw); keep secrets off machines that run untrusted tasks.

Environment variables: ``ENVSDK_CONTAINER_ENGINE`` (``auto``, ``podman``, ``docker``: what
`ContainerEngine.detect` picks by default), ``ENVSDK_PODMAN_ROOT`` (podman's folder: its store
in ``storage/``, its ``containers.conf``; default ``/var/lib/envsdk/podman``),
``ENVSDK_CONTAINER_STORE_MB`` (the size of the store's tmpfs, default the host's RAM, at least
8192; a store of ours mounted smaller is grown to it; containers are admitted only as far as the
host's memory goes, whatever the size).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import logging
import os
import posixpath
import re
import secrets
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from envsdk.sandbox._locks import lock_by
from envsdk.sandbox._reap import kill_until_gone
from envsdk.sandbox.base import (
    CompletedRun,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxPathError,
    SandboxStartError,
)
from envsdk.sandbox.cgroups import _start_time

__all__ = [
    "ContainerEngine",
    "ContainerError",
    "ContainerLimits",
    "ContainerProvider",
    "ContainerSandbox",
    "ContainerStartError",
    "EngineOutputTooLarge",
    "ImageBuildError",
    "ImageUnavailableError",
    "StoreFullError",
    "StoreSpace",
    "host_reserve_mb",
]

logger = logging.getLogger("envsdk.sandbox")

#: podman's folder when the server runs as root: its store (a tmpfs) and its containers.conf.
DEFAULT_PODMAN_ROOT = Path("/var/lib/envsdk/podman")
DEFAULT_PODMAN_RUNROOT = Path("/run/envsdk/podman")
def _meminfo_mb(*fields: str) -> int:
    """The sum of `fields` of /proc/meminfo (``MemTotal``, ``SwapTotal``), in MiB; 0 when unread."""
    found = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    found += int(value.split()[0]) // 1024
    except (OSError, ValueError, IndexError):
        return 0
    return found


def _host_memory_mb() -> int:
    """The host's RAM and swap, in MiB: where the pages of a tmpfs (the store) can be."""
    return _meminfo_mb("MemTotal", "SwapTotal")


def host_reserve_mb(memory_mb: int) -> int:
    """Of a host's `memory_mb` of RAM and swap, what containers are never promised: the room of
    everything else on it (servers, the engine, the kernel): an eighth, at least 1 GiB."""
    return max(1024, memory_mb // 8)


#: The store's tmpfs size when nothing says otherwise: the host's RAM. A size is a cap, not RAM
#: taken: what is stored uses RAM, and every container's files are bounded by its own memory
#: limit. The store admits containers by their whole budget, so this is how many can run at
#: once, within what the host's memory holds (`StoreSpace.host_room_mb`).
DEFAULT_STORE_MB = max(8192, _meminfo_mb("MemTotal"))
#: podman's settings for these machines: the default ulimits raise RLIMIT_NOFILE, which is
#: refused here; crun refuses cgroup v1's hybrid layout, runc does not.
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
    'events_logger = "file"\n'
)
#: Labels of every container a provider starts (the owner: ``<pid>:<start time>``).
LABEL = "envsdk.sandbox"
OWNER_LABEL = "envsdk.owner"
HOST_LABEL = "envsdk.host"
#: Where, inside each container, a command's stdout, stderr and stdin are kept (a tmpfs).
EXEC_DIR = "/run/envsdk"
#: The exec tmpfs holds this many times ``output_bytes``: both streams of a command up to 16
#: times the cap each, and its stdin (at most 16 times the cap).
EXEC_TMPFS_FACTOR = 48
#: Processes the provider runs in each container beside the limit's ``pids``: the first
#: process and its sleep, the kept shell, its watchdog, one helper (stat, head).
OWN_PIDS = 5
#: How long past a command's deadline the host waits for the kept shell's answer before it
#: replaces the shell.
REPLY_GRACE_S = 5.0
#: How long a kept shell told to end (its input closed) may take before its client is killed.
SHELL_EXIT_S = 2.0
#: How long a build past its deadline may take to give up once its steps are killed.
BUILD_STOP_S = 10.0
#: How long the engine's own housekeeping calls (inspect, rm, restart, cp) may take.
ENGINE_CALL_S = 60.0
#: The most bytes of the engine's list of a container's changed files that are read
#: (`ContainerSandbox.changes`): about 300,000 paths of usual length.
CHANGES_BYTES = 32 << 20
#: Room of the store no container is promised: the engine's own files (a container's settings,
#: the rewritten list of layers) need it to start and remove containers.
STORE_SLACK_MB = 32
#: How often a start waiting for room in the store looks again.
STORE_POLL_S = 0.25
#: What `ContainerLimits.tmpfs` paths may be: absolute, plain names.
_TMPFS_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+", re.ASCII)

#: The container's first process: bash, because as PID 1 it reaps the processes that commands
#: leave behind when they end (a ``sleep`` would keep them as zombies, which count against the
#: process limit), waiting on a ``sleep`` so it does nothing else.
FIRST_PROCESS = "while :; do sleep 86400 & wait; done"
#: What the kept shell (bash, reading its commands from the host on stdin) runs first, sourced
#: from a file named ``bash`` whose first line runs each command: bash's own messages about a
#: command then read ``bash: line N: ...`` with N its line, as under ``bash -c``. Job
#: control (``set -m``) puts each command in a process group of its own; a watchdog (a
#: coprocess, also bash) kills a command's group at its deadline, again with builtins until no
#: member is left (a fork bomb races the first kill), so a command costs one fork and no exec.
#: ``__envsdk_run TOKEN DEADLINE CAP INPUT_LEN SCRIPT`` (then INPUT_LEN bytes of stdin): runs
#: SCRIPT in a subshell (as ``bash -c`` would: its own variables and exit; the kept shell's
#: own variables unset), its stdin the given bytes (else /dev/null), stdout and stderr into
#: files; answers ``TOKEN STATUS OUT ERR``, then the first CAP bytes of each stream, then
#: ``TOKEN``. Commands raise their own OOM score, so that out of memory the kernel ends them
#: before the kept shell, its watchdog or the first process.
#: ``__envsdk_put TOKEN LEN PATH`` (then LEN bytes): writes the bytes to PATH (its folder made
#: when missing); the bytes are read whole even when PATH cannot be written (the second
#: ``cat`` drains them), so they never reach the shell as commands; answers ``TOKEN STATUS
#: LEN`` and that many bytes of the error, then ``TOKEN``. A command's files are emptied once
#: read (a job it left in the background may still write to them: only what it writes after
#: counts) and removed every 64 commands (bash has no builtin to remove a file).
#: ``__envsdk_kill TOKEN SECONDS``: SIGKILL to every process of the container but the first and
#: the kept shell itself, in one call (``kill -1``: the kernel sends it to all at once, so no
#: process forks past it), from the kept shell's own process (a builtin: nothing is started);
#: then the watchdog, killed too, is started again, and the shell waits (builtins only) until
#: no task has the signal pending any more, i.e. none can finish a last system call; answers
#: ``TOKEN BUSY`` (1: some task still had it after SECONDS).
KEPT_SHELL = r"""__envsdk_eval() { eval "$__envsdk_script"; }
set -m
__envsdk_watch() {
  local cmd g t
  while read -r cmd g t; do
    if ! read -r -t "$t" cmd; then
      kill -KILL -- "-$g" 2> /dev/null
      for _ in {1..1000}; do kill -STOP -- "-$g" 2> /dev/null && kill -KILL -- "-$g" 2> /dev/null || break; done
      read -r cmd
    fi
  done
}
coproc __envsdk_dog { __envsdk_watch; }
__envsdk_n=0
__envsdk_run() {
  local tok=$1 t=$2 cap=$3 d=/run/envsdk n=$((__envsdk_n += 1)) i=/dev/null g rc so=0 se=0
  local o=$d/o.$n e=$d/e.$n
  if [ $((n % 64)) = 0 ]; then rm -f -- "$d"/[oei].*; fi
  if [ "$4" -gt 0 ]; then i=$d/i.$n; head -c "$4" > "$i"; fi
  __envsdk_script=$5
  (
    echo 1000 > /proc/self/oom_score_adj
    unset -v tok t cap d n i g rc so se o e __envsdk_n
    set --
    __envsdk_eval
  ) < "$i" > "$o" 2> "$e" &
  g=$!
  printf 'arm %s %s\n' "$g" "$t" >&"${__envsdk_dog[1]}"
  # With job control, wait also returns when the job is stopped (the watchdog stops, then
  # kills): wait again while it is there.
  while wait "$g"; rc=$?; [ "$rc" -gt 128 ] && kill -0 "$g" 2> /dev/null; do :; done
  printf 'disarm\n' >&"${__envsdk_dog[1]}"
  if [ -s "$o" ] || [ -s "$e" ]; then set -- $(stat -c %s -- "$o" "$e"); so=$1 se=$2; fi
  printf '%s %d %d %d\n' "$tok" "$rc" "$so" "$se"
  if [ "$so" -gt 0 ]; then head -c "$cap" -- "$o"; fi
  if [ "$se" -gt 0 ]; then head -c "$cap" -- "$e"; fi
  : > "$o"; : > "$e"; [ "$i" = /dev/null ] || : > "$i"
  printf '%s\n' "$tok"
}
__envsdk_kill() {
  local tok=$1 end=$((SECONDS + $2 + 1)) f key value busy=1
  kill -KILL -1 2> /dev/null
  wait "$__envsdk_dog_PID" 2> /dev/null
  coproc __envsdk_dog { __envsdk_watch; }
  while [ "$busy" = 1 ] && [ "$SECONDS" -lt "$end" ]; do
    busy=0
    for f in /proc/[1-9]*/task/[1-9]*/status; do
      case $f in /proc/1/*|"/proc/$BASHPID/"*) continue ;; esac
      while read -r key value; do
        case $key in SigPnd:|ShdPnd:) if (( 0x$value & 0x100 )); then busy=1; fi ;; esac
      done 2> /dev/null < "$f"
    done
  done
  printf '%s %d\n' "$tok" "$busy"
}
__envsdk_put() {
  local tok=$1 e=/run/envsdk/put.err rc
  head -c "$2" | {
    if [ -n "${3%/*}" ] && [ "${3%/*}" != "$3" ] && [ ! -d "${3%/*}" ]; then mkdir -p -- "${3%/*}"; fi
    cat > "$3" || { cat > /dev/null; false; }
  } 2> "$e"
  rc=$?
  printf '%s %d %d\n' "$tok" "$rc" "$(stat -c %s -- "$e")"
  cat -- "$e"
  printf '%s\n' "$tok"
}
"""


@dataclass(frozen=True)
class ContainerLimits:
    """What one container may use (see the module docstring for how each is held).

    cpus: CPU share (``--cpus``). memory_mb: its processes' RAM. storage_mb: the files it
    writes (charged with its memory; the container's memory limit is the sum of the two).
    pids: processes and threads. network: whether it may reach the network (default: none).
    output_bytes: stdout and stderr kept per command, each (the rest is counted).
    timeout_s: default deadline of a command. start_timeout_s: how long starting a container
    may take, until its kept shell answers. build_timeout_s: default deadline of an image build.
    tmpfs: folders the engine mounts with the container, ``(path, size in bytes)`` each: a tmpfs
    of root's, mode 0755, made anew, empty, at every start and restart (`ContainerSandbox.stop_processes`):
    no file, mode or ACL given it before is left. A mount point cannot be renamed or removed from
    inside. What the container writes there is RAM charged to its memory cgroup, so each size
    is added to its memory limit (`container_memory_mb`); what the engine copies in
    (`ContainerSandbox.copy_in`) is charged to the engine's process, bounded by the size.
    """

    cpus: float = 1.0
    memory_mb: int = 1024
    storage_mb: int = 1024
    pids: int = 256
    network: bool = False
    output_bytes: int = 1 << 20
    timeout_s: float = 30.0
    start_timeout_s: float = 60.0
    build_timeout_s: float = 600.0
    tmpfs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.network, bool):
            raise TypeError(f"ContainerLimits.network must be a bool, got {self.network!r}")
        for name, value in asdict(self).items():
            if name in ("network", "tmpfs"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ContainerLimits.{name} must be a positive number, got {value!r}")
            if name in ("memory_mb", "storage_mb", "pids", "output_bytes") and not isinstance(value, int):
                raise ValueError(f"ContainerLimits.{name} must be a whole number, got {value!r}")
        paths = [entry[0] if isinstance(entry, tuple) and len(entry) == 2 else None for entry in self.tmpfs]
        for entry, path in zip(self.tmpfs, paths):
            size = entry[1] if path is not None else None
            if (
                not isinstance(path, str) or not _TMPFS_PATH.fullmatch(path) or posixpath.normpath(path) != path
                or path == EXEC_DIR or path.startswith(EXEC_DIR + "/") or paths.count(path) > 1
                or isinstance(size, bool) or not isinstance(size, int) or size <= 0
            ):
                raise ValueError(
                    "ContainerLimits.tmpfs must be (absolute path of letters, digits, . _ -, size in bytes > 0) "
                    f"pairs, each path once and not {EXEC_DIR}, got {entry!r}"
                )

    @property
    def exec_tmpfs_bytes(self) -> int:
        """The size of the tmpfs holding each command's output and input."""
        return EXEC_TMPFS_FACTOR * self.output_bytes

    @property
    def container_memory_mb(self) -> int:
        """The container's memory limit: processes, files, the exec tmpfs and the `tmpfs` folders together."""
        return self.memory_mb + self.storage_mb + sum(
            -(-size // (1 << 20)) for size in (self.exec_tmpfs_bytes, *(size for _, size in self.tmpfs))
        )


class ContainerError(SandboxError):
    """Something went wrong with a container, an image or the container engine."""


class EngineOutputTooLarge(ContainerError):
    """An engine command wrote more output than its caller keeps (`ContainerEngine.call`)."""


class ImageBuildError(ContainerError):
    """A task's Dockerfile did not build (it failed, or took longer than its build deadline)."""


class ImageUnavailableError(ContainerError):
    """A base image named by ``FROM`` is neither in the store nor can be made offline."""


class ContainerStartError(ContainerError, SandboxStartError):
    """A container could not be started, or its kept shell did not answer in time."""


class StoreFullError(ContainerStartError):
    """The container store has no room for all a new container may write, beside what running
    containers were promised: a start to retry once some end (the store is not full, and stays so)."""


@dataclass(frozen=True)
class StoreSpace:
    """The room of a container store on a tmpfs (`ContainerProvider.store_space`), in MiB.

    size_mb: the tmpfs's size. free_mb: free now (images and what running containers wrote
    are used). promised_mb: what the `containers` running on it (of every process) may still
    write, as promised when each was admitted. memory_mb: the host's RAM and swap, where the
    tmpfs's pages and the containers' processes live (0: unknown, not counted). available_mb:
    what a new container may be promised: the store's free room, or the host's (`host_room_mb`)
    where that is less (a store grown past the host's memory), less the promises, less
    `STORE_SLACK_MB` kept for the engine."""

    store: Path
    size_mb: int
    free_mb: int
    promised_mb: int
    containers: int
    memory_mb: int = 0

    @property
    def used_mb(self) -> int:
        """What the store holds now: images and what running containers wrote."""
        return self.size_mb - self.free_mb

    @property
    def host_room_mb(self) -> int:
        """What the host's memory can hold of containers: its RAM and swap, less what the store
        holds now and `host_reserve_mb` for everything else on the host."""
        if not self.memory_mb:
            return self.free_mb
        return max(0, self.memory_mb - host_reserve_mb(self.memory_mb) - self.used_mb)

    @property
    def host_bound(self) -> bool:
        """Whether the host's memory, not the store's size, bounds what containers get."""
        return self.host_room_mb < self.free_mb

    @property
    def available_mb(self) -> int:
        return max(0, min(self.free_mb, self.host_room_mb) - self.promised_mb - STORE_SLACK_MB)


def _one_line(text: bytes | str, limit: int = 300) -> str:
    """The last non-empty line of an engine's output (where its error is), shortened."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _tmpfs_mb(path: Path) -> int:
    """The size of the file system at `path`, in MiB."""
    stat = os.statvfs(path)
    return stat.f_blocks * stat.f_frsize // (1 << 20)


def _mount_fstype(path: Path) -> str | None:
    """The file system type mounted exactly at `path`, or None when nothing is."""
    target = str(path)
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if fields.split()[4] == target:
            found = tail.split()[0]  # the last mount at a path is the one in use
    return found


def _owner() -> str:
    """This process's owner label: its pid and start time (a reused pid has another)."""
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def _owner_alive(owner: str) -> bool:
    """Whether the process of owner label `owner` (``<pid>:<start time>``) runs on this machine."""
    pid, _, started = owner.partition(":")
    return pid.isdigit() and str(_start_time(int(pid))) == started


def _host() -> str:
    """This machine and boot: a container of another machine (one Docker daemon for several)
    or of an earlier boot is judged by that, not by a pid of this one."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    return f"{socket.gethostname()}/{boot}"


class ContainerEngine:
    """The command-line client of podman or docker, and where podman keeps its images.

    podman (``kind="podman"``): its own store, apart from any other podman of the machine:
    ``root/storage`` (``root``: ``ENVSDK_PODMAN_ROOT``, default ``/var/lib/envsdk/podman``)
    on a tmpfs of ``store_mb`` (``ENVSDK_CONTAINER_STORE_MB``, default the host's RAM) that the engine
    mounts when it runs as root and nothing is mounted there yet (the mount stays: it is the
    image cache of every later server; ``umount`` it to free the RAM), its run state in
    ``runroot`` (``/run/envsdk/podman``), its settings in ``root/containers.conf`` (written by
    the engine: runc, cgroupfs, no default ulimits). Without root, podman's own defaults.

    docker (``kind="docker"``): the ``docker`` client, the daemon it reaches (``DOCKER_HOST``
    in `env` or the environment); its store is the daemon's, not bounded by this engine.
    """

    def __init__(
        self, kind: str = "podman", *, executable: str | None = None, root: Path | None = None,
        runroot: Path | None = None, store_mb: int | None = None, env: Mapping[str, str] | None = None,
    ) -> None:
        if kind not in ("podman", "docker"):
            raise ValueError(f"unknown container engine {kind!r}: podman or docker")
        self.kind = kind
        found = executable or shutil.which(kind)
        if found is None:
            hint = "apt-get install podman runc" if kind == "podman" else "install the docker client"
            raise ContainerError(f"{kind} is not installed ({hint})")
        self.executable = found
        self.env = {**os.environ, **(env or {})}
        self.root: Path | None = None
        self.runroot: Path | None = None
        self.store_mb = store_mb or int(os.environ.get("ENVSDK_CONTAINER_STORE_MB") or DEFAULT_STORE_MB)
        self._base: list[str] = []
        self._ready = False
        self._lock = threading.Lock()
        if kind == "podman" and os.geteuid() == 0:
            self.root = Path(root or os.environ.get("ENVSDK_PODMAN_ROOT") or DEFAULT_PODMAN_ROOT)
            if runroot is None:
                # Two stores must not share one run state.
                runroot = DEFAULT_PODMAN_RUNROOT if self.root == DEFAULT_PODMAN_ROOT else Path(
                    f"{DEFAULT_PODMAN_RUNROOT}-{hashlib.sha256(str(self.root).encode()).hexdigest()[:8]}"
                )
            self.runroot = Path(runroot)
            self.env["CONTAINERS_CONF"] = str(self.root / "containers.conf")
            self._base = [
                "--root", str(self.store), "--runroot", str(self.runroot), "--storage-driver", "overlay",
                "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--tmpdir", str(self.runroot / "libpod"),
            ]

    @classmethod
    def detect(cls, which: str | None = None, **options: Any) -> ContainerEngine:
        """The engine named by `which` (default ``ENVSDK_CONTAINER_ENGINE``, else ``auto``):
        ``podman``, ``docker``, or ``auto``: podman where it is installed, else docker."""
        which = which or os.environ.get("ENVSDK_CONTAINER_ENGINE") or "auto"
        if which == "auto":
            if shutil.which("podman"):
                which = "podman"
            elif shutil.which("docker"):
                which = "docker"
            else:
                raise ContainerError(
                    "no container engine: install podman (Debian: apt-get install podman runc) or a docker client"
                )
        if which not in ("podman", "docker"):
            raise ValueError(f"unknown container engine {which!r}: auto, podman or docker")
        return cls(which, **options)

    @property
    def store(self) -> Path | None:
        """podman's image and container store (None: the engine's or daemon's own)."""
        return None if self.root is None else self.root / "storage"

    @property
    def disk_bounded(self) -> bool:
        """Whether a container's files count in its memory limit (the store is a tmpfs)."""
        self.prepare()
        return self.store is not None and _mount_fstype(self.store) == "tmpfs"

    @property
    def work_dir(self) -> Path:
        """The working folder of every engine command: conmon, which podman starts for each
        container, writes files there (``oom`` when a container's process was killed out of
        memory), which must not land in whatever folder the server was started from."""
        base = self.runroot.parent if self.runroot is not None else Path(tempfile.gettempdir())
        path = base / "envsdk-engine"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    @property
    def lock_dir(self) -> Path:
        """Where builds of the same content, by any process, wait on one another."""
        base = self.runroot.parent if self.runroot is not None else Path(tempfile.gettempdir())
        path = base / "envsdk-container-locks"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    @property
    def store_ledger(self) -> Path | None:
        """The file of the store room promised to running containers, shared by every process
        on this store (None where the engine has no store of its own)."""
        if self.store is None:
            return None
        return self.lock_dir / f"store-{hashlib.sha256(str(self.store).encode()).hexdigest()[:16]}.json"

    def prepare(self) -> None:
        """Make podman's folders, mount its store's tmpfs (as root, where nothing is mounted)
        and write its containers.conf. Once; raises `ContainerError`."""
        with self._lock:
            if self._ready or self.root is None or self.store is None or self.runroot is None:
                self._ready = True
                return
            try:
                self.store.mkdir(parents=True, exist_ok=True, mode=0o700)
                self.runroot.mkdir(parents=True, exist_ok=True, mode=0o700)
                conf = self.root / "containers.conf"
                if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
                    partial = conf.with_suffix(f".{os.getpid()}.tmp")
                    partial.write_text(CONTAINERS_CONF)
                    partial.replace(conf)
            except OSError as exc:
                raise ContainerError(f"cannot prepare podman's folder {self.root}: {exc}") from exc
            if _mount_fstype(self.store) is None:
                result = subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={self.store_mb}m,mode=0700", "envsdk-podman-store",
                     str(self.store)],
                    capture_output=True, timeout=30, check=False,
                )
                # Lost to another process mounting it at the same moment: that mount serves.
                if result.returncode != 0 and _mount_fstype(self.store) is None:
                    raise ContainerError(
                        f"cannot mount the container store's tmpfs at {self.store}: {_one_line(result.stderr)}"
                    )
            elif _mount_fstype(self.store) == "tmpfs" and _tmpfs_mb(self.store) < self.store_mb:
                # A store of ours mounted smaller (an earlier default, another setting) grows; a
                # failure leaves it as it is, and the admission check counts what it holds.
                subprocess.run(["mount", "-o", f"remount,size={self.store_mb}m", str(self.store)],
                               capture_output=True, timeout=30, check=False)
            memory = _host_memory_mb()
            if _mount_fstype(self.store) == "tmpfs" and memory and _tmpfs_mb(self.store) > memory:
                logger.warning(
                    "the container store %s is a tmpfs of %d MiB, more than this host's %d MiB of RAM and swap: "
                    "containers are admitted only as far as the host's memory goes (%d MiB of it kept for the host)",
                    self.store, _tmpfs_mb(self.store), memory, host_reserve_mb(memory),
                )
            self._ready = True

    def argv(self, args: Sequence[str]) -> list[str]:
        """The whole command line of engine command `args`."""
        return [self.executable, *self._base, *args]

    def call(
        self, args: list[str], *, timeout: float, input: bytes | None = None, check: bool = True,
        max_output: int | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run engine command `args`; its process group is killed at `timeout` (then
        `ContainerError`). With `check`, a non-zero exit is a `ContainerError` naming the
        command and the engine's last line of error. `max_output`: the most bytes of standard
        output kept (for commands whose output a container's files decide, such as ``diff``);
        past it the command is killed and `EngineOutputTooLarge` raised, so that what an
        agent wrote cannot grow this process's memory without bound."""
        self.prepare()
        if max_output is not None and input is not None:
            raise ValueError("max_output is for commands without input")
        process = subprocess.Popen(
            self.argv(args), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, start_new_session=True, cwd=self.work_dir,
        )
        try:
            if max_output is None:
                out, err = process.communicate(input, timeout=timeout)
            else:
                out, err = _read_capped(process, timeout, max_output)
        except EngineOutputTooLarge:
            _signal_group(process, signal.SIGKILL)
            process.wait()
            raise EngineOutputTooLarge(
                f"{self.kind} {args[0]} wrote more than {max_output} bytes of output; it was stopped there"
            ) from None
        except subprocess.TimeoutExpired:
            # SIGTERM first: podman then removes what the command had started (a build's
            # working container); then the whole group goes.
            _signal_group(process, signal.SIGTERM)
            try:
                process.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process, signal.SIGKILL)
            process.communicate()
            raise ContainerError(f"{self.kind} {args[0]} did not finish in {timeout:g} s") from None
        except BaseException:
            _signal_group(process, signal.SIGKILL)
            process.wait()
            raise
        result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check and result.returncode != 0:
            raise ContainerError(f"{self.kind} {' '.join(args[:2])}: {_one_line(err or out)}")
        return result

    def image_exists(self, ref: str) -> bool:
        return self.call(["image", "inspect", "--format", "{{.Id}}", ref], timeout=ENGINE_CALL_S, check=False).returncode == 0

    def tag(self, src: str, dst: str) -> None:
        self.call(["tag", src, dst], timeout=ENGINE_CALL_S)

    def load_rootfs(self, tar: Path, name: str, *, changes: Sequence[str] = ()) -> None:
        """Make image `name` from root filesystem tarball `tar` (``import``), with Dockerfile
        instructions `changes` (``CMD ["bash"]``, ``ENV LANG=C.UTF-8``) applied."""
        args = ["import"]
        for change in changes:
            args += ["--change", change]
        self.call([*args, str(Path(tar).absolute()), name], timeout=600)

    def remove(self, containers: list[str]) -> int:
        """Kill and remove `containers` (names or ids) and their anonymous volumes, at once
        (no stop grace); those already gone are no error. How many were removed."""
        grace = ["-t", "0"] if self.kind == "podman" else []
        result = self.call(["rm", "-f", "-v", *grace, *containers], timeout=ENGINE_CALL_S, check=False)
        return len(result.stdout.split())

    def describe(self) -> dict[str, Any]:
        return {"engine": self.kind, "executable": self.executable,
                "store": None if self.store is None else str(self.store), "disk_bounded": self.disk_bounded}


def _cgroup_folders(name: str) -> list[Path]:
    """Folder `name` and every folder below it, parents first, in each mounted cgroup
    hierarchy (v1 controllers and v2)."""
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] in ("cgroup", "cgroup2"):
            # os.walk passes over folders removed while it walks (runc removes its own).
            for folder, _, _ in os.walk(Path(fields.split()[4]) / name):
                found.append(Path(folder))
    return found


def _cgroup_processes(name: str) -> set[int]:
    """The pids in cgroup folder `name` and below, in every hierarchy."""
    pids: set[int] = set()
    for folder in _cgroup_folders(name):
        try:
            pids.update(int(pid) for pid in (folder / "cgroup.procs").read_text().split())
        except OSError:
            continue
    return pids


def _read_capped(process: subprocess.Popen[bytes], timeout: float, max_output: int) -> tuple[bytes, bytes]:
    """Both outputs of `process` (no input) until it ends: `subprocess.TimeoutExpired` at
    `timeout` seconds, `EngineOutputTooLarge` past `max_output` bytes of standard output
    (standard error keeps its last `max_output` bytes). The caller kills the process."""
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + timeout
    out = bytearray()
    err = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout)
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk
                if buffer is out and len(out) > max_output:
                    raise EngineOutputTooLarge(f"more than {max_output} bytes")
                if buffer is err and len(err) > max_output:
                    del err[: len(err) - max_output]
    try:
        process.wait(max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(process.args, timeout) from None
    return bytes(out), bytes(err)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _StartRate:
    """At most `per_s` container starts a second, spaced evenly, across threads."""

    def __init__(self, per_s: float) -> None:
        if not per_s > 0:
            raise ValueError(f"starts_per_s must be positive, got {per_s!r}")
        self.interval = 1.0 / per_s
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


class _StoreLedger:
    """The store room promised to running containers: a JSON list of ``{"owner", "name",
    "mb"}`` in the file `path`, read and written by every process on the store under an
    exclusive lock (a file beside it), and replaced whole so that no reader sees half of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")

    @contextlib.contextmanager
    def entries(self, engine: ContainerEngine, deadline: float) -> Iterator[list[dict[str, Any]]]:
        """The promises, locked until the block ends, then written back when the block changed
        them. The promises of owners that are gone are dropped first, their containers
        removed. `ContainerError` when the lock is not had by `deadline`."""
        lock = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not lock_by(lock, deadline):
                raise ContainerError(f"the container store's promises ({self.path}) stayed locked by another process")
            entries = self._read()
            kept = [entry for entry in entries if _owner_alive(str(entry.get("owner", "")))]
            if len(kept) != len(entries):
                # Removed before their promises go: a container of a killed server may still write.
                gone = [str(entry.get("name")) for entry in entries if entry not in kept]
                _say_removed(engine.remove(gone))
            yield kept
            if kept != entries:
                self._write(kept)
        finally:
            os.close(lock)

    def _read(self) -> list[dict[str, Any]]:
        try:
            found = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            logger.warning("the container store's promises in %s cannot be read (%s): starting afresh", self.path, exc)
            return []
        return [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []

    def _write(self, entries: list[dict[str, Any]]) -> None:
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(entries))
        partial.replace(self.path)


def _context_digest(context: Path, dockerfile: str) -> str:
    """A digest of everything a build reads: every file's path, kind, executable bit and
    content (symbolic links by their target), and the Dockerfile's name."""
    digest = hashlib.sha256(f"dockerfile={dockerfile}\n".encode())
    for folder, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, context)
            if os.path.islink(path):
                digest.update(f"link {relative!r} {os.readlink(path)!r}\n".encode())
                continue
            mode = os.stat(path).st_mode
            digest.update(f"file {relative!r} {mode & 0o111:o}\n".encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        for name in dirs:
            digest.update(f"dir {os.path.relpath(os.path.join(folder, name), context)!r}\n".encode())
    return digest.hexdigest()


_open_sandboxes: weakref.WeakSet[ContainerSandbox] = weakref.WeakSet()
_names = itertools.count()


def _close_open_sandboxes() -> None:
    for sandbox in list(_open_sandboxes):
        with contextlib.suppress(Exception):  # at exit: remove what can be removed
            sandbox.close()


atexit.register(_close_open_sandboxes)


class ContainerProvider:
    """Builds task images and starts containers of them (see the module docstring).

    `limits` are the default of `start`; `starts_per_s` bounds how many containers it creates
    a second (a burst of resets waits its turn rather than overloading the engine);
    `allow_unbounded_disk` lets it start containers whose files it cannot bound.
    """

    name = "container"
    isolation = (
        "OCI container: own namespaces (pid, mount, net, ipc, uts), the image's root filesystem, cgroup limits "
        "on CPU, memory (files included where the store is a tmpfs) and processes, no network unless asked"
    )
    isolates = (
        "cpu", "memory", "processes", "disk (charged with memory)", "network", "host files", "other processes",
        "environment", "leftover processes",
    )

    def __init__(
        self, engine: ContainerEngine | None = None, *, limits: ContainerLimits | None = None,
        starts_per_s: float = 8.0, allow_unbounded_disk: bool = False,
    ) -> None:
        self.engine = engine or ContainerEngine.detect()
        self.limits = limits or ContainerLimits()
        self.starts_per_s = starts_per_s
        self.allow_unbounded_disk = allow_unbounded_disk
        self._rate = _StartRate(starts_per_s)
        ledger = self.engine.store_ledger
        self._ledger = None if ledger is None else _StoreLedger(ledger)
        #: The names of the containers started and not closed yet (those being started too),
        #: and how many times `remove_all` ran: a start it cut gives its container up.
        self._live: set[str] = set()
        self._removals = 0
        self._live_lock = threading.Lock()
        self._orphans_removed = False
        self._orphans_lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}
        self._build_locks_lock = threading.Lock()

    # ---------------------------------------------------------------- images

    def build_image(
        self, context: Path, *, name: str, dockerfile: str = "Dockerfile", timeout_s: float | None = None,
    ) -> str:
        """The image of `context`'s `dockerfile`: ``localhost/envsdk-task-<name>:<digest>``,
        built unless an image of the same content is already in the store (concurrent builds
        of the same content, by any process, wait for one). Offline (``--pull=never``): the
        base images its ``FROM`` lines name are made available first
        (`envsdk.sandbox.images.prepare_base`). Raises `ImageBuildError` (it failed, or took
        longer than `timeout_s`, default ``limits.build_timeout_s``) and `ImageUnavailableError`."""
        # Absolute: the engine runs in a folder of its own (`ContainerEngine.work_dir`).
        context = Path(context).absolute()
        path = context / dockerfile
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ImageBuildError(f"{path}: cannot read the Dockerfile: {exc}") from exc
        seconds = self.limits.build_timeout_s if timeout_s is None else timeout_s
        if not seconds > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        tag = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("._-") or "task"
        digest = _context_digest(context, dockerfile)[:16]
        ref = f"localhost/envsdk-task-{tag}:{digest}"
        deadline = time.monotonic() + seconds
        with self._build_lock(digest):
            lock = os.open(self.engine.lock_dir / f"build-{digest}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                if not lock_by(lock, deadline):
                    raise ImageBuildError(f"{path}: another build of the same content took longer than {seconds:g} s")
                if self.engine.image_exists(ref):
                    return ref
                self._prepare_bases(text, path)
                self._build(context, path, ref, deadline, seconds)
                return ref
            finally:
                os.close(lock)

    def _build_lock(self, digest: str) -> threading.Lock:
        with self._build_locks_lock:
            return self._build_locks.setdefault(digest, threading.Lock())

    def _prepare_bases(self, dockerfile_text: str, path: Path) -> None:
        # Imported here: envsdk.sandbox.images imports this module.
        from envsdk.sandbox.images import from_names, prepare_base

        prepare_base(self.engine, from_names(dockerfile_text, path=path))

    def _build(self, context: Path, path: Path, ref: str, deadline: float, seconds: float) -> None:
        from envsdk.sandbox.images import pull_allowed

        args = ["build", "-f", str(path), "-t", ref, "--force-rm"]
        group = f"envsdk-build-{os.getpid()}-{secrets.token_hex(4)}"
        if self.engine.kind == "podman":
            # The build's RUN steps run in cgroups below `group`: at the deadline they are
            # killed there, so the step fails and podman removes its working container itself.
            pull = "missing" if pull_allowed() else "never"
            args += [f"--pull={pull}", "--layers=false", "--cgroup-parent", f"/{group}"]
        process = subprocess.Popen(
            self.engine.argv([*args, str(context)]), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=self.engine.env, start_new_session=True, cwd=self.engine.work_dir,
        )
        try:
            output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            output = self._stop_build(process, group)
            raise ImageBuildError(f"{path}: the image build took longer than {seconds:g} s") from None
        except BaseException:
            self._stop_build(process, group)
            raise
        finally:
            for folder in reversed(_cgroup_folders(group)):
                try:
                    folder.rmdir()
                except OSError:
                    pass
        if process.returncode != 0:
            raise ImageBuildError(f"{path}: the image build failed: {_one_line(output)}")

    @staticmethod
    def _stop_build(process: subprocess.Popen[bytes], group: str) -> bytes:
        """Kill a build's running step (and again, each next step) until the build gives up,
        then the build itself if it has not within `BUILD_STOP_S`."""
        stop_by = time.monotonic() + BUILD_STOP_S
        while time.monotonic() < stop_by:
            kill_until_gone(lambda: _cgroup_processes(group))
            try:
                output, _ = process.communicate(timeout=0.2)
                return output
            except subprocess.TimeoutExpired:
                continue
        _signal_group(process, signal.SIGKILL)
        kill_until_gone(lambda: _cgroup_processes(group))
        output, _ = process.communicate()
        return output

    # ---------------------------------------------------------------- containers

    def start(
        self, image: str, *, limits: ContainerLimits | None = None, workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ContainerSandbox:
        """A started container of `image` whose kept shell answers, within
        ``limits.start_timeout_s`` (after its turn under ``starts_per_s``). `workdir`: where
        commands and relative paths start (default: the image's working folder). Raises
        `ContainerStartError` (one line, naming the image); `StoreFullError` when the store
        has no room for all the container may write, within half of ``start_timeout_s`` (see
        the module docstring)."""
        limits = limits or self.limits
        bounded = self.engine.disk_bounded
        if not self.allow_unbounded_disk and not bounded:
            raise ContainerStartError(
                f"{self.engine.kind}'s store is not a tmpfs, so a container's storage_mb ({limits.storage_mb}) cannot "
                "be held; run as root with podman (its store then lives on a tmpfs) or pass allow_unbounded_disk=True"
            )
        self._remove_orphans_once()
        self._rate.wait()
        deadline = time.monotonic() + limits.start_timeout_s
        name = f"envsdk-{os.getpid()}-{next(_names)}-{secrets.token_hex(3)}"
        if bounded:
            # Room may free up as other containers end: wait for it, with half the start's time.
            self._promise(name, image, limits.container_memory_mb, deadline - limits.start_timeout_s / 2)
        with self._live_lock:
            self._live.add(name)
            removals = self._removals
        try:
            sandbox = self._run_container(image, name, limits, workdir, env, deadline)
        except BaseException:
            self._forget(name)
            raise
        with self._live_lock:
            cut = self._removals != removals
        if cut:
            sandbox.close()
            raise ContainerStartError(
                f"cannot start a container of {image}: every container of its provider was removed meanwhile "
                "(the server is shutting down)"
            )
        return sandbox

    def _run_container(
        self, image: str, name: str, limits: ContainerLimits, workdir: str | None, env: Mapping[str, str] | None,
        deadline: float,
    ) -> ContainerSandbox:
        args = [
            "run", "-d", "--name", name, "--hostname", "sandbox",
            "--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}={_owner()}", "--label", f"{HOST_LABEL}={_host()}",
            "--cpus", f"{limits.cpus:g}", "--memory", f"{limits.container_memory_mb}m",
            "--memory-swap", f"{limits.container_memory_mb}m", "--pids-limit", str(limits.pids + OWN_PIDS),
            "--security-opt", "no-new-privileges", "--log-driver", "none", "--stop-timeout", "0",
            "--tmpfs", f"{EXEC_DIR}:rw,size={limits.exec_tmpfs_bytes},mode=0700",
            "--entrypoint", "bash",
        ]
        for path, size in limits.tmpfs:
            args += ["--tmpfs", f"{path}:rw,exec,size={size},mode=0755"]
        if not limits.network:
            args += ["--network", "none"]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        try:
            result = self.engine.call([*args, image, "-c", FIRST_PROCESS], timeout=max(deadline - time.monotonic(), 0.1))
        except ContainerError as exc:
            # A run that timed out may still have made the container.
            self.engine.remove([name])
            detail = str(exc).split(": ", 1)[-1]
            if "executable file" in detail and "not found" in detail:
                raise ContainerStartError(f"the image {image} has no bash ({detail})") from None
            raise ContainerStartError(f"cannot start a container of {image}: {detail}") from None
        container_id = result.stdout.decode().strip().splitlines()[-1]
        sandbox = ContainerSandbox(self, container_id, image, limits, workdir, name=name)
        try:
            sandbox._open_shell(deadline)
        except SandboxError as exc:
            sandbox.close()
            raise ContainerStartError(f"container of {image} did not start: {exc}") from None
        return sandbox

    def store_space(self) -> StoreSpace | None:
        """The room of the store for containers (see the module docstring); None where the
        store is not a tmpfs of the engine's (nothing is promised there)."""
        if self._ledger is None or not self.engine.disk_bounded:
            return None
        with self._ledger.entries(self.engine, time.monotonic() + ENGINE_CALL_S) as entries:
            return self._space(entries)

    def _space(self, entries: list[dict[str, Any]]) -> StoreSpace:
        store = self.engine.store
        assert store is not None
        stats = os.statvfs(store)
        return StoreSpace(
            store=store, size_mb=stats.f_blocks * stats.f_frsize >> 20, free_mb=stats.f_bavail * stats.f_frsize >> 20,
            promised_mb=sum(int(entry.get("mb", 0)) for entry in entries), containers=len(entries),
            memory_mb=_host_memory_mb(),
        )

    def _promise(self, name: str, image: str, need_mb: int, wait_until: float) -> None:
        """Promise container `name` `need_mb` of the store, waiting until `wait_until` for the
        room, or refuse it in one line."""
        assert self._ledger is not None
        waited = time.monotonic()
        while True:
            try:
                with self._ledger.entries(self.engine, max(wait_until, time.monotonic() + 1.0)) as entries:
                    space = self._space(entries)
                    if need_mb <= space.available_mb:
                        entries.append({"owner": _owner(), "name": name, "mb": need_mb})
                        return
            except ContainerError as exc:
                raise ContainerStartError(f"cannot start a container of {image}: {exc}") from None
            if time.monotonic() >= wait_until:
                raise StoreFullError(_store_full(space, image, need_mb, time.monotonic() - waited))
            time.sleep(min(STORE_POLL_S, max(wait_until - time.monotonic(), 0.0)))

    def _forget(self, *names: str) -> None:
        """Containers `names` are gone: their promises of store room too."""
        with self._live_lock:
            self._live.difference_update(names)
        if self._ledger is None:
            return
        try:
            with self._ledger.entries(self.engine, time.monotonic() + ENGINE_CALL_S) as entries:
                entries[:] = [entry for entry in entries if entry.get("name") not in names]
        except (ContainerError, OSError) as exc:
            # Kept until this process ends (then dropped by the next reader): room lost, never overpromised.
            logger.warning("cannot drop the store promise of container(s) %s: %s", ", ".join(names), exc)

    def remove_all(self) -> int:
        """Kill and remove every container this provider started and has not closed (a server's
        shutdown), at once and without waiting for the calls running in them: those return
        (a command as killed, returncode -9), the sandboxes then close at no cost. A start under
        way when it runs gives its container up (`ContainerStartError`); later starts work as
        before. How many were removed."""
        with self._live_lock:
            names = sorted(self._live)
            self._removals += 1
        if not names:
            return 0
        removed = self.engine.remove(names)
        self._forget(*names)
        return removed

    def remove_orphans(self) -> int:
        """Remove the containers of owners that are gone (servers killed before they could
        close them) on this machine; how many were removed (a line in the log says it)."""
        listed = self.engine.call(
            ["ps", "-a", "--filter", f"label={LABEL}=1", "--format", "{{.ID}} {{json .Labels}}"],
            timeout=ENGINE_CALL_S,
        )
        host = _host()
        orphans = []
        for line in listed.stdout.decode().splitlines():
            if not line.strip():
                continue
            container_id, _, raw = line.partition(" ")
            labels = _labels(json.loads(raw))
            if labels.get(HOST_LABEL, host).split("/")[0] != host.split("/")[0]:
                continue  # another machine's, sharing a daemon
            if labels.get(HOST_LABEL) != host or not _owner_alive(labels.get(OWNER_LABEL, "")):
                orphans.append(container_id)
        if not orphans:
            return 0
        removed = self.engine.remove(orphans)
        _say_removed(removed)
        return removed

    def _remove_orphans_once(self) -> None:
        with self._orphans_lock:
            if not self._orphans_removed:
                self.remove_orphans()
                self._orphans_removed = True

    def describe(self) -> dict[str, Any]:
        """What the provider isolates, its engine and store, and its default limits."""
        space = self.store_space()
        room = None if space is None else {
            "size_mb": space.size_mb, "free_mb": space.free_mb, "promised_mb": space.promised_mb,
            "containers": space.containers, "host_memory_mb": space.memory_mb, "host_room_mb": space.host_room_mb,
            "available_mb": space.available_mb,
        }
        return {
            "provider": self.name, "isolation": self.isolation, "isolates": list(self.isolates),
            "limits": asdict(self.limits), "starts_per_s": self.starts_per_s,
            "allow_unbounded_disk": self.allow_unbounded_disk, **self.engine.describe(), "store_space": room,
        }


def _store_full(space: StoreSpace, image: str, need_mb: int, waited_s: float) -> str:
    """`StoreFullError`'s line: what to act on first (a server may cut an error message short),
    then the numbers."""
    running = f"{space.containers} running container{'' if space.containers == 1 else 's'}"
    tail = (
        f"{STORE_SLACK_MB} MiB kept for the engine, waited {waited_s:.0f} s "
        "(a container needs memory_mb + storage_mb + its command output and tmpfs folders)"
    )
    if space.host_bound:
        return (
            f"this host's memory has {space.available_mb} MiB left for containers and a container of {image} needs "
            f"{need_mb} MiB: retry once containers end (the store {space.store}, {space.size_mb} MiB, is larger than "
            f"the host can hold: growing it adds no room); {space.memory_mb} MiB of RAM and swap, "
            f"{host_reserve_mb(space.memory_mb)} MiB of it kept for the host, {space.used_mb} MiB held by the store, "
            f"{space.promised_mb} MiB promised to {running}, {tail}"
        )
    return (
        f"the container store has {space.available_mb} MiB left and a container of {image} needs "
        f"{need_mb} MiB: retry once containers end, or grow the store (mount -o remount,size=<MB>m "
        f"{space.store}); {space.free_mb} MiB free, {space.promised_mb} MiB of it promised to {running}, {tail}"
    )


def _say_removed(count: int) -> None:
    if count:
        logger.warning(
            "removed %d container%s left by a process that is gone (a server killed before it could remove them)",
            count, "" if count == 1 else "s",
        )


def _labels(raw: Any) -> dict[str, str]:
    """A container's labels from ``{{json .Labels}}``: podman gives an object, docker a
    ``k=v,k=v`` string."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, str):
        return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {}


class _KeptShell:
    """The bash kept running in a container (``exec -i``), and the host's end of its pipes."""

    def __init__(self, engine: ContainerEngine, container_id: str) -> None:
        self.engine = engine
        # The client's own errors (and bash's) go to a file: nothing to drain, nothing blocks.
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.process = subprocess.Popen(
            engine.argv(["exec", "-i", container_id, "bash", "--noprofile", "--norc"]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=engine.env,
            start_new_session=True, cwd=engine.work_dir,
        )
        self.pid: int | None = None  # the shell's pid inside the container
        self._buffer = b""

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, data: bytes) -> None:
        """Raises OSError when the shell is gone."""
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def read_line(self, deadline: float, limit: int = 4096) -> bytes:
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                raise _ShellBroken("an answer line too long")
            self._fill(deadline)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def read_exact(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            self._fill(deadline)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _fill(self, deadline: float) -> None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise _ShellHung()
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise _ShellBroken("the kept shell ended")
        self._buffer += chunk

    def error_tail(self) -> str:
        self.errors.seek(0, os.SEEK_END)
        self.errors.seek(max(self.errors.tell() - 2000, 0))
        return _one_line(self.errors.read())

    def close(self, grace_s: float = 0.0) -> None:
        """End the client. `grace_s`: first close the shell's stdin and give it that long to
        end on its own (an exec session that ends normally leaves nothing behind in the
        engine; one cut off may leave its monitor waiting, as podman's Docker API does)."""
        if grace_s > 0 and self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace_s)
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.errors.close()


class _CopyError(ContainerError, SandboxPathError):
    """A copy in or out failed (a path that is not there, or cannot be written)."""


class _ShellBroken(Exception):
    """The kept shell ended, or answered out of protocol."""


class _ShellHung(Exception):
    """The kept shell did not answer in time."""


class ContainerSandbox:
    """One started container (see the module docstring). Methods block; each has a deadline;
    calls from several threads are serialised. `close` is idempotent and also runs at exit."""

    def __init__(
        self, provider: ContainerProvider, container_id: str, image: str, limits: ContainerLimits,
        workdir: str | None = None, *, name: str | None = None,
    ) -> None:
        self.provider = provider
        self.engine = provider.engine
        self.id = container_id
        #: The container's name in the engine (its id where it was given none).
        self.name = name or container_id
        self.image = image
        self.limits = limits
        #: Where commands and relative paths start (the image's working folder unless `start`
        #: named one; made when missing).
        self.workdir = workdir or "/"
        self._asked_workdir = workdir
        self._shell: _KeptShell | None = None
        self._lock = threading.Lock()
        self._closed = False
        _open_sandboxes.add(self)

    @property
    def alive(self) -> bool:
        """Not closed, and its kept shell (or the container, to make another) is there."""
        return not self._closed and (self._shell is None or self._shell.alive() or self._running())

    def __enter__(self) -> ContainerSandbox:  # noqa: PYI034 - as Sandbox.__enter__
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- commands

    def bash(self, script: str, *, timeout: float | None = None) -> CompletedRun:
        """Run `script` with ``bash -c`` in the working folder, stdin empty; killed, with
        whatever it started in its process group, at `timeout` (default ``limits.timeout_s``:
        then returncode -9 and ``timed_out``). Another status is bash's (128 + N: signal N)."""
        return self._run(script, script, b"", self._timeout(timeout))

    def run(self, command: Sequence[str], *, input: bytes | None = None, timeout: float | None = None) -> CompletedRun:
        """Run argv `command` (``command[0]`` looked up on the container's PATH) with `input`
        on stdin (at most 16 times ``output_bytes``); otherwise as `bash`."""
        argv = list(command)
        if not argv:
            raise ValueError("command is empty")
        data = input or b""
        if len(data) > 16 * self.limits.output_bytes:
            raise ValueError(f"input of {len(data)} bytes is over 16 times output_bytes ({self.limits.output_bytes})")
        return self._run(argv, "exec " + shlex.join(argv), data, self._timeout(timeout))

    def write_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` (absolute, or relative to the working folder); its folder is
        made when missing. Raises `SandboxPathError` where it cannot be written."""
        self._check_path(path)
        with self._lock:
            self._ensure_shell()
            shell = self._shell
            assert shell is not None
            token = secrets.token_hex(8)
            deadline = time.monotonic() + self.limits.timeout_s + REPLY_GRACE_S
            try:
                shell.send(f"__envsdk_put {token} {len(data)} {shlex.quote(path)}\n".encode() + data)
                status, size = self._header(shell, token, deadline, 2)
                error = shell.read_exact(size, deadline)
                if shell.read_line(deadline) != token.encode():
                    raise _ShellBroken("an answer out of protocol")
            except (OSError, _ShellBroken, _ShellHung) as exc:
                self._drop_shell(kill_inside=True)
                raise SandboxError(f"write {path!r}: the container's kept shell failed ({_why(exc)})") from None
        if status != 0:
            raise SandboxPathError(f"write {path!r}: {_one_line(error)}")

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The first `max_bytes` (default ``limits.output_bytes``, at most 16 times that: it
        passes through the exec tmpfs; `copy_out` takes files of any size) of file `path`.
        Raises `SandboxPathError` where it cannot be read."""
        self._check_path(path)
        cap = self.limits.output_bytes if max_bytes is None else max_bytes
        if not 0 <= cap <= 16 * self.limits.output_bytes:
            raise ValueError(
                f"max_bytes must be between 0 and 16 times output_bytes ({16 * self.limits.output_bytes}), got {cap!r}"
            )
        run = self._run(["read", path], f"exec head -c {cap} -- {shlex.quote(path)}", b"",
                        self.limits.timeout_s, cap=max(cap, 1))
        if run.returncode != 0:
            raise SandboxPathError(f"read {path!r}: {_one_line(run.stderr).removeprefix('head: ')}")
        return run.stdout[:cap]

    def copy_in(self, src: Path, dst: str) -> None:
        """Copy host file or folder `src` to `dst` in the container (`dst` becomes the copy;
        a folder's contents are merged into `dst` when it exists)."""
        src = Path(src).absolute()  # the engine runs in a folder of its own
        if not src.exists():
            raise FileNotFoundError(f"copy_in: {src} does not exist")
        self._check_path(dst)
        target = dst if dst.startswith("/") else f"{self.workdir.rstrip('/')}/{dst}"
        parent = target.rstrip("/").rsplit("/", 1)[0] or "/"
        made = self.bash(f"mkdir -p -- {shlex.quote(parent)}", timeout=self.limits.timeout_s)
        if made.returncode != 0:
            raise SandboxPathError(f"copy_in {dst!r}: {_one_line(made.stderr)}")
        source = f"{src}/." if src.is_dir() else str(src)
        self._engine_call(["cp", source, f"{self.id}:{target}"], f"copy_in {dst!r}", _CopyError)

    def copy_out(self, src: str, dst: Path) -> None:
        """Copy file or folder `src` of the container to host path `dst` (which becomes the
        copy; a folder's contents are merged into `dst` when it exists)."""
        self._check_path(src)
        source = src if src.startswith("/") else f"{self.workdir.rstrip('/')}/{src}"
        dst = Path(dst).absolute()  # the engine runs in a folder of its own
        dst.parent.mkdir(parents=True, exist_ok=True)
        kind = self.bash(f"test -d {shlex.quote(source)}", timeout=self.limits.timeout_s).returncode
        self._engine_call(["cp", f"{self.id}:{source.rstrip('/')}{'/.' if kind == 0 else ''}", str(dst)],
                          f"copy_out {src!r}", _CopyError)

    def stop_processes(self) -> None:
        """Kill every process of the container (it restarts with its first process alone);
        its files stay, the exec tmpfs is emptied, a new kept shell answers."""
        with self._lock:
            self._check_open()
            self._drop_shell()
            self._engine_call(["restart", "-t", "0", self.id], "stop_processes")
            self._open_shell_locked(time.monotonic() + self.limits.start_timeout_s)

    def kill_processes(self, timeout: float = 10.0) -> None:
        """Kill every process of the container but its first (and the kept shell), where they
        are, and wait until none of them can act any more: unlike `stop_processes` nothing
        restarts, so the files, those of the `ContainerLimits.tmpfs` folders included, stay as
        the processes left them, to be read. One signal reaches them all at once (``kill -1``
        from inside: no process forks past it), and the wait lasts until no task has it pending
        (a killed task may still end the system call it was in). `ContainerError` when some
        task still had it after `timeout` seconds, or the kept shell failed."""
        with self._lock:
            self._ensure_shell()
            shell = self._shell
            assert shell is not None
            token = secrets.token_hex(8)
            seconds = max(1, round(timeout))
            try:
                shell.send(f"__envsdk_kill {token} {seconds}\n".encode())
                (busy,) = self._header(shell, token, time.monotonic() + seconds + 1 + REPLY_GRACE_S, 1)
            except (OSError, _ShellBroken, _ShellHung) as exc:
                self._drop_shell(kill_inside=True)
                raise ContainerError(f"kill_processes: the container's kept shell failed ({_why(exc)})") from None
        if busy:
            raise ContainerError(f"kill_processes: processes of the container were still ending after {seconds} s")

    def get_archive(self, path: str, *, max_bytes: int) -> bytes:
        """A tar archive of file or folder `path` (absolute, or relative to the working folder),
        as the engine writes it (``cp CONTAINER:PATH -``): read by the engine, no program of the
        container takes part; the `ContainerLimits.tmpfs` folders are read while the container
        runs. A link at `path` itself is followed inside the container. `SandboxPathError`
        when `path` cannot be copied (nothing there); `EngineOutputTooLarge` when the archive
        is over `max_bytes`: the copy is stopped there, so a file of any size (a sparse one,
        which costs its container nothing) costs this process at most that much."""
        self._check_path(path)
        self._check_open()
        source = path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"
        try:
            copied = self.engine.call(["cp", f"{self.id}:{source}", "-"], timeout=ENGINE_CALL_S, check=False,
                                      max_output=max_bytes)
        except EngineOutputTooLarge:
            raise EngineOutputTooLarge(f"get_archive {path!r}: the archive is over {max_bytes} bytes") from None
        if copied.returncode != 0:
            raise _CopyError(f"get_archive {path!r}: {_one_line(copied.stderr).removeprefix('Error: ')}")
        return copied.stdout

    def changes(
        self, *, stop: bool = False, timeout: float = ENGINE_CALL_S, max_bytes: int = CHANGES_BYTES,
    ) -> list[tuple[str, str]]:
        """What was changed in the container's files relative to its image, as the engine reads
        it from its storage on the host (no program of the container takes part): ``(kind,
        path)`` pairs sorted by path, kind ``"A"`` added, ``"C"`` changed (a folder is also
        listed when something in it changed) or ``"D"`` deleted. Mounts (the exec tmpfs)
        are not looked into. `stop`: stop the container first (every process killed, none
        started), so that nothing can change its files after the list is taken;
        `stop_processes` starts it again (other calls then find it gone). `ContainerError`
        when the engine fails or takes longer than `timeout` seconds in all; `EngineOutputTooLarge`
        when the engine's list is over `max_bytes` (the container's files decide its size)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check_open()
            if stop:
                self._drop_shell()
                self.engine.call(["stop", "-t", "0", self.id], timeout=max(deadline - time.monotonic(), 0.1))
            if self.engine.kind == "podman":
                listed = self.engine.call(["diff", "--format", "json", self.id],
                                          timeout=max(deadline - time.monotonic(), 0.1), max_output=max_bytes)
                found = json.loads(listed.stdout or b"{}") or {}
                kinds = {"added": "A", "changed": "C", "deleted": "D"}
                pairs = [(kinds[key], path) for key in kinds for path in found.get(key) or ()]
            else:
                listed = self.engine.call(["diff", self.id], timeout=max(deadline - time.monotonic(), 0.1),
                                          max_output=max_bytes)
                pairs = []
                for line in listed.stdout.decode("utf-8", "surrogateescape").split("\n"):
                    if line[:1] in ("A", "C", "D") and line[1:3] == " /":
                        pairs.append((line[0], line[2:]))
                    elif pairs and line:
                        # A name holding a newline: its text goes on on the next line.
                        pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]}\n{line}")
        return sorted(pairs, key=lambda pair: pair[1])

    def close(self) -> None:
        """Remove the container (its processes, files and anonymous volumes). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._drop_shell()
            self.engine.remove([self.id])
            _open_sandboxes.discard(self)
        self.provider._forget(self.name)

    # ---------------------------------------------------------------- internals

    def _timeout(self, timeout: float | None) -> float:
        seconds = self.limits.timeout_s if timeout is None else timeout
        if isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        return float(seconds)

    @staticmethod
    def _check_path(path: str) -> None:
        if not isinstance(path, str) or not path or "\0" in path:
            raise SandboxPathError(f"not a path: {path!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed("the container is closed")

    def _running(self) -> bool:
        result = self.engine.call(["inspect", "--format", "{{.State.Running}}", self.id],
                                  timeout=ENGINE_CALL_S, check=False)
        return result.returncode == 0 and result.stdout.strip() == b"true"

    def _engine_call(self, args: list[str], what: str, error: type[ContainerError] = ContainerError) -> None:
        try:
            self.engine.call(args, timeout=ENGINE_CALL_S)
        except ContainerError as exc:
            detail = str(exc).split(": ", 1)[-1].removeprefix("Error: ")
            raise error(f"{what}: {detail}") from None

    def _open_shell(self, deadline: float) -> None:
        with self._lock:
            self._open_shell_locked(deadline)

    def _open_shell_locked(self, deadline: float) -> None:
        shell = _KeptShell(self.engine, self.id)
        token = secrets.token_hex(8)
        try:
            enter = ""
            if self._asked_workdir is not None:
                folder = shlex.quote(self._asked_workdir)
                enter = f"mkdir -p -- {folder} 2>/dev/null; cd -- {folder} || exit 1; "
            shell.send(
                f"cat > {EXEC_DIR}/bash <<'__ENVSDK_END__'\n{KEPT_SHELL}__ENVSDK_END__\n"
                f'__envsdk_wd=$PWD; builtin cd {EXEC_DIR} && shopt -u sourcepath && . bash && shopt -s sourcepath; '
                f'builtin cd -- "$__envsdk_wd"; {enter}'
                f'if command -v head stat >/dev/null; then echo "{token} ok $$ $PWD"; '
                f'else echo "{token} missing"; fi\n'.encode()
            )
            line = shell.read_line(deadline).decode("utf-8", "replace")
        except (OSError, _ShellBroken, _ShellHung) as exc:
            detail = shell.error_tail() if not shell.alive() else ""
            shell.close()
            if "executable file" in detail and "not found" in detail:
                raise SandboxStartError(f"the image {self.image} has no bash ({detail})") from None
            raise SandboxStartError(f"its kept shell did not answer ({_why(exc)}) {detail}".strip()) from None
        fields = line.split(" ", 3)
        if fields[:2] != [token, "ok"] or len(fields) < 4:
            shell.close()
            raise SandboxStartError(f"the image {self.image} lacks head or stat (coreutils)")
        shell.pid, self.workdir = int(fields[2]), fields[3]
        self._shell = shell

    def _ensure_shell(self) -> str:
        """Open a kept shell where there is none (or it ended); why, or '' when there was one."""
        self._check_open()
        if self._shell is not None and self._shell.alive():
            return ""
        # A shell dropped by a call has been reported by that call; one found dead, not yet.
        why = "" if self._shell is None else (
            "the container's kept shell had ended (killed from inside, or out of memory); a new one was started"
        )
        self._drop_shell()
        try:
            self._open_shell_locked(time.monotonic() + self.limits.start_timeout_s)
        except SandboxError:
            if not self._running():
                self._close_locked_after_death()
                raise SandboxDied(f"the container of {self.image} is gone (its first process ended)") from None
            raise
        return why

    def _drop_shell(self, kill_inside: bool = False) -> None:
        """Forget the kept shell: it is asked to end (end of its input), then its client is
        killed. `kill_inside`: where it does not answer, also kill it in the container (ending
        the client does not end it there)."""
        shell, self._shell = self._shell, None
        if shell is None:
            return
        if kill_inside and shell.pid is not None:
            self.engine.call(["exec", self.id, "bash", "-c", f"kill -KILL {shell.pid}"],
                             timeout=ENGINE_CALL_S, check=False)
        shell.close(grace_s=SHELL_EXIT_S)

    def _close_locked_after_death(self) -> None:
        self._closed = True
        self.engine.remove([self.id])
        _open_sandboxes.discard(self)
        self.provider._forget(self.name)

    @staticmethod
    def _header(shell: _KeptShell, token: str, deadline: float, count: int) -> list[int]:
        fields = shell.read_line(deadline).split()
        if len(fields) != count + 1 or fields[0] != token.encode():
            raise _ShellBroken("an answer out of protocol")
        return [int(field) for field in fields[1:]]

    def _run(self, args: Any, script: str, data: bytes, seconds: float, cap: int | None = None) -> CompletedRun:
        if "\0" in script:
            raise ValueError("a command may not contain a NUL byte")
        cap = self.limits.output_bytes if cap is None else cap
        with self._lock:
            note = self._ensure_shell()
            restarted = bool(note)
            shell = self._shell
            assert shell is not None
            token = secrets.token_hex(8)
            started = time.monotonic()
            deadline = started + seconds + REPLY_GRACE_S
            try:
                shell.send(
                    f"__envsdk_run {token} {seconds:.3f} {cap} {len(data)} {shlex.quote(script)}\n".encode(
                        "utf-8", "surrogateescape") + data
                )
                status, out_size, err_size = self._header(shell, token, deadline, 3)
                out = shell.read_exact(min(out_size, cap), deadline)
                err = shell.read_exact(min(err_size, cap), deadline)
                if shell.read_line(deadline) != token.encode():
                    raise _ShellBroken("an answer out of protocol")
            except (OSError, _ShellBroken, _ShellHung) as exc:
                hung = isinstance(exc, _ShellHung)
                self._drop_shell(kill_inside=True)
                return CompletedRun(
                    args=args, returncode=-9, stdout=b"", stderr=b"", stdout_bytes=0, stderr_bytes=0,
                    timed_out=hung, duration_s=time.monotonic() - started, restarted=True,
                    note=(
                        "the container's kept shell " + ("did not answer by the deadline" if hung else "died")
                        + " during this command (killed from inside, or out of memory); a new one starts with the next"
                    ),
                )
        duration = time.monotonic() - started
        timed_out = status == 128 + signal.SIGKILL and duration >= seconds
        if out_size + err_size >= self.limits.exec_tmpfs_bytes - (64 << 10):
            note = note or (
                f"the output filled the container's exec tmpfs ({self.limits.exec_tmpfs_bytes} bytes, "
                f"{EXEC_TMPFS_FACTOR} times output_bytes); writes past it failed"
            )
        return CompletedRun(
            args=args, returncode=-signal.SIGKILL if timed_out else status, stdout=out, stderr=err,
            stdout_bytes=out_size, stderr_bytes=err_size, timed_out=timed_out, duration_s=duration,
            restarted=restarted, note=note,
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, _ShellHung):
        return "no answer in time"
    return str(exc) or type(exc).__name__
