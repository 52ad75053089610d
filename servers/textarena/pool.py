"""Seeded game generation in worker processes, cached and shared between sessions.

A TextArena ``reset(seed=s)`` seeds the process-wide ``random`` generator and then generates
the game from it: seconds of pure Python for some games (RushHour, Sokoban, Sudoku's hard
boards), GIL-bound and, in a shared process, mixed with every other session's draws. A
`WorkerPool` runs such work in ``spawn``ed worker processes instead (one task at a time per
worker, so the global generator a worker seeds serves that task alone), caches results by key
and hands the same future to every caller asking for the same key (a GRPO group of sessions
sharing a seed generates its game once).

`GamePool` generates any TextArena game this way: the worker resets a fresh game with the seed
and returns the unwrapped game and the generator states after the reset, pickled; each session
unpickles its own copy and steps it with those generator states (see
`servers.textarena.environment.GameRandom`).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import random
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, NamedTuple, TypeVar

from servers.textarena.errors import TextArenaOptionError

__all__ = ["WorkerPool", "GamePool", "GeneratedGame", "await_shared", "default_game_pool"]

T = TypeVar("T")


def _noop() -> None:
    return None


def _ignore_sigint() -> None:
    # Workers leave Ctrl-C to the parent, which stops them through `shutdown`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class WorkerPool:
    """Runs cached tasks in worker processes; `submit_cached` never blocks on the work.

    Thread-safe. The processes start on first use (``spawn``: a fresh interpreter, safe in a
    threaded server); `warm` starts them ahead of time, `shutdown` stops them.
    """

    def __init__(
        self, workers: int | None = None, cache_size: int = 4096, cache_bytes: int = 256 * 2**20
    ) -> None:
        if workers is not None and workers < 1:
            raise TextArenaOptionError(f"a worker pool needs at least 1 worker, got {workers}")
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[Hashable, Future[Any]] = OrderedDict()
        self._weights: dict[Hashable, int] = {}
        self._bytes = 0  # sum of _weights, kept as it changes: eviction runs under the lock
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def weigh(self, result: Any) -> int:
        """The bytes a cached `result` holds (counted against `cache_bytes`); 0 by default."""
        return 0

    def submit_cached(self, key: Hashable, fn: Any, *args: Any) -> Future[Any]:
        """The future of ``fn(*args)`` in a worker, shared by every caller with `key` (a failed
        one is retried). The cache keeps at most `cache_size` results and about `cache_bytes`
        bytes of them, dropping the least recently asked for first."""
        with self._lock:
            future = self._cache.get(key)
            if future is not None and not (future.done() and future.exception() is not None):
                self._cache.move_to_end(key)
                return future
            future = self._submit_locked(fn, *args)
            self._cache[key] = future
            self._bytes -= self._weights.pop(key, 0)
            self._evict_locked()
        future.add_done_callback(lambda done: self._weighed(key, done))
        return future

    def _weighed(self, key: Hashable, done: Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        with self._lock:
            if self._cache.get(key) is done:
                weight = self.weigh(done.result())
                self._bytes += weight - self._weights.get(key, 0)
                self._weights[key] = weight
                self._evict_locked()

    def _evict_locked(self) -> None:
        while len(self._cache) > self.cache_size or (
            len(self._cache) > 1 and self._bytes > self.cache_bytes
        ):
            evicted, _ = self._cache.popitem(last=False)
            self._bytes -= self._weights.pop(evicted, 0)

    def warm(self) -> None:
        """Start every worker process now instead of on the first tasks.

        Called from the main thread, the workers are started with SIGINT ignored, which they
        keep from their first instruction: a Ctrl-C at the terminal (sent to the whole process
        group) then never interrupts a worker still importing, and the parent, which stops
        them, answers it alone."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            with self._lock:
                for _ in range(self.workers):
                    self._submit_locked(_noop)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def shutdown(self) -> None:
        """Stop the worker processes now, a running task included (a hard generation can take
        minutes, and exiting would otherwise wait for it); queued ones are cancelled.
        Idempotent."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._cache.clear()
            self._weights.clear()
            self._bytes = 0
        if executor is None:
            return
        # Python < 3.14 has no public way to stop a busy worker; `_processes` is the executor's
        # own table of them.
        workers = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(timeout=5)

    def _submit_locked(self, fn: Any, *args: Any) -> Future[Any]:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=get_context("spawn"), initializer=_ignore_sigint
            )
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool:
            # A worker died (e.g. killed by the OOM killer): replace the pool, retry once.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=get_context("spawn"), initializer=_ignore_sigint
            )
            return self._executor.submit(fn, *args)


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

    def weigh(self, result: Any) -> int:
        return len(result.payload)

    def submit(
        self, env_id: str, kwargs: dict[str, Any], num_players: int, seed: int
    ) -> Future[GeneratedGame]:
        """The future game of `seed` (cached, shared)."""
        key = (env_id, repr(sorted(kwargs.items())), num_players, seed)
        return self.submit_cached(key, _generate_game, env_id, dict(kwargs), num_players, seed)


_DEFAULT_POOL: GamePool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_game_pool() -> GamePool:
    """The process-wide `GamePool` every `TextArenaEnvironment` uses unless given another."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = GamePool()
        return _DEFAULT_POOL


async def await_shared(future: Future[T]) -> T:
    """Await a future other sessions may share, without cancelling it when this waiter is
    cancelled (``asyncio.wrap_future`` would cancel the shared future)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def copy_result(done: Future[T]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.set_exception(RuntimeError("generation was cancelled (pool shut down)"))
        elif done.exception() is not None:
            waiter.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[T]) -> None:
        try:
            loop.call_soon_threadsafe(copy_result, done)
        except RuntimeError:  # the loop closed while the game was being generated
            pass

    future.add_done_callback(on_done)
    return await waiter
