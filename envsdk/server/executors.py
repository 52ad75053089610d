"""Where environment code runs: the event loop, one shared thread pool, an optional process pool.

* Coroutine functions run as tasks on the server's event loop; they must not block it.
* Plain functions run in ONE bounded `ThreadPoolExecutor` shared by every session (no thread
  per session): a slow sync env occupies one worker, not the loop.
* CPU-heavy work an environment wants off the GIL goes to the optional process pool through
  `await run_in_process(fn, *args)` (``fn`` and its arguments must be picklable).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

__all__ = ["Executors", "run_in_process"]

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Executors | None] = contextvars.ContextVar(
    "envsdk_server_executors", default=None
)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` gives a coroutine (so it must run on the loop, not in a thread)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)
    )


class Executors:
    """The server's shared pools. Created with the app; `shutdown` on server exit."""

    def __init__(self, thread_workers: int, process_workers: int = 0) -> None:
        self.threads = ThreadPoolExecutor(
            max_workers=thread_workers, thread_name_prefix="envsdk-env"
        )
        self._process_workers = process_workers
        self._processes: ProcessPoolExecutor | None = None

    def start(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start ``fn(*args, **kwargs)`` and return a future of its result, without waiting.

        A coroutine function becomes a task on the running loop (cancellable); anything else
        is submitted to the thread pool (a running thread cannot be cancelled: it finishes and
        its result is dropped). A sync function that returns an awaitable yields that
        awaitable as its result; the caller awaits it on the loop.
        """
        if is_async_callable(fn):
            future: asyncio.Future[Any] = asyncio.ensure_future(fn(*args, **kwargs))
            return future
        if kwargs:
            return asyncio.wrap_future(self.threads.submit(functools.partial(fn, *args, **kwargs)))
        return asyncio.wrap_future(self.threads.submit(fn, *args))

    async def run_in_process(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the process pool (the thread pool when there is none)."""
        loop = asyncio.get_running_loop()
        if self._process_workers <= 0:
            return await loop.run_in_executor(self.threads, fn, *args)
        if self._processes is None:
            self._processes = ProcessPoolExecutor(max_workers=self._process_workers)
        return await loop.run_in_executor(self._processes, fn, *args)

    def bind(self) -> contextvars.Token[Executors | None]:
        """Make these the executors `run_in_process` uses in the current context (and in every
        task started from it)."""
        return _CURRENT.set(self)

    def shutdown(self) -> None:
        """Stop accepting work; running threads finish on their own, queued work is dropped."""
        self.threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)
            self._processes = None


async def run_in_process(fn: Callable[..., T], *args: Any) -> T:
    """Await ``fn(*args)`` in the serving app's process pool, off the event loop and the GIL.

    For CPU-heavy work inside an ``async def`` environment method (e.g. generating a hard
    Sudoku board). ``fn`` and ``args`` must be picklable (a module-level function). With
    ``ServerConfig.process_workers == 0`` the call runs in the shared thread pool instead;
    outside a server (no app bound) it runs in a fresh default executor thread.
    """
    executors = _CURRENT.get()
    if executors is None:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    return await executors.run_in_process(fn, *args)
