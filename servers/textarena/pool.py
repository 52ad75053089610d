"""Seeded game generation in worker processes: a bounded, fair, cancellable service whose
results are cached and shared between sessions.

A TextArena ``reset(seed=s)`` seeds the process-wide ``random`` generator and then generates
the game from it: seconds of pure Python for some games (RushHour, Sokoban, Sudoku's hard
boards), GIL-bound and, in a shared process, mixed with every other session's draws. A
`WorkerPool` runs such work in ``spawn``ed worker processes instead (one task at a time per
worker, so the global generator a worker seeds serves that task alone), caches results by key
and hands the same task to every caller asking for the same key (a GRPO group of sessions
sharing a seed generates its game once).

The pool is a service with bounds, because any client can ask it for work:

* **A deadline per generation** (``task_timeout_s``, default 30 s): a worker still busy past it
  is killed and replaced (it is a process, so it can be), and its callers get TIMEOUT.
* **A bounded queue** (``max_queued``, default 64 per worker): a task past it is refused at
  once with CAPACITY_REACHED instead of waiting behind work that may never end. One kind of
  work (below) may fill three quarters of it at most, so a flood leaves room for others.
* **Cancellation**: each task counts the callers waiting for it (`generate`); a caller stops
  waiting when its result arrives or its own deadline passes. A queued task nobody waits for
  any more is dropped; a running one is stopped (its worker killed and replaced).
* **Fair shares**: the pool cannot tell clients apart (a client opens as many sessions as it
  likes), so it shares its workers by the kind of work (the game id): one kind runs on all
  workers but one at most (on the only one, with one worker), so a flood of one slow game
  always leaves the other games a worker. Among the tasks allowed to start, the kind whose
  recent generations were quickest goes first (FIFO among equals), so a cheap reset never
  queues behind a slow one. A session runs one reset at a time, so it waits for at most one
  task.

One dispatcher thread hands tasks to idle workers, collects results and enforces deadlines;
callers (session lanes) block only on their task's future, with a timeout.

`GamePool` generates any TextArena game this way: the worker resets a fresh game with the seed
and returns the unwrapped game and the generator states after the reset, pickled; each session
unpickles its own copy and steps it with those generator states (see
`servers.textarena.environment.GameRandom`).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import itertools
import logging
import os
import pickle
import random
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing import get_context, resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple

from servers.textarena.errors import GamePoolBusy, GenerationTimeout, TextArenaOptionError

__all__ = ["WorkerPool", "GamePool", "GeneratedGame", "default_game_pool"]

logger = logging.getLogger("envsdk.server")

#: Seconds one generation may run before its worker is killed (``TEXTARENA_GENERATION_TIMEOUT_S``).
DEFAULT_TASK_TIMEOUT_S = 30.0
#: Queued generations per worker before new ones are refused (``TEXTARENA_MAX_QUEUED_GENERATIONS``
#: sets the total).
QUEUED_PER_WORKER = 64


#: The signals a worker leaves to its parent: a terminal's Ctrl-C and `kill -TERM -PGID` (a job
#: runner stopping a process group) reach every process of the group.
_PARENTS_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _worker_main(conn: Connection, preload: tuple[str, ...]) -> None:
    """A worker process: import `preload`, say it is ready, then run each ``(fn, args)``
    received and send back ``(ok, value)``."""
    # Ctrl-C and a SIGTERM to the process group are the parent's to handle (it kills its
    # workers as it stops). The parent started this process with both blocked (`_Worker`), so
    # none could arrive before this line: ignore them from now on, then unblock them.
    for signum in _PARENTS_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _PARENTS_SIGNALS)
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # the task that needs it reports why
            pass
    try:
        conn.send((True, None))  # ready: a task's deadline starts only now
    except (EOFError, OSError):
        return
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        try:
            reply: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # the caller gets it as the task's error
            reply = (False, exc)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send((False, RuntimeError(f"the result cannot be sent back: {exc!r}")))
        except (EOFError, OSError):
            return
        del fn, args, reply


class _Task:
    __slots__ = ("key", "kind", "fn", "args", "future", "waiters", "order", "worker", "started")

    def __init__(self, key: Hashable, kind: Hashable, fn: Any, args: tuple[Any, ...], order: int) -> None:
        self.key, self.kind, self.fn, self.args, self.order = key, kind, fn, args, order
        self.future: Future[Any] = Future()
        self.waiters = 0
        self.worker: _Worker | None = None
        self.started = 0.0


class _Worker:
    def __init__(self, name: str, preload: tuple[str, ...]) -> None:
        parent, child = get_context("spawn").Pipe()
        self.conn = parent
        self.process = get_context("spawn").Process(
            target=_worker_main, args=(child, preload), name=name, daemon=True
        )
        # The new interpreter inherits this thread's signal mask: with SIGINT and SIGTERM blocked
        # it cannot be interrupted while it imports its start-up code, whichever thread starts it
        # (a server's own, a replacement's), by a Ctrl-C at the terminal or a SIGTERM to the
        # process group, which reach the whole group and are the parent's to answer. The start
        # launches multiprocessing's resource tracker if it is not running, and that launch
        # unblocks both in this thread when it is done: launched first, it leaves the mask alone.
        resource_tracker.ensure_running()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, _PARENTS_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        child.close()
        self.task: _Task | None = None
        self.ready = False  # until the process has started and imported what it preloads

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


#: Most worker processes one pool starts (each is an interpreter with the game's modules, tens
#: of MB; they all start with the server): a count beyond it is refused, not a fork bomb.
MAX_WORKERS = 64


def worker_count(text: str) -> int:
    """argparse type of a server's worker count: an integer from 1 to `MAX_WORKERS`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_WORKERS}, got {text!r}") from None
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 1 to {MAX_WORKERS} (each worker is a process), got {value}"
        )
    return value


