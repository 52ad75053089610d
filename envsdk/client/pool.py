"""`EnvPool`: many environment servers behind one client-side pool.

A pool places each new episode on the least-loaded healthy server of a list of base URLs and
hands out an `EnvClient` bound to that one server for the episode's whole life (a resume after
a dropped socket goes back to the same server, never to another one).

Load is what the pool knows best: the sessions it opened itself on each server, corrected by
each server's ``GET /health`` (``active_sessions`` / ``max_sessions``, which counts other
clients' sessions too), polled at most once per ``health_interval_s`` per server. Polls run in
the background, each server's on its own: a placement chooses from what the pool last heard
and never waits on a slow or hung ``/health`` (it waits ``health_wait_s`` at most, and only
for the first answer of a server it has not heard from yet). A server at capacity
(`CapacityError` at connect) or down (`ConnectError`, a lost session, a failed health poll) is
skipped and tried again after a per-server backoff.

The pool also learns from how its episodes end, as an outlier-ejecting load balancer does: a
server whose episodes fail ``eject_after_failures`` times in a row (a reset or step past its
deadline, a session lost with its connection) is taken out of rotation for
``ejection_base_s`` (doubled each time it is ejected again, up to ``ejection_max_s``), even
while its ``/health`` answers: a wedged server's episodes end fastest, so by load alone it
would get the most. When that time is over it gets one episode (a probe); if that one ends
well the server is back, if it fails the server is ejected again. No more than
``max_ejected_fraction`` of the servers (never the last one that can play) are ejected at
once, so an environment that fails everywhere is not taken out everywhere. Ejections are
logged as warnings and shown by `EnvPool.servers` (``ejected``).

Where the list of servers comes from (a `PoolSpec`):

* a list of base URLs;
* a registered pool name: ``envsdk.client.pool.pools["sudoku"] = [url, url, ...]`` (a value
  may be any other spec: a list, a file, a callable, an object with ``base_urls()``);
* a file written by ``envsdk serve … --replicas N --replicas-file urls.json`` (JSON: a list,
  or an object with ``base_urls``; or plain text, one URL a line) — re-read on refresh, so
  restarted replicas are followed;
* a zero-argument callable returning the URLs, or an object with a ``base_urls()`` method
  (`envsdk.ray.RayReplicas`): called again every ``refresh_interval_s`` and right after a
  server could not be reached, so a replica that came back on a new address is found.

Usage::

    pool = EnvPool(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    async with pool.session() as env:      # an EnvClient on the least-loaded server
        await env.reset(seed=7)
        await env.step({"message": "[1 2 3]"})

Schedulers take a spec wherever they take a base URL: ``env_config["base_url"]`` may be a list
or a pool name (see `shared_pool`), and ``OpenEnvScheduler(base_url=...)`` /
``SudokuScheduler(base_url=...)`` take a spec or an `EnvPool` (to choose its settings). The
TRL integration runs its episodes through such a scheduler, so a pool goes there the same way:
``EnvironmentFactory(SudokuToolEnvironment, SudokuScheduler(base_url=EnvPool(urls)))``, or a
dataset whose rows say ``"env_config": {"base_url": "my-pool"}``. When every server stays full
for ``acquire_timeout_s``, `acquire` raises `NoServerAvailableError` (a `ConnectError`, not a
`CapacityError`: the pool already waited).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Union, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from envsdk.client.client import EnvClient
from envsdk.errors import (
    CapacityError,
    ConnectError,
    EnvNotFoundError,
    EnvTimeoutError,
    ProtocolError,
    SessionLostError,
    mask_secrets,
)
from envsdk.protocol import WS_PATH
from envsdk.registry import Registry

__all__ = [
    "EnvPool",
    "PoolSettings",
    "PoolSpec",
    "PooledEnvClient",
    "ServerStatus",
    "NoServerAvailableError",
    "SupportsBaseUrls",
    "pools",
    "is_pool_spec",
    "url_source",
    "read_base_urls_file",
    "shared_pool",
    "health_url",
]

logger = logging.getLogger("envsdk.client.pool")


@runtime_checkable
class SupportsBaseUrls(Protocol):
    """Anything that knows the current base URLs of its servers (e.g. `envsdk.ray.RayReplicas`)."""

    def base_urls(self) -> list[str]: ...


PoolSpec = Union[str, Sequence[str], Callable[[], Sequence[str]], SupportsBaseUrls, "EnvPool"]

#: Named pools: ``pools["sudoku"] = ["http://h1:8000", "http://h2:8000"]`` (or any `PoolSpec`).
pools: Registry[Any] = Registry("pool")


class NoServerAvailableError(ConnectError):
    """No server of the pool took a new session within ``acquire_timeout_s``: every one was
    full or unreachable. ``servers`` is the pool's view of each server at that moment."""

    def __init__(self, message: str, servers: list[ServerStatus]) -> None:
        super().__init__(message)
        self.servers = servers


