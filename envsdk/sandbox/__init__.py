"""Sandboxes for running untrusted code: a provider interface and two providers.

A `SandboxProvider` starts a `Sandbox`; a sandbox runs commands (`Sandbox.run`, argv, stdin,
timeout: `subprocess.run`'s vocabulary, answered with a `CompletedRun`) and snippets in one
persistent Python interpreter (`Sandbox.run_python`), reads and writes files in its workspace,
and is closed. Every call has a deadline; every run gets the CPU-time, address-space,
process-count, file-size and open-file limits of `SandboxLimits`; whatever a run leaves
running is killed when it ends, and the interpreter is frozen between snippets, so no code runs
once its run is answered; where the host has cgroup v1 (`envsdk.sandbox.cgroups`), memory and
process count also hold for the sandbox as a whole; `close` kills every process and removes
every file (and cgroup).

How it works: a provider only says how to start one process isolated in its way
(`SandboxProvider.command`, as an httpx transport only says how bytes travel). That process is
the *agent* (`_agent.py`, standard library only), which runs each request's processes under
the limits, as a child subreaper, and answers one JSON line per request.

Providers here:

* `BubblewrapProvider` (``bwrap``): Linux namespaces: no network, read-only ``/usr`` only,
  one private tmpfs of ``disk_bytes`` for all the sandbox writes (workspace, ``/tmp``,
  ``/dev/shm``), own PID namespace, cleared environment. The one to use.
* `ProcessProvider`: plain processes with rlimits and process groups, **weaker**: no
  namespace; where the kernel has Landlock it hides host files outside ``/usr`` and the
  workspace, refuses TCP and signals outside the sandbox, but not UDP nor the process list
  (its docstring lists what it cannot stop); as root, what its user id leaves in the host's
  shared places is removed at close. For machines without bubblewrap.

Not here, and what they would add. A Docker (or Podman) provider would be one class whose
``command`` is ``docker run --rm -i --network none --read-only --tmpfs /workspace:size=...
--pids-limit --memory --cpus IMAGE python -c AGENT``: cgroup limits on memory, CPU share and
process count for the whole sandbox on any host (cgroup v2 included), and an image with the
task's dependencies; it is not here because a Docker daemon cannot run on these machines, so it
could not be tested. A remote provider (a sandbox service, or SSH to a worker) would replace
the agent's pipes with a connection and add start-up over the network, machine-level
isolation and scale beyond one host; it needs a service to test against, which is not
available here either.
"""

from envsdk.sandbox.base import (
    CompletedRun,
    Sandbox,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxLimits,
    SandboxPathError,
    SandboxProvider,
    SandboxStartError,
    SandboxTimeout,
    SpawnedProcess,
    kill_tree,
    kill_user,
    process_tree,
    user_processes,
)
from envsdk.sandbox.bubblewrap import BubblewrapProvider, bwrap_path
from envsdk.sandbox.container import (
    ContainerEngine,
    ContainerError,
    ContainerLimits,
    ContainerProvider,
    ContainerSandbox,
    ContainerStartError,
    ImageBuildError,
    ImageUnavailableError,
)
from envsdk.sandbox.pool import SandboxPool
from envsdk.sandbox.process import ProcessProvider

__all__ = [
    "BubblewrapProvider",
    "CompletedRun",
    "ContainerEngine",
    "ContainerError",
    "ContainerLimits",
    "ContainerProvider",
    "ContainerSandbox",
    "ContainerStartError",
    "ImageBuildError",
    "ImageUnavailableError",
    "ProcessProvider",
    "Sandbox",
    "SandboxClosed",
    "SandboxDied",
    "SandboxError",
    "SandboxLimits",
    "SandboxPathError",
    "SandboxPool",
    "SandboxProvider",
    "SandboxStartError",
    "SandboxTimeout",
    "SpawnedProcess",
    "bwrap_path",
    "kill_tree",
    "kill_user",
    "make_provider",
    "process_tree",
    "user_processes",
]


def make_provider(name: str, limits: SandboxLimits | None = None) -> SandboxProvider:
    """``"bubblewrap"`` or ``"process"``; ``"auto"``: bubblewrap where ``bwrap`` is installed."""
    if name == "auto":
        name = "bubblewrap" if bwrap_path() is not None else "process"
    if name == "bubblewrap":
        return BubblewrapProvider(limits)
    if name == "process":
        return ProcessProvider(limits)
    raise ValueError(f"unknown sandbox provider {name!r}: bubblewrap, process or auto")
