"""Server replicas placed by Ray: ``start_replicas("servers.sudoku.app:create_sudoku_app", 8)``.

Each replica is a Ray actor running one server (`envsdk.server.serve`, in a thread of the
actor's process) on a free port, bound to 127.0.0.1 by default or to the node's IP address (``host="node"``) when
clients on other machines must reach it. Ray decides where the actors go (``num_cpus``,
``resources``, ``actor_options`` such as a placement group or ``scheduling_strategy``) and
restarts an actor whose process dies (``max_restarts``); a monitor thread in the driver asks
every replica for its status each ``monitor_interval_s``, keeps the list of live base URLs
(a restarted replica comes back on a new port, so its URL changes), and has Ray restart a
replica whose server stopped while its process lives on.

`RayReplicas` has a ``base_urls()`` method, so it is itself a pool spec: ``EnvPool(replicas)``
re-reads it every ``PoolSettings.refresh_interval_s`` and right after a server could not be
reached. A process that is not the driver (``envsdk rollout --base-url urls.json``, a trainer)
follows the replicas through ``replicas_file``, which the monitor rewrites whenever the list
changes, in the format of ``envsdk serve --replicas-file``. A session on a replica that died is
lost (the new process does not know it): its client raises `SessionLostError` and the scheduler
records that episode as an error, which ``envsdk rollout --resume`` plays again.

Ray is an optional extra: ``pip install ray`` (or ``pip install -e '.[ray]'`` in the envsdk clone). Connect to a cluster with ``ray.init``
(or ``ray.init(address="auto")``) before calling `start_replicas`; without that, Ray starts a
local runtime.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from envsdk.registry import import_spec
from envsdk.server.launch import serve
from envsdk.server.replicas import (
    ReplicaStartError,
    check_replicas_file,
    write_replicas_file,
)

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("envsdk.ray needs Ray: pip install ray (or pip install -e '.[ray]' in the envsdk clone)") from exc

__all__ = ["start_replicas", "RayReplicas", "ReplicaServer", "ReplicaStatus", "NODE_IP"]

logger = logging.getLogger("envsdk.ray")

#: ``host`` value that binds each replica to its node's IP address (reachable from other nodes).
NODE_IP = "node"


def _load_app(target: str, factory_kwargs: Mapping[str, Any]) -> Any:
    """The ASGI app named by ``"module:attribute"``: an app as is, or a factory's result."""
    from starlette.applications import Starlette

    obj = import_spec(target)
    if isinstance(obj, Starlette):
        if factory_kwargs:
            raise TypeError(f"{target!r} is an app, not a factory: it takes no factory_kwargs")
        return obj
    if not callable(obj):
        raise TypeError(f"{target!r} is neither an ASGI app nor a factory of one")
    return obj(**factory_kwargs)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _answers_health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:  # our own http URL
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