@dataclass(frozen=True)
class PoolSettings:
    """How a pool polls, backs off, ejects and waits. Seconds throughout.

    * ``health_interval_s`` — at most one ``/health`` poll per server per interval;
      ``health_timeout_s`` bounds each poll (a poll that takes longer counts as a failure).
    * ``health_wait_s`` — how long a placement waits for the first ``/health`` answer of
      servers the pool has not heard from yet (so that its first episodes already avoid a
      server loaded by other clients); later polls never hold a placement up.
    * ``refresh_interval_s`` — how often the URL source is asked again (also right after a
      server could not be reached).
    * ``backoff_base_s`` / ``backoff_max_s`` — a server that failed ``n`` times in a row is
      skipped for ``min(backoff_max_s, backoff_base_s * 2**(n-1))``; a server at capacity is
      skipped for its ``retry_after_s`` hint (else ``backoff_base_s``).
    * ``eject_after_failures`` — episodes in a row ending in a failure of their server (a
      deadline missed, a session lost) after which the server is ejected (0: never).
    * ``ejection_base_s`` / ``ejection_max_s`` — an ejection lasts
      ``min(ejection_max_s, ejection_base_s * 2**(k-1))`` for the server's k-th ejection in a
      row; an episode that ends well there resets k.
    * ``max_ejected_fraction`` — at most this fraction of the servers is ejected at once
      (at least one may be, but never the last one that can take an episode).
    * ``acquire_timeout_s`` — how long `EnvPool.acquire` waits for any server to take a
      session before raising `NoServerAvailableError` (None: forever).
    * ``assumed_max_sessions`` — the capacity used to compare servers whose ``/health`` does
      not report ``max_sessions`` (plain OpenEnv servers).
    """

    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    health_wait_s: float = 0.5
    refresh_interval_s: float = 5.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    eject_after_failures: int = 3
    ejection_base_s: float = 10.0
    ejection_max_s: float = 300.0
    max_ejected_fraction: float = 0.5
    acquire_timeout_s: float | None = 60.0
    assumed_max_sessions: int = 64

    def __post_init__(self) -> None:
        for name in ("health_interval_s", "health_timeout_s", "refresh_interval_s", "backoff_max_s",
                     "ejection_base_s", "ejection_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("backoff_base_s", "health_wait_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.eject_after_failures < 0:
            raise ValueError(f"eject_after_failures must be >= 0, got {self.eject_after_failures!r}")
        if not 0 <= self.max_ejected_fraction <= 1:
            raise ValueError(f"max_ejected_fraction must be from 0 to 1, got {self.max_ejected_fraction!r}")
        if self.acquire_timeout_s is not None and self.acquire_timeout_s <= 0:
            raise ValueError(f"acquire_timeout_s must be > 0 or None, got {self.acquire_timeout_s!r}")
        if self.assumed_max_sessions < 1:
            raise ValueError(f"assumed_max_sessions must be >= 1, got {self.assumed_max_sessions!r}")

    def backoff(self, failures: int) -> float:
        """Seconds to skip a server after ``failures`` (>= 1) failures in a row."""
        return float(min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, failures - 1)))

    def ejection(self, ejections: int) -> float:
        """Seconds a server is out of rotation for its ``ejections``-th (>= 1) ejection in a row."""
        return float(min(self.ejection_max_s, self.ejection_base_s * 2 ** max(0, ejections - 1)))