class WorkerPool:
    """Runs cached tasks in worker processes, under the bounds in the module docstring.

    Thread-safe. The processes start on first use (``spawn``: a fresh interpreter, safe in a
    threaded server); `warm` starts them ahead of time, `shutdown` stops them.
    """

    def __init__(
        self,
        workers: int | None = None,
        cache_size: int = 4096,
        cache_bytes: int = 256 * 2**20,
        *,
        task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S,
        max_queued: int | None = None,
    ) -> None:
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise TextArenaOptionError(f"a worker pool takes 1 to {MAX_WORKERS} workers, got {workers}")
        if task_timeout_s <= 0:
            raise TextArenaOptionError(f"task_timeout_s must be > 0, got {task_timeout_s}")
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.task_timeout_s = task_timeout_s
        self.max_queued = QUEUED_PER_WORKER * self.workers if max_queued is None else max_queued
        if self.max_queued < 0:
            raise TextArenaOptionError(f"max_queued must be >= 0, got {self.max_queued}")
        self.share = max(1, self.workers - 1)  # workers one kind may hold
        self.kind_queued = max(1, self.max_queued * 3 // 4)  # queued tasks one kind may hold
        self.killed = 0  # workers killed past a deadline or for a task nobody waited for
        self._cache: OrderedDict[Hashable, _Task] = OrderedDict()
        self._weights: dict[Hashable, int] = {}
        self._bytes = 0  # sum of _weights, kept as it changes: eviction runs under the lock
        self._queue: list[_Task] = []
        self._typical: dict[Hashable, float] = {}  # moving average of each kind's durations
        self._order = itertools.count()
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._pool: list[_Worker] = []
        self._wake_r, self._wake_w = -1, -1
        self._dispatcher: threading.Thread | None = None
        self._stopped = False

    #: Modules a worker imports before it takes tasks (a deadline counts from then).
    preload: tuple[str, ...] = ()

    def weigh(self, result: Any) -> int:
        """The bytes a cached `result` holds (counted against `cache_bytes`); 0 by default."""
        return 0

    # ------------------------------------------------------------ callers

    def generate(self, key: Hashable, kind: Hashable, fn: Any, *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` in a worker, shared with every caller of the same `key`; blocks for
        at most `timeout_s` (then gives the task up: see the module docstring). Raises what
        `fn` raised, `GamePoolBusy` (queue full), `GenerationTimeout` (the task's deadline or
        `timeout_s` passed)."""
        task = self._join(key, kind, fn, args)
        try:
            return task.future.result(timeout_s)
        except CancelledError:  # the pool shut down meanwhile
            raise GamePoolBusy("the game pool was shut down", retry_after_s=1.0) from None
        except FutureTimeout:
            raise GenerationTimeout(
                f"no game within {timeout_s:g}s (the game pool is busy); retry later", timeout_s
            ) from None
        finally:
            self._leave(task)

    def submit_cached(self, key: Hashable, kind: Hashable, fn: Any, *args: Any) -> Future[Any]:
        """The future of ``fn(*args)`` with nobody counted as waiting for it (a warm-up or a
        test; it is never cancelled for want of callers). Raises `GamePoolBusy`."""
        task = self._join(key, kind, fn, args)
        with self._lock:
            task.waiters += 1 << 30  # pinned
        return task.future

    def _join(self, key: Hashable, kind: Hashable, fn: Any, args: tuple[Any, ...]) -> _Task:
        with self._lock:
            if self._stopped:
                raise GamePoolBusy("the game pool is shut down", retry_after_s=1.0)
            task = self._cache.get(key)
            if task is not None and _usable(task):
                self._cache.move_to_end(key)
                task.waiters += 1
                return task
            same_kind = sum(1 for queued in self._queue if queued.kind == kind)
            if len(self._queue) >= self.max_queued or same_kind >= self.kind_queued:
                raise GamePoolBusy(
                    f"the game pool is at capacity ({len(self._queue)} generations queued, "
                    f"{self.workers} workers); retry later",
                    retry_after_s=min(self.task_timeout_s, 5.0),
                )
            task = _Task(key, kind, fn, args, next(self._order))
            task.waiters = 1
            self._cache[key] = task
            self._bytes -= self._weights.pop(key, 0)
            self._evict_locked()
            self._queue.append(task)
            self._start_locked()
        self._wake()
        return task

    def _leave(self, task: _Task) -> None:
        with self._lock:
            task.waiters -= 1
            if task.waiters > 0 or task.future.done():
                return
            # Nobody waits for it any more: drop it (a running one is stopped by the dispatcher).
            if task in self._queue:
                self._queue.remove(task)
                task.future.cancel()
            if self._cache.get(task.key) is task:
                del self._cache[task.key]
                self._bytes -= self._weights.pop(task.key, 0)
        self._wake()

    # ------------------------------------------------------------ cache

    def _weighed_locked(self, task: _Task) -> None:
        if self._cache.get(task.key) is task:
            weight = self.weigh(task.future.result())
            self._bytes += weight - self._weights.get(task.key, 0)
            self._weights[task.key] = weight
            self._evict_locked()

    def _evict_locked(self) -> None:
        while len(self._cache) > self.cache_size or (len(self._cache) > 1 and self._bytes > self.cache_bytes):
            evicted, _ = self._cache.popitem(last=False)
            self._bytes -= self._weights.pop(evicted, 0)

    # ------------------------------------------------------------ processes

    def warm(self) -> None:
        """Start every worker process now instead of on the first tasks (from any thread: a
        worker ignores Ctrl-C from its first instruction, see `_Worker`)."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._stopped:
            return
        if self._dispatcher is None:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_w, False)
            self._dispatcher = threading.Thread(target=self._dispatch, name="envsdk-game-pool", daemon=True)
            self._dispatcher.start()
        while len(self._pool) < self.workers:
            self._pool.append(_Worker(f"envsdk-game-worker-{next(self._names)}", self.preload))

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):  # already woken, or shut down
            pass

    def shutdown(self) -> None:
        """Stop the worker processes now, a running task included (a hard generation can take
        minutes, and exiting would otherwise wait for it); queued ones are cancelled.
        Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            workers, self._pool = self._pool, []
            tasks = list(self._queue) + [w.task for w in workers if w.task is not None]
            self._queue.clear()
            self._cache.clear()
            self._weights.clear()
            self._bytes = 0
        self._wake()
        for task in tasks:
            if not task.future.cancel():
                _fail(task, GamePoolBusy("the game pool was shut down", retry_after_s=1.0))
        for worker in workers:
            worker.process.kill()
        # The dispatcher stops before the connections it waits on are closed.
        if self._dispatcher is not None:
            self._dispatcher.join(timeout=5)
        for worker in workers:
            worker.process.join(timeout=5)
            worker.conn.close()
        if self._dispatcher is not None:
            os.close(self._wake_r)
            os.close(self._wake_w)

    # ------------------------------------------------------------ dispatcher

    def _next_locked(self, running: dict[Hashable, int]) -> _Task | None:
        """The queued task to start now: of the kinds below their share, the quickest."""
        allowed = [t for t in self._queue if running.get(t.kind, 0) < self.share]
        if not allowed:
            return None
        return min(allowed, key=lambda t: (self._typical.get(t.kind, 0.0), t.order))

    def _dispatch(self) -> None:
        while not self._stopped:
            try:
                self._dispatch_once()
            except Exception:  # a bug here must not leave every caller waiting forever
                logger.exception("the game pool's dispatcher failed; it goes on")
                time.sleep(0.1)

    def _dispatch_once(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._assign_locked()
            # Idle workers too: one that dies is noticed (and replaced) at once.
            workers = {w.conn: w for w in self._pool}
            now = time.monotonic()
            deadlines = [w.task.started + self.task_timeout_s - now for w in self._pool if w.task]
        ready = wait([*workers, self._wake_r], max(0.0, min(deadlines)) if deadlines else None)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        for conn, worker in workers.items():
            if conn in ready:
                self._collect(worker)
        self._reap()

    def _assign_locked(self) -> None:
        running: dict[Hashable, int] = {}
        for worker in self._pool:
            if worker.task is not None:
                running[worker.task.kind] = running.get(worker.task.kind, 0) + 1
        for worker in self._pool:
            if worker.task is not None or not worker.ready or not self._queue:
                continue
            task = self._next_locked(running)
            if task is None:
                return
            self._queue.remove(task)
            if not task.future.set_running_or_notify_cancel():
                continue
            try:
                worker.conn.send((task.fn, task.args))
            except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
                _fail(task, exc)
                continue
            worker.task, task.worker, task.started = task, worker, time.monotonic()
            running[task.kind] = running.get(task.kind, 0) + 1

    def _collect(self, worker: _Worker) -> None:
        task = worker.task
        if task is None and not worker.ready:
            try:
                worker.conn.recv()
                worker.ready = True
            except (EOFError, OSError):  # it died starting
                with self._lock:
                    self._replace_locked(worker)
            return
        try:
            ok, value = worker.conn.recv()
        except (EOFError, OSError):  # the worker died (e.g. the OOM killer)
            ok, value = False, RuntimeError("the game worker process died; retry")
            with self._lock:
                self._replace_locked(worker)
        except Exception as exc:  # a result that cannot be unpickled here
            ok, value = False, RuntimeError(f"the game worker's result cannot be read: {exc!r}")
        with self._lock:
            worker.task = None
            if task is None:
                return
            elapsed = time.monotonic() - task.started
            typical = self._typical.get(task.kind)
            self._typical[task.kind] = elapsed if typical is None else typical + (elapsed - typical) * 0.25
            if ok:
                task.future.set_result(value)
                self._weighed_locked(task)
            else:
                _fail(task, value)

    def _reap(self) -> None:
        """Kill and replace the workers whose task is overdue or nobody waits for any more."""
        now = time.monotonic()
        with self._lock:
            for worker in list(self._pool):
                task = worker.task
                if task is None:
                    continue
                overdue = now - task.started >= self.task_timeout_s
                if not overdue and task.waiters > 0:
                    continue
                self.killed += 1
                self._replace_locked(worker)
                if overdue:
                    logger.warning("a game generation (%s) passed its deadline of %gs; its worker was replaced",
                                   _short(task.kind), self.task_timeout_s)
                    _fail(task, GenerationTimeout(
                        f"the game generation did not finish within {self.task_timeout_s:g}s; "
                        "its worker was stopped", self.task_timeout_s,
                    ))
                elif not task.future.cancel():
                    _fail(task, RuntimeError("nobody waits for this game any more"))
                if self._cache.get(task.key) is task:
                    del self._cache[task.key]

    def _replace_locked(self, worker: _Worker) -> None:
        if worker not in self._pool:
            # Shutdown took it (or it was replaced already): its process and connection are
            # the taker's to close, never two threads closing one descriptor.
            return
        self._pool.remove(worker)
        worker.task = None
        worker.kill()
        self._start_locked()


def _usable(task: _Task) -> bool:
    """Whether a cached task gives (or will give) a result: not failed, not cancelled."""
    future = task.future
    return not future.done() or (not future.cancelled() and future.exception() is None)


def _fail(task: _Task, error: BaseException) -> None:
    if not task.future.done():
        try:
            task.future.set_exception(error)
        except Exception:  # set by another thread meanwhile
            pass


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:80] + "..."


class GeneratedGame(NamedTuple):
    """A game right after its seeded reset: the unwrapped game and the states of the global
    generators then, pickled (each session unpickles its own copy)."""

    payload: bytes


def _generate_game(env_id: str, kwargs: dict[str, Any], num_players: int, seed: int) -> GeneratedGame:
    """Worker-process task: TextArena's own seeded reset (seeds this process's generators)."""
    import textarena as ta
    from textarena.core import Wrapper

    from servers.textarena.nltk_data import forbid_downloads

    forbid_downloads()
    game = ta.make(env_id, **kwargs)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    game.reset(num_players=num_players, seed=seed)
    while isinstance(game, Wrapper):
        game = game.env
    numpy = sys.modules.get("numpy")  # the game may have imported it
    numpy_state = numpy.random.get_state() if numpy is not None else None
    return GeneratedGame(pickle.dumps((game, random.getstate(), numpy_state)))


class GamePool(WorkerPool):
    """Generates seeded TextArena games in worker processes; cached by (id, kwargs, players,
    seed), bounded by count and by pickled bytes (a word game carries its dictionary)."""

    preload = ("textarena", "servers.textarena.nltk_data")

    def weigh(self, result: Any) -> int:
        return len(result.payload)

    def game(self, env_id: str, kwargs: dict[str, Any], num_players: int, seed: int, *, timeout_s: float) -> GeneratedGame:
        """The game of `seed` (cached, shared); blocks up to `timeout_s` (see `generate`)."""
        key = (env_id, repr(sorted(kwargs.items())), num_players, seed)
        result: GeneratedGame = self.generate(
            key, env_id, _generate_game, env_id, dict(kwargs), num_players, seed, timeout_s=timeout_s
        )
        return result

    def submit(self, env_id: str, kwargs: dict[str, Any], num_players: int, seed: int) -> Future[GeneratedGame]:
        """The future game of `seed` (cached, shared, never given up: see `submit_cached`)."""
        key = (env_id, repr(sorted(kwargs.items())), num_players, seed)
        return self.submit_cached(key, env_id, _generate_game, env_id, dict(kwargs), num_players, seed)


_DEFAULT_POOL: GamePool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_game_pool() -> GamePool:
    """The process-wide `GamePool` every `TextArenaEnvironment` uses unless given another."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = GamePool()
            # Stopped before the interpreter finalises: a pool still running then could start a
            # replacement worker that dies reading its start-up data from a parent gone away.
            atexit.register(_DEFAULT_POOL.shutdown)
        return _DEFAULT_POOL