class ReplicaServer:
    """The actor: one server (`envsdk.server.serve`, so with every setting a served app gets)
    on a free port of ``host``, started in ``__init__`` (so a restart by Ray starts a new
    server) and run in a thread of the actor's process.

    ``env`` is set in the process environment before the app is built (``MAX_CONCURRENT_ENVS``
    and the like).
    """

    def __init__(
        self,
        target: str,
        factory_kwargs: Mapping[str, Any],
        host: str,
        env: Mapping[str, str],
        startup_timeout_s: float,
    ) -> None:
        os.environ.update(env)
        app = _load_app(target, factory_kwargs)
        bind = ray.util.get_node_ip_address() if host == NODE_IP else host  # type: ignore[no-untyped-call]
        # The port is free now; another process taking it before uvicorn binds it fails this
        # start (the thread ends), which `start_replicas` reports.
        port = _free_port(bind)
        self.base_url = f"http://{bind}:{port}"
        self._thread = threading.Thread(
            target=serve, args=(app,), kwargs={"host": bind, "port": port, "log_level": "warning"},
            name=f"envsdk-replica-{port}", daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + startup_timeout_s
        while not _answers_health(self.base_url):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the replica server on {bind}:{port} did not start within {startup_timeout_s} s")
            time.sleep(0.05)

    def status(self) -> dict[str, Any]:
        """``{"base_url", "pid", "serving"}``; ``serving`` is False once the server stopped."""
        return {"base_url": self.base_url, "pid": os.getpid(), "serving": self._thread.is_alive()}


@dataclass(frozen=True)
class ReplicaStatus:
    """The driver's view of one replica: its URL (None while unavailable), process id, and how
    many times it came back in a new process."""

    index: int
    base_url: str | None
    pid: int | None
    restarts: int


class RayReplicas:
    """Replica actors started by `start_replicas`, watched by a monitor thread.

    ``base_urls()`` lists the replicas that answered the latest status round, in replica
    order; each round that changes it rewrites ``replicas_file`` (when given). `shutdown` (or
    leaving the ``with`` block) stops the monitor, kills every actor and removes the file.
    """

    def __init__(
        self,
        actors: list[Any],
        *,
        monitor_interval_s: float = 1.0,
        probe_timeout_s: float = 5.0,
        replicas_file: str | Path | None = None,
    ) -> None:
        self.actors = actors
        self.monitor_interval_s = monitor_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.replicas_file = Path(replicas_file) if replicas_file is not None else None
        self._written: dict[str, object] | None = None
        self._urls: list[str | None] = [None] * len(actors)
        self._last_urls: list[str | None] = [None] * len(actors)
        self._pids: list[int | None] = [None] * len(actors)
        self._restarts = [0] * len(actors)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def __enter__(self) -> RayReplicas:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    def base_urls(self) -> list[str]:
        """The base URLs of the replicas available now (what an `EnvPool` reads)."""
        with self._lock:
            return [u for u in self._urls if u is not None]

    def replicas(self) -> list[ReplicaStatus]:
        """Every replica as the latest status round saw it, in replica order."""
        with self._lock:
            return [
                ReplicaStatus(index=i, base_url=u, pid=p, restarts=r)
                for i, (u, p, r) in enumerate(zip(self._urls, self._pids, self._restarts))
            ]

    def probe(self) -> list[str]:
        """One monitor round: ask every actor for its status (each within
        ``probe_timeout_s``), update the URLs, and have Ray restart a replica whose server
        stopped. Returns the base URLs available now."""
        refs = [actor.status.remote() for actor in self.actors]
        deadline = time.monotonic() + self.probe_timeout_s
        for i, (actor, ref) in enumerate(zip(self.actors, refs)):
            try:
                status = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (RayActorError, GetTimeoutError) as exc:
                # Dead, restarting or too busy to answer: no new episode goes there until it does.
                self._set(i, None, None)
                logger.debug("replica %d unavailable: %r", i, exc)
                continue
            if not status["serving"]:
                logger.warning("replica %d (%s) stopped serving; asking Ray to restart it", i, status["base_url"])
                self._set(i, None, None)
                ray.kill(actor, no_restart=False)
                continue
            self._set(i, str(status["base_url"]), int(status["pid"]))
        self._write_file()
        return self.base_urls()

    def describe(self) -> dict[str, object]:
        """What the replicas file holds: ``{"base_urls": [...], "replicas": [{index, base_url,
        pid, restarts}]}`` (the replicas available now), as ``envsdk serve --replicas-file``
        writes it."""
        return {
            "base_urls": self.base_urls(),
            "replicas": [
                {"index": r.index, "base_url": r.base_url, "pid": r.pid, "restarts": r.restarts}
                for r in self.replicas()
                if r.base_url is not None
            ],
        }

    def _write_file(self) -> None:
        if self.replicas_file is None:
            return
        description = self.describe()
        if description == self._written:
            return
        try:
            write_replicas_file(self.replicas_file, description)
        except ReplicaStartError as exc:  # the next round tries again
            logger.warning("%s", exc)
            return
        self._written = description

    def _set(self, index: int, url: str | None, pid: int | None) -> None:
        with self._lock:
            known = self._pids[index]
            if pid is not None and known is not None and pid != known:
                self._restarts[index] += 1
                logger.warning(
                    "replica %d came back in a new process: %s (was %s)", index, url, self._last_urls[index]
                )
            self._urls[index] = url
            if pid is not None:
                self._pids[index] = pid
                self._last_urls[index] = url

    def start_monitor(self) -> None:
        """Start the monitor thread (idempotent); `start_replicas` does it."""
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, name="envsdk-ray-replicas", daemon=True)
            self._monitor.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.monitor_interval_s):
            try:
                self.probe()
            except Exception as exc:  # the monitor must outlive one bad round (e.g. Ray shutting down)
                logger.warning("replica monitor round failed: %r", exc)

    def shutdown(self) -> None:
        """Stop the monitor and kill every replica actor (no restart). Idempotent."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=self.monitor_interval_s + self.probe_timeout_s + 5)
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone, or Ray already shut down
                logger.debug("killing a replica actor failed: %r", exc)
        with self._lock:
            self._urls = [None] * len(self.actors)
        if self.replicas_file is not None:
            self.replicas_file.unlink(missing_ok=True)


def start_replicas(
    app_factory_target: str,
    n: int,
    *,
    num_cpus: float = 1,
    resources: Mapping[str, float] | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    max_restarts: int = 3,
    startup_timeout_s: float = 120.0,
    monitor_interval_s: float = 1.0,
    probe_timeout_s: float = 5.0,
    actor_options: Mapping[str, Any] | None = None,
    replicas_file: str | Path | None = None,
) -> RayReplicas:
    """Start `n` server replicas as Ray actors and return them once every one serves.

    ``app_factory_target`` is ``"module:attribute"``: a function returning an ASGI app (called
    with ``factory_kwargs`` in each actor, e.g. ``servers.sudoku.app:create_sudoku_app``) or an
    app. Each actor reserves ``num_cpus`` and ``resources`` (Ray's custom resources);
    ``host`` is ``127.0.0.1`` (clients on the same node), another address, or ``"node"`` (the
    node's IP address). Ray restarts an actor whose process dies up to ``max_restarts`` times;
    ``actor_options`` go to ``.options()`` as they are (``scheduling_strategy``,
    ``runtime_env``, …). ``replicas_file``: where the base URLs of the replicas available are
    kept up to date, for pools in other processes (see the module docstring). Raises
    `TimeoutError` when the replicas do not all serve within ``startup_timeout_s`` (the ones
    started are killed), and `ValueError` for a ``replicas_file`` that cannot be written, before
    any replica starts.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if replicas_file is not None:
        check_replicas_file(Path(replicas_file))
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "max_restarts": max_restarts,
        # A call in flight when a replica dies is not replayed on its successor.
        "max_task_retries": 0,
        # Spread over the nodes (one node: no effect); actor_options may say otherwise.
        "scheduling_strategy": "SPREAD",
    }
    if resources:
        options["resources"] = dict(resources)
    options.update(actor_options or {})
    actor_class = ray.remote(ReplicaServer).options(**options)
    args = (app_factory_target, dict(factory_kwargs or {}), host, dict(env or {}), startup_timeout_s)
    actors: list[Any] = [actor_class.remote(*args) for _ in range(n)]
    replicas = RayReplicas(
        actors, monitor_interval_s=monitor_interval_s, probe_timeout_s=probe_timeout_s, replicas_file=replicas_file
    )
    try:
        ready, pending = ray.wait([a.status.remote() for a in actors], num_returns=n, timeout=startup_timeout_s)
        if pending:
            raise TimeoutError(
                f"{len(pending)} of {n} replicas of {app_factory_target!r} did not start within "
                f"{startup_timeout_s} s (not enough CPUs or resources in the cluster?)"
            )
        ray.get(ready)  # raises the actor's own error if its __init__ failed
        replicas.probe()
    except BaseException:
        replicas.shutdown()
        raise
    replicas.start_monitor()
    return replicas