@dataclass(frozen=True)
class ServerStatus:
    """The pool's view of one server (a snapshot).

    ``opened``: sessions this pool holds there; ``active``: its estimate of all sessions there
    (health report plus what this pool opened or closed since); ``max_sessions``: from
    ``/health`` (None if never reported); ``available``: whether a new episode may be placed
    there now; ``failures``: failed attempts to reach it in a row (0: it answered last time);
    ``retry_in_s``: seconds left of its backoff; ``retired``: no longer listed by the source
    (kept until its sessions close); ``episode_failures``: its episodes in a row that ended in
    a failure of the server; ``ejected``: out of rotation for what its episodes did, for
    ``ejected_in_s`` more seconds (then on probation: one episode at a time until one ends
    well); ``ejections``: how often in a row it was ejected.
    """

    base_url: str
    opened: int
    active: int
    max_sessions: int | None
    available: bool
    failures: int
    retry_in_s: float
    last_error: str | None
    retired: bool
    episode_failures: int = 0
    ejected: bool = False
    ejected_in_s: float = 0.0
    ejections: int = 0


def health_url(base_url: str) -> str:
    """The ``GET /health`` URL of a server given by its http(s)/ws(s) base URL."""
    parts = urlsplit(base_url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    path = parts.path.rstrip("/").removesuffix(WS_PATH)
    return urlunsplit((scheme, parts.netloc, path + "/health", "", ""))


#: Most base URLs a file may list: every one is a server the pool (and the pre-flight) reaches.
MAX_FILE_URLS = 4096
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")


def read_base_urls_file(path: str | Path) -> list[str]:
    """The base URLs listed in a file: JSON (a list, or an object with ``base_urls``, as
    written by ``--replicas-file``) or plain text (one URL a line, ``#`` comments). Raises
    ValueError naming the entry for one that is not an ``http(s)://``/``ws(s)://`` URL, and for
    more than `MAX_FILE_URLS` of them."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        data = json.loads(stripped)
        urls = data.get("base_urls") if isinstance(data, dict) else data
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"{path}: expected a JSON list of base URLs or an object with 'base_urls'")
        entries = [(f"{path} entry {i}", u.strip()) for i, u in enumerate(urls, start=1)]
    else:
        entries = [
            (f"{path} line {n}", line.strip()) for n, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    if len(entries) > MAX_FILE_URLS:
        raise ValueError(f"{path} lists {len(entries)} base URLs, more than {MAX_FILE_URLS}")
    for where, url in entries:
        if not url.lower().startswith(_URL_SCHEMES):
            shown = url if len(url) <= 80 else url[:80] + "…"
            raise ValueError(f"{where}: {shown!r} is not a base URL (http://, https://, ws:// or wss://)")
    return [url for _, url in entries]


def _is_url(text: str) -> bool:
    return "://" in text


def is_pool_spec(value: object) -> bool:
    """Whether `value` names several servers (a pool) rather than one base URL string.

    A string is a pool spec when it is a registered pool name or an existing file; any other
    string is taken as a single base URL.
    """
    if isinstance(value, str):
        return value in pools or (not _is_url(value) and Path(value).is_file())
    return isinstance(value, (EnvPool, SupportsBaseUrls)) or callable(value) or isinstance(value, Sequence)


def url_source(spec: PoolSpec) -> Callable[[], list[str]]:
    """A function returning the current base URLs of `spec` (see the module docstring).

    Raises `EnvNotFoundError` for a string that is neither a URL, a registered pool name nor an
    existing file (the message lists the known pool names).
    """
    if isinstance(spec, EnvPool):
        return spec.base_urls
    if isinstance(spec, str):
        if spec in pools:
            return url_source(pools[spec])
        if _is_url(spec):
            return lambda: [spec]
        if Path(spec).is_file():
            return lambda: read_base_urls_file(spec)
        known = ", ".join(sorted(pools)) or "none"
        raise EnvNotFoundError(
            f"{spec!r} is not a base URL, a registered pool name (known pools: {known}) nor a file "
            "of base URLs; register one with `envsdk.client.pool.pools[name] = [urls]`"
        )
    if isinstance(spec, SupportsBaseUrls):
        return spec.base_urls
    if callable(spec):
        source = spec
        return lambda: list(source())
    urls = list(spec)
    return lambda: list(urls)


#: Errors that say a call failed because of its server, not because of the episode: what the
#: pool counts towards ejecting a server (an env's own exception, a bad action, a refused token
#: would fail the same way anywhere).
SERVER_FAILURES: tuple[type[BaseException], ...] = (EnvTimeoutError, SessionLostError, ConnectError, ProtocolError)


class PooledEnvClient(EnvClient):
    """An `EnvClient` handed out by an `EnvPool`: bound to one server for its whole life;
    closing it gives its slot back to the pool (exactly once) and tells the pool how the
    episode went there: failed (a call raised one of `SERVER_FAILURES`; told as it happens),
    or ended well (a call was answered and none failed so)."""

    def __init__(
        self,
        base_url: str,
        *,
        on_release: Callable[[], None],
        on_outcome: Callable[[BaseException | None], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, **kwargs)
        self._on_release: Callable[[], None] | None = on_release
        self._on_outcome = on_outcome
        self._answered = False
        self._failed = False

    def _release(self) -> None:
        release, self._on_release = self._on_release, None
        if release is not None:
            if self._on_outcome is not None and self._answered and not self._failed:
                self._on_outcome(None)
            release()

    async def _request(self, what: str, make: Callable[[str | None], Any], *, kind: Any) -> Any:
        try:
            reply = await super()._request(what, make, kind=kind)
        except SERVER_FAILURES as exc:
            if not self._failed and self._on_outcome is not None:
                self._failed = True
                self._on_outcome(exc)
            raise
        self._answered = True
        return reply

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self._release()


@dataclass
class _Server:
    base_url: str
    health_url: str
    opened: int = 0
    reported_active: int | None = None
    opened_at_report: int = 0
    max_sessions: int | None = None
    polled_at: float = -math.inf
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    retired: bool = False
    #: A health answer or a connection was had (or failed) at least once, or a placement
    #: waited ``health_wait_s`` for the first one already (it is not waited for again).
    heard: bool = False
    #: Its episodes in a row that failed there (`SERVER_FAILURES`).
    episode_failures: int = 0
    #: Times in a row it was ejected; > 0 until an episode ends well there.
    ejections: int = 0
    ejected_until: float = 0.0
    #: An episode placed on it while on probation (after an ejection) has not ended yet.
    probing: bool = False
    poll: asyncio.Task[None] | None = None

    def active(self) -> int:
        if self.reported_active is None:
            return self.opened
        # The report already counts the pool's sessions of that moment; add what changed since.
        return max(self.opened, self.reported_active + self.opened - self.opened_at_report)

    def full(self) -> bool:
        return self.max_sessions is not None and self.active() >= self.max_sessions

    def load(self, assumed_max: int) -> float:
        return self.active() / (self.max_sessions or assumed_max)

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def playable(self, now: float) -> bool:
        """Whether a new episode may go there now (capacity aside)."""
        if self.retired or self.retry_at > now or self.ejected(now):
            return False
        return not (self.ejections and self.probing)  # on probation: one episode at a time


class EnvPool:
    """Client-side pool of environment servers; see the module docstring.

    ``client_kwargs`` go to every `EnvClient` the pool makes (``timeouts``, ``retry``,
    ``observation_type``, ``headers``, …). The pool holds no connection: health polls and URL
    refreshes are started by `acquire` (polls run as tasks of the caller's event loop, each
    bounded by ``health_timeout_s``), so there is nothing to close; it may be used from several
    event loops one after the other.
    """

    def __init__(self, spec: PoolSpec, *, settings: PoolSettings = PoolSettings(), **client_kwargs: Any) -> None:
        self.settings = settings
        self.client_kwargs = client_kwargs
        self._source = url_source(spec)
        self._servers: dict[str, _Server] = {}
        self._refreshed_at = -math.inf
        self._urls_stale = False
        self._rotation = 0
        self.refresh_urls()
        if not self.base_urls():
            raise ValueError(f"the pool spec {spec!r} lists no base URL")

    # ------------------------------------------------------------ views

    def base_urls(self) -> list[str]:
        """The servers the pool places new episodes on (retired ones excluded), in order."""
        return [s.base_url for s in self._servers.values() if not s.retired]

    def servers(self) -> list[ServerStatus]:
        """A snapshot of the pool's view of every server it knows."""
        now = time.monotonic()
        return [
            ServerStatus(
                base_url=s.base_url,
                opened=s.opened,
                active=s.active(),
                max_sessions=s.max_sessions,
                available=s.playable(now) and not s.full(),
                failures=s.failures,
                retry_in_s=max(0.0, s.retry_at - now),
                last_error=s.last_error,
                retired=s.retired,
                episode_failures=s.episode_failures,
                ejected=s.ejected(now),
                ejected_in_s=max(0.0, s.ejected_until - now),
                ejections=s.ejections,
            )
            for s in self._servers.values()
        ]

    def can_play(self) -> bool:
        """Whether some listed server may still take episodes: one that answered the last time
        the pool tried it (an ejected one included: it is alive, and is probed again). False
        when every server is down (its last connection, session or health poll failed)."""
        return any(not s.retired and s.failures == 0 for s in self._servers.values())

    def is_ejected(self, base_url: str) -> bool:
        """Whether the pool holds `base_url` out of rotation for what its episodes did."""
        server = self._servers.get(base_url)
        return server is not None and server.ejected(time.monotonic())

    # ------------------------------------------------------------ URL list

    def refresh_urls(self) -> list[str]:
        """Ask the source for the current URLs now: new ones join, missing ones retire (their
        open sessions keep running; no new episode goes there). Returns the active URLs.

        A source that fails (a replicas file being rewritten, a monitor not ready) keeps the
        previous list; the failure is logged.
        """
        self._refreshed_at = time.monotonic()
        self._urls_stale = False
        try:
            urls = [u.strip() for u in self._source() if u and u.strip()]
        except Exception as exc:  # keep serving from the last good list
            logger.warning("could not refresh the pool's base URLs: %r; keeping %s", exc, self.base_urls())
            return self.base_urls()
        listed = dict.fromkeys(urls)
        for url in listed:
            server = self._servers.get(url)
            if server is None:
                self._servers[url] = _Server(base_url=url, health_url=health_url(url))
            else:
                server.retired = False
        for url, server in list(self._servers.items()):
            if url not in listed:
                server.retired = True
                if server.opened == 0:
                    del self._servers[url]
        return self.base_urls()

    def _maybe_refresh_urls(self) -> None:
        if self._urls_stale or time.monotonic() - self._refreshed_at >= self.settings.refresh_interval_s:
            self.refresh_urls()

    # ------------------------------------------------------------ health

    async def refresh_health(self, *, force: bool = False) -> None:
        """Poll ``/health`` of every server whose last poll is older than
        ``health_interval_s`` (every server with ``force``), skipping servers in backoff, and
        wait for the answers. A poll already running for a server is waited for, not repeated."""
        polls = self._start_polls(force=force)
        if polls:
            await asyncio.wait(polls)

    def _start_polls(self, *, force: bool = False) -> list[asyncio.Task[None]]:
        """Start a background poll of each server that is due one; return every poll running
        on this loop (started now or before)."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        running = []
        for server in self._servers.values():
            task = server.poll
            if task is not None and not task.done() and task.get_loop() is loop:
                running.append(task)
                continue
            if server.retired or server.retry_at > now:
                continue
            if force or now - server.polled_at >= self.settings.health_interval_s:
                server.poll = loop.create_task(self._poll(server))
                running.append(server.poll)
        return running

    async def _wait_for_first_answers(self, polls: list[asyncio.Task[None]]) -> None:
        """Wait (``health_wait_s`` at most) for the polls of servers never heard from."""
        first = [s for s in self._servers.values() if not s.heard and s.poll in polls]
        for server in first:
            server.heard = True
        if first and self.settings.health_wait_s > 0:
            await asyncio.wait([s.poll for s in first if s.poll is not None], timeout=self.settings.health_wait_s)

    async def _poll(self, server: _Server) -> None:
        timeout = self.settings.health_timeout_s
        opened_before = server.opened
        loop = asyncio.get_running_loop()
        try:
            body = await asyncio.wait_for(
                loop.run_in_executor(_health_threads(), _get_json, server.health_url, timeout), timeout + 1.0
            )
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            self._failed(server, f"GET {server.health_url} failed: {exc!r}")
            return
        server.heard = True
        server.polled_at = time.monotonic()
        server.failures = 0
        server.last_error = None
        active, maximum = body.get("active_sessions"), body.get("max_sessions")
        if isinstance(active, int):
            server.reported_active = active
            server.opened_at_report = opened_before
        if isinstance(maximum, int) and maximum > 0:
            server.max_sessions = maximum

    def _failed(self, server: _Server, error: str) -> None:
        server.heard = True
        server.failures += 1
        server.last_error = error
        server.polled_at = -math.inf  # poll again as soon as its backoff ends
        server.retry_at = time.monotonic() + self.settings.backoff(server.failures)
        # A replica that died may come back elsewhere (Ray): ask the source again soon.
        self._urls_stale = True
        logger.info("skipping %s for %.1f s: %s", server.base_url, server.retry_at - time.monotonic(), error)

    def _full(self, server: _Server, error: CapacityError) -> None:
        hint = error.details.get("retry_after_s")
        delay = float(hint) if isinstance(hint, (int, float)) and hint > 0 else self.settings.backoff_base_s
        server.retry_at = time.monotonic() + delay
        server.last_error = str(error)
        if error.max_sessions is not None:
            server.max_sessions = error.max_sessions
        if error.active_sessions is not None:
            server.reported_active = error.active_sessions
            server.opened_at_report = server.opened

    # ------------------------------------------------------------ episode outcomes

    def _episode_ended(self, server: _Server, failure: BaseException | None, probe: bool) -> None:
        """What an episode on `server` came to: None (it ended well there) or the failure of
        its server that ended it (`SERVER_FAILURES`); `probe`: it was placed there on probation."""
        if failure is None:
            if server.ejections:
                logger.warning("%s is back in rotation: an episode ended well there after its ejection", server.base_url)
            server.episode_failures = 0
            server.ejections = 0
            return
        server.episode_failures += 1
        now = time.monotonic()
        if isinstance(failure, (SessionLostError, ConnectError)) and server.retry_at <= now:
            # Its connection went: skip it until it answers again. The other sessions a dead
            # server held are lost within moments of this one: one failure, not one each.
            self._failed(server, f"an episode lost its session there: {failure}")
        limit = self.settings.eject_after_failures
        if limit and (probe or server.episode_failures >= limit) and not server.ejected(now) and self._may_eject(server, now):
            server.ejections += 1
            delay = self.settings.ejection(server.ejections)
            server.ejected_until = now + delay
            logger.warning(
                "ejecting %s for %.0f s: %s, the last with %s (ejection %d in a row; one episode probes it after that)",
                mask_secrets(server.base_url), delay,
                "its probe episode failed" if probe else f"{server.episode_failures} episodes in a row failed there",
                mask_secrets(f"{type(failure).__name__}: {failure}"), server.ejections,
            )

    def _may_eject(self, server: _Server, now: float) -> bool:
        """Whether one more server may be ejected: within ``max_ejected_fraction`` of the
        listed servers (at least one), and never the last that can take an episode."""
        listed = [s for s in self._servers.values() if not s.retired]
        ejected = sum(1 for s in listed if s.ejected(now))
        if ejected + 1 > max(1, int(self.settings.max_ejected_fraction * len(listed))):
            return False
        return any(s is not server and not s.ejected(now) and s.failures == 0 for s in listed)

    # ------------------------------------------------------------ placement

    def _choose(self) -> _Server | None:
        now = time.monotonic()
        candidates = [s for s in self._servers.values() if s.playable(now) and not s.full()]
        if not candidates:
            return None
        # Ties (e.g. an empty pool) rotate so that equal servers share the first episodes.
        self._rotation += 1
        n = len(candidates)
        order = {id(s): (i - self._rotation) % n for i, s in enumerate(candidates)}
        return min(candidates, key=lambda s: (s.load(self.settings.assumed_max_sessions), order[id(s)]))

    def _wait_hint(self) -> float:
        now = time.monotonic()
        retries = [
            max(s.retry_at, s.ejected_until) - now
            for s in self._servers.values()
            if not s.retired and max(s.retry_at, s.ejected_until) > now
        ]
        # Full servers free up when sessions close; re-poll their health at the usual pace.
        return max(0.05, min([self.settings.health_interval_s, *retries]))

    async def acquire(self) -> PooledEnvClient:
        """Connect a new session on the least-loaded available server and return its client.

        The client is bound to that server for its whole life; close it (or use `session`) to
        give the slot back. Raises `NoServerAvailableError` when no server took the session
        within ``acquire_timeout_s``; errors other than capacity and connection failures (e.g.
        `AuthenticationError`) are raised as they are. Health polls that are due are started,
        not waited for (but ``health_wait_s`` for servers never heard from).
        """
        timeout = self.settings.acquire_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._maybe_refresh_urls()
            await self._wait_for_first_answers(self._start_polls())
            server = self._choose()
            if server is not None:
                client = await self._connect(server)
                if client is not None:
                    return client
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise NoServerAvailableError(self._exhausted_message(timeout), self.servers())
            wait = self._wait_hint()
            await asyncio.sleep(wait if remaining is None else min(wait, remaining))

    async def _connect(self, server: _Server) -> PooledEnvClient | None:
        server.opened += 1  # reserved before the await, so concurrent acquires spread out
        probe = server.ejections > 0
        if probe:
            server.probing = True
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            server.opened -= 1
            if probe:
                server.probing = False  # however the probe ended (one that said nothing too)
            if server.retired and server.opened == 0:
                self._servers.pop(server.base_url, None)

        reported = False

        def outcome(failure: BaseException | None) -> None:
            nonlocal reported
            if not reported:
                reported = True
                self._episode_ended(server, failure, probe)

        client = PooledEnvClient(server.base_url, on_release=release, on_outcome=outcome, **self.client_kwargs)
        try:
            await client.connect()
        except CapacityError as exc:
            release()
            self._full(server, exc)
            return None
        except ConnectError as exc:
            release()
            self._failed(server, str(exc))
            return None
        except BaseException:
            release()
            raise
        server.heard = True
        server.failures = 0
        server.last_error = None
        return client

    def _exhausted_message(self, timeout: float | None) -> str:
        lines = [
            f"no server of the pool took a new session within acquire_timeout_s={timeout}: "
            "add replicas, raise their MAX_CONCURRENT_ENVS, lower the rollout concurrency or "
            "raise PoolSettings.acquire_timeout_s"
        ]
        for s in self.servers():
            cap = "?" if s.max_sessions is None else str(s.max_sessions)
            ejected = f", ejected for {s.ejected_in_s:.0f} s more" if s.ejected else ""
            lines.append(f"  {s.base_url}: {s.active}/{cap} sessions{ejected}, last error: {s.last_error or 'none'}")
        return "\n".join(lines)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[PooledEnvClient]:
        """``async with pool.session() as env:`` — `acquire`, then close the client at the end."""
        client = await self.acquire()
        try:
            yield client
        finally:
            await client.close()

#: The largest ``/health`` body read: a report is a few hundred bytes.
MAX_HEALTH_BYTES = 1 << 20


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    """GET `url` and decode its JSON object body (blocking; run in a thread).

    Bounded whatever the server does: at most `MAX_HEALTH_BYTES` are read, and the body is
    no longer read once ``timeout`` has passed (urllib's own timeout bounds each read, not the
    whole body: a trickling server kept the thread reading on). Everything a broken server can
    make go wrong is raised as `OSError` or `ValueError`."""
    deadline = time.monotonic() + timeout
    body = bytearray()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # only http(s): built by health_url
            while chunk := response.read1(64 * 1024):
                body += chunk
                if len(body) > MAX_HEALTH_BYTES:
                    raise ValueError(f"{url} answered more than {MAX_HEALTH_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} did not finish its answer within {timeout} s")
        data = json.loads(body.decode("utf-8"))
    except http.client.HTTPException as exc:  # no HTTP at all, a cut body, a 64 kB header line
        raise ValueError(f"{url} did not answer in HTTP: {exc!r}") from exc
    except RecursionError:  # JSON nested past Python's recursion limit
        raise ValueError(f"{url} answered JSON nested too deep to read") from None
    if not isinstance(data, dict):
        raise ValueError(f"{url} answered {data!r}, not a JSON object")
    return data


_HEALTH_THREADS: concurrent.futures.ThreadPoolExecutor | None = None


def _health_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads health polls block in: their own, so that a hung ``/health`` neither takes
    a thread of the event loop's default executor nor holds up `asyncio.run`'s exit (which
    waits for that executor's threads); each poll ends within ``health_timeout_s``."""
    global _HEALTH_THREADS
    if _HEALTH_THREADS is None:
        _HEALTH_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="envsdk-health")
    return _HEALTH_THREADS


_SHARED: dict[Any, EnvPool] = {}


def shared_pool(spec: PoolSpec) -> EnvPool:
    """The process-wide pool of `spec` (made on first use with default settings), so every
    scheduler that names the same servers shares one view of their load and health. An
    `EnvPool`, or a pool name registered as one (``pools["p"] = EnvPool(urls, settings=…)``), is
    returned as is; lists are keyed by their URLs, other specs by identity or name."""
    if isinstance(spec, EnvPool):
        return spec
    registered = pools.get(spec) if isinstance(spec, str) else None
    if isinstance(registered, EnvPool):
        return registered  # registered with its own settings: shared as it is
    key: Any = tuple(spec) if isinstance(spec, (list, tuple)) else spec
    pool = _SHARED.get(key)
    if pool is None:
        pool = _SHARED[key] = EnvPool(spec)
    return pool
