"""Where environment code runs: the event loop, one lane per session, an optional process
pool.

* Coroutine functions run as tasks on the server's event loop; they must not block it.
* Plain functions of a session run on that session's **lane**: the session's calls one after
  another, in order (factory, reset, step, state, close), on a daemon thread the lane starts
  for them and lets go once the session has had no call for ``lane_idle_s`` (5 s by default;
  see below). An env whose instances hold thread-bound resources (an sqlite connection, a
  browser, a CUDA context, a greenlet, thread-local state) declares ``THREAD_BOUND = True`` on
  its class: each of its sessions keeps one thread for its whole life, so the env always meets
  them on the thread that made them, as OpenEnv's users expect. An env class with
  ``REQUIRES_SINGLE_THREAD_EXECUTOR = True`` (OpenEnv's attribute, e.g. for Playwright) gets
  one lane shared by all its sessions, whose thread never goes either.
* CPU-heavy work an environment wants off the GIL goes to the optional process pool through
  `await run_in_process(fn, *args)` (``fn`` and its arguments must be picklable).

Why one lane per session, and why this hand-off
-----------------------------------------------
A thread cannot be cancelled. When a call passes its deadline its thread is *written off*:
it finishes the call (whenever that is), then closes the env it was running and exits; the
session gets a fresh lane on its next call. With one lane per session a written-off thread
takes nothing with it but its own session's episode, so hung calls never starve anyone else.
Lanes shared between sessions were considered: a hung call would then strand every other
session of its lane, or move their envs (and their thread-bound resources) to another thread.
The threads written off but still running are counted and capped (``max_abandoned_threads``;
/health and /metrics report them): past the cap a call that needs a new lane (a new session,
a reset after a TIMEOUT) is refused with CAPACITY_REACHED. A parked lane starting its thread
again is not refused: it holds nothing a hung call took.

The hand-off is the whole cost of the default path for a fast env. What costs is the thread
switch itself (futex wake-ups, the GIL handed over and back), not the lane being one thread per
session: ONE hot thread serving every session costs the same CPU per call (`python -m bench
handoff`: about 18-20 us of CPU per call for any hand-off to another thread on a 2-core VM,
against 1.4 us inline). Inside the server the hand-off costs more when the loop goes on serving
while the lane runs, because the lane then takes the GIL at each of the loop's socket system
calls. So a call is handed over in one of two ways:

* **Waited** (calls of a kind that recently took under a tenth of ``lane_wait_s``, 1 ms by
  default): the loop queues the call on the lane (see below) and blocks, GIL released,
  on a lock the lane releases when the call returns, for at most ``lane_wait_s``. Two thread
  switches and no future, timer, task switch or loop wake-up. A call that is not done in time
  (a hung or suddenly slow env) is not waited for any longer: it goes on as an awaited call
  under its deadline, and its kind is not waited for again until its calls are fast again.
  So the loop loses at most ``lane_wait_s`` to a call that misbehaves, once.
* **Awaited** (slow kinds, or the rest of a call that was not done in time): the loop goes on
  serving; the lane appends the outcome to one deque shared by all lanes and only the first
  outcome of a batch wakes the loop (`call_soon_threadsafe`, a write on its self-pipe); that
  one wake-up delivers every outcome queued meanwhile. A call that waits on I/O overlaps with
  everyone else's.

**How a lane is woken.** Each lane sleeps in a read of its own eventfd (a counter the kernel
keeps; Linux), and the loop queues a call by appending it to the lane's deque and writing the
eventfd. CPython releases the GIL around both system calls, and that is the point: the lane,
woken while the loop is still inside its write, finds the GIL free and runs the call at once.
A lock or `queue.SimpleQueue` is released with the GIL held, so a lane woken on the loop's own
core preempted the loop, found the GIL taken and slept again: the loop thread counted 0.7
voluntary + 1.9 involuntary context switches per step at 256 sessions with the queue, 0.6 +
0.6 with the eventfd (`python -m bench trivial` reports this per server). In-process, with the
other core busy as the load generator keeps it, one waited hand-off costs 10.9 instead of
15.7 us of CPU (`python -m bench handoff --busy 1`); in the server, 97-99 instead of 107-112 us
per step at 1,024 sessions and no measurable change at 256 (runs alternated with the previous
code; bench/RESULTS.md, "Performance notes"). A lane holds an eventfd while its thread runs.
Lanes' eventfds never take a descriptor a session's socket may need: at most a quarter of the
file-descriptor limit, and no more than the limit less one per session of the capacity and 256
for the rest; past that, and where there is no eventfd, a lane is woken through a
`queue.SimpleQueue` as before. (The quarter alone let 5,000 eventfds and 14,993 sockets reach a
limit of 20,000, and every further handshake failed: at its limit a server cannot accept, and
asyncio then stops accepting for a second at a time, so handshakes in the backlog time out,
while uvloop accepts each new connection and closes it at once.)

Which of the two a kind of call gets is decided from how long its recent calls ran on their
lanes (a moving average per env class and method), measured on the lane thread. Measured at
256 sessions of the echo env, alternating servers (2-core VM, server CPU per step): awaited
only 111-123 us, waited 91-98 us (p99 70-79 ms -> 40-42 ms), ``INLINE_SYNC`` 60-83 us
(`python -m bench core` re-runs this comparison: ``envsdk`` vs ``envsdk-awaited``). Tried
and dropped as prototypes, each slower or no better: collecting a loop iteration's calls and
waiting for them as one batch (a future per call costs more than the switches it saves),
``SCHED_BATCH`` for lane threads; see bench/RESULTS.md. (An eventfd wake-up was first tried
at 256 sessions only, where it shows no change either; the switch counts and 1,024 sessions
above are why it is kept.)

Lane threads are daemons and nothing joins them, so a process told to exit exits even while
an env call never returns.

What an idle session costs, and why lanes park
----------------------------------------------
A session with no call in flight holds no thread: an idle session is its socket, its protocol
objects and its env, 37 KiB of server RSS for the echo env (34 KiB with ``INLINE_SYNC``, which
never has a lane thread), against 64 KiB while every session kept a thread waiting for its next
call (the thread's stack pages and interpreter state, and its eventfd; `python -m bench scale
--sessions 16384`, 2-core VM). A lane *parks* once it has had no call for ``lane_idle_s`` (to
twice that): its thread exits and its eventfd is closed, and the session's next call starts a
new thread, about 100-110 us of CPU for the thread's start and exit, once per idle stretch: a
session calling more often than every ``lane_idle_s`` never pays it, one calling less often
pays it once per call. The threads alive are those of sessions that had a call in the last
``lane_idle_s`` or so. Measured with one client opening 16,384 sessions of the echo env, 256
handshakes at a time, each reset at once and stepped once after all were idle: every session
answered, server RSS 656 MiB idle and 889 MiB at its peak (8,501 threads while the sessions
opened); with a thread per session the same run opened 14,986 (the rest failed: "How a lane is woken")
holding 14,991 threads and 1,001 MiB.

Parking is decided on the loop, the only thread that queues calls, by one pass every
``lane_idle_s`` over the lanes that have a thread: a lane parks when the calls queued on it
(counted on the loop) equal the calls it has run (counted by its thread after each outcome is
delivered) and neither count moved since the previous pass. A call queued afterwards finds the
lane parked and starts a thread with an empty queue of its own, so no call is lost or runs out
of order, and the hot path takes no lock. A lane timing out its own wait was the alternative:
a read of an eventfd has no timeout, so every hand-off would pay a ``poll`` system call more,
and a lock would be needed where the lane decides to exit while the loop queues a call.

``async def`` methods that block
--------------------------------
A coroutine runs on the loop on trust: while it computes or sleeps without awaiting, every
session waits. `LoopStalls` notices it where it happens: every env coroutine is driven through
a thin proxy that reads the clock around each stretch it runs (each ``send`` into it, from one
await to the next); a stretch over ``loop_stall_s`` (0.1 s by default) is counted in /metrics
by env class and method (``envsdk_loop_stalls_total``, ``envsdk_loop_stall_seconds_total``)
and logged, the first time with what to do about it and then at most once a minute per method.
The proxy is a Python generator around the coroutine: about 1-3 us of CPU per call (a trivial
async step, one stretch), against 9-12 us for the task that runs the call (measured in-process
on a loaded 2-core VM); sync env methods, on lanes, do not pass through it. It names the method
for certain, since it is that method's coroutine being resumed. A watchdog thread
sampling a loop heartbeat was the alternative: it could also report a stretch while it is still
running, but it wakes the process forever to catch a rare fault, and it still needs the same
bookkeeping to know whose code holds the loop. Neither can end the stretch (nothing preempts
code on the loop, deadlines included): the cure is a plain ``def``, which runs on the lane
under its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, TypeVar

__all__ = [
    "Executors", "Lane", "LaneCall", "EnvAborted", "LoopStalls", "OwnLoop", "run_in_process", "is_async_callable",
]

logger = logging.getLogger("envsdk.server")

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Executors | None] = contextvars.ContextVar(
    "envsdk_server_executors", default=None
)

_Outcome = tuple["asyncio.Future[Any]", Any, "BaseException | None"]
_Work = tuple["LaneCall | asyncio.Future[Any] | None", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _eventfd() -> int | None:
    """A counting eventfd for a lane's wake-ups; None where there is none (not Linux) or the
    process is out of file descriptors (that lane then wakes through a queue)."""
    if not hasattr(os, "eventfd"):
        return None
    try:
        return os.eventfd(0, os.EFD_SEMAPHORE | os.EFD_CLOEXEC)
    except OSError:
        return None


def _fd_limit() -> int:
    """This process's soft limit of open files (0 when unknown)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def _fd_budget() -> int:
    """How many lanes may hold an eventfd at most: a quarter of the file descriptor limit
    (`Executors.may_wake_by_fd` also leaves room for every session's socket)."""
    return _fd_limit() // 4


#: Descriptors left to everything but lanes and sessions' sockets (listening socket, logs,
#: HTTP clients, what envs open themselves).
_FDS_SPARED = 256


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` gives a coroutine (so it must run on the loop, not in a thread)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)
    )


class OwnLoop:
    """An event loop of one env instance's own, made on first use, on which that env's
    coroutines run to completion on the calling thread: its lane (so a coroutine method is
    served like a sync one, never on the server's loop). Every call of an env runs on its lane,
    hence on one thread and this one loop, so what the env keeps between calls that belongs to
    its loop (queues, locks, open connections) stays valid. Called inside a running event loop
    (the server's ``inline_sync`` mode, or a coroutine calling it directly), `run` returns the
    coroutine for that loop to await instead.

    `close` shuts the loop down on the calling thread (after an optional last coroutine, e.g.
    the env's async close); asked from another thread while a call still runs on the loop (one
    written off by its deadline), it does not wait: the call's thread does it once the call
    returns. Used by `envsdk.adapters.EnvEnvironment` and, for OpenEnv's ``reset_async`` /
    ``step_async``, by the sessions."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # guards the three fields below
        self._running = False
        self._closing: Callable[[], Coroutine[Any, Any, None] | None] | None = None
        self._task: asyncio.Task[Any] | None = None

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T | Coroutine[Any, Any, T]:
        """`run` of ``fn(*args, **kwargs)``: a plain function (run on the lane) for a coroutine one."""
        return self.run(fn(*args, **kwargs))

    def run(self, coro: Coroutine[Any, Any, T]) -> T | Coroutine[Any, Any, T]:
        """`coro` run to completion on this loop; `coro` itself inside a running loop."""
        if _running_loop() is not None:
            return coro
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            loop = self._loop
            self._running = True
            task: asyncio.Task[T] = loop.create_task(coro)
            self._task = task
        try:
            return loop.run_until_complete(task)
        finally:
            with self._lock:
                self._running = False
                self._task = None
                closing, self._closing = self._closing, None
            if closing is not None:
                self.shut_down(closing)

    def cancel(self) -> None:
        """Cancel the call running on this loop, from any thread (its deadline wrote it off: a
        coroutine can be stopped where a thread cannot, so its lane is freed)."""
        with self._lock:
            task, loop = self._task, self._loop
            if task is not None and loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

    def close_later(self, last: Callable[[], Coroutine[Any, Any, None] | None] | None = None) -> bool:
        """True when a call is running on this loop (on another thread): that thread shuts the
        loop down, after `last`, once the call returns. False otherwise (nothing done)."""
        with self._lock:
            if self._running:
                self._closing = last or _nothing
                return True
        return False

    def close(self) -> None:
        """Shut the loop down now on this thread, or when the running call returns."""
        if not self.close_later():
            self.shut_down()

    def shut_down(self, last: Callable[[], Coroutine[Any, Any, None] | None] | None = None) -> None:
        """Run ``last()`` (when it gives a coroutine) on the loop, then close the loop (its
        async generators shut down, what the env left running cancelled), on this thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        final = last() if last is not None else None
        if loop is None:
            if final is None:
                return
            loop = asyncio.new_event_loop()
        try:
            if final is not None:
                loop.run_until_complete(final)
        finally:
            try:
                # What the env left running is cancelled, as asyncio.run does at its end.
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


def _nothing() -> None:
    return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class EnvAborted(Exception):
    """An env call raised a `BaseException` that is not an `Exception` (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``): carried back as an ordinary error, so the
    session gets an error frame and the server goes on."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__)
        self.cause = cause


class Lane:
    """The calls of one session (or, shared, of every session of one env class), run one after
    another, in order, on a daemon thread. Created by `Executors.lane`.

    A lane that does not keep its thread (`keeps_thread` False) *parks* once it has been idle
    for the executors' ``lane_idle_s``: its thread exits and its wake-up is closed; the next
    call queued on it starts a new thread. Both happen on the loop, the only thread that queues
    calls, and a lane parks only when every call queued on it has returned, so nothing queued
    is lost or reordered (see the module docstring)."""

    __slots__ = (
        "_executors", "_fd", "_queued", "_ran", "_seen", "_stopped", "_wake", "_work", "abandoned", "keeps_thread",
        "name", "retired", "thread",
    )

    def __init__(self, executors: Executors, name: str, wake_fd: bool = True, keeps_thread: bool = True) -> None:
        self._executors = executors
        self.name = name
        #: False: the thread parks when idle (`Executors.park_idle`). Set True (from any
        #: thread: the parking pass reads it) to keep the thread from then on.
        self.keeps_thread = keeps_thread
        # The running thread's queue and wake-up; None while parked or stopped.
        self._work: collections.deque[_Work | None] | None = None
        self._wake: Callable[[], Any] | None = None
        self._fd: int | None = None
        #: The lane's thread: the running one, or the last one once parked or stopped.
        self.thread: threading.Thread | None = None
        self._stopped = False
        self.abandoned = False
        self.retired = False
        # Calls queued (counted on the loop) and calls run (counted on the thread, after each
        # call's outcome is delivered): equal when nothing queued is left to run.
        self._queued = 0
        self._ran = 0
        self._seen = (-1, -1)  # both counts at the previous idle check
        self._start(wake_fd)

    @property
    def parked(self) -> bool:
        """No thread now: the next call starts one (a stopped lane takes no more calls)."""
        return self._work is None and not self._stopped

    def _start(self, wake_fd: bool) -> tuple[collections.deque[_Work | None], Callable[[], Any]]:
        # On the loop: a new thread with its own queue and wake-up. Each queued call is one
        # count on the wake-up: an eventfd where there is one (written and read with the GIL
        # released, see the module docstring), else a queue.
        work: collections.deque[_Work | None] = collections.deque()
        fd = _eventfd() if wake_fd else None
        wait: Callable[[], Any]
        if fd is None:
            tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
            wake: Callable[[], Any] = functools.partial(tokens.put, None)
            wait = tokens.get
        else:
            wake = functools.partial(os.eventfd_write, fd, 1)
            wait = functools.partial(os.eventfd_read, fd)
            self._executors._fds.add(fd)
        thread = threading.Thread(target=self._run, args=(work, wait, fd), name=self.name, daemon=True)
        try:
            thread.start()
        except BaseException:
            if fd is not None:
                self._executors._fds.discard(fd)
                os.close(fd)
            raise
        self._work, self._wake, self._fd, self.thread = work, wake, fd, thread
        self._seen = (-1, -1)
        return work, wake

    def _put(self, work: _Work | None) -> None:
        # On the loop. Work queued after `stop` never runs (as before it, behind the end mark).
        # A parked lane starts its thread first: raises RuntimeError when the OS has none to
        # give, and the call is then not queued.
        queued, wake = self._work, self._wake
        if queued is None or wake is None:
            if self._stopped:
                return
            queued, wake = self._start(self._executors.may_wake_by_fd())
            self._executors.unparked(self)
        queued.append(work)
        self._queued += 1
        wake()

    def _end_thread(self) -> None:
        # On the loop: the running thread exits after the calls queued so far; its queue and
        # wake-up are forgotten here (the thread closes the wake-up on its way out).
        work, wake = self._work, self._wake
        self._work = self._wake = self._fd = None
        if work is not None and wake is not None:
            work.append(None)
            wake()

    def park_if_idle(self) -> bool:
        """Park the lane (on the loop) if no call was queued or ran on it since the previous
        check and none is running now. True when it has no thread any more (parked now, or
        already parked or stopped)."""
        if self._work is None:
            return True
        counts = (self._queued, self._ran)
        if counts != self._seen or counts[0] != counts[1]:
            self._seen = counts
            return False
        self._end_thread()
        return True

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> asyncio.Future[Any]:
        """Queue ``fn(*args, **kwargs)`` behind this lane's earlier calls; a future (of the
        running loop) of its result. A `BaseException` that is not an `Exception` arrives as
        `EnvAborted`. Cancelling the future does not stop a call that has started."""
        future: asyncio.Future[Any] = self._executors.loop().create_future()
        self._put((future, fn, args, kwargs or {}))
        return future

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], wait_s: float) -> LaneCall:
        """Queue ``fn(*args, **kwargs)`` and block this (the loop's) thread for at most `wait_s`
        seconds until it returns. The returned `LaneCall` is either `settled` (its `result` or
        `error` is there) or carries a `future` of the running loop that gets the outcome
        (`wait_s` 0: always the latter, without blocking). Either way `elapsed` is the call's
        duration on the lane once it has returned. RuntimeError: a parked lane could not start
        its thread (the OS's thread limit); nothing was queued."""
        call = LaneCall()
        if wait_s <= 0:
            # Not waited for: the loop claims the outcome before the lane can, so it always
            # arrives through the future (a lane faster than the loop must not make it look
            # waited for, nor settle it on a path the loop did not take).
            call.future = self._executors.loop().create_future()
            call.claim.pop()
            self._put((call, fn, args, kwargs))
            return call
        self._put((call, fn, args, kwargs))
        if call.done.acquire(True, wait_s):
            call.settled = True
            return call
        call.future = self._executors.loop().create_future()
        try:
            call.claim.pop()  # from now on the lane delivers through the future
        except IndexError:  # the lane returned first: the outcome is already there
            call.settled = True
        return call

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` with no one waiting for it (errors are logged)."""
        self._put((None, fn, args, {}))

    def stop(self) -> None:
        """Let the thread exit once every call queued so far has run (later calls never run)."""
        if not self._stopped:
            self._end_thread()
            self._stopped = True

    def _run(self, work: collections.deque[_Work | None], wait: Callable[[], Any], fd: int | None) -> None:
        take, finished, clock = work.popleft, self._executors._finished, time.perf_counter
        while True:
            wait()
            item = take()
            if item is None:
                if fd is not None:
                    self._executors._fds.discard(fd)
                    os.close(fd)
                return
            call, fn, args, kwargs = item
            result: Any = None
            error: BaseException | None = None
            started = clock()
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                error = exc
            except BaseException as exc:  # SystemExit & co. from env code: a reply, not a dead lane
                error = EnvAborted(exc)
            if isinstance(call, LaneCall):
                call.elapsed = clock() - started
                call.result, call.error = result, error
                try:
                    call.claim.pop()
                except IndexError:  # the loop stopped waiting: deliver through the future
                    finished(call.future, result, error)  # type: ignore[arg-type]  # set before the pop
                else:
                    call.done.release()
            elif call is not None:
                finished(call, result, error)
            elif error is not None:
                logger.warning("%s raised %r on a lane", getattr(fn, "__qualname__", fn), error)
            self._ran += 1  # only this thread writes it; after the outcome is out
            del item, call, fn, args, kwargs, result, error  # hold nothing while waiting


class LaneCall:
    """One call handed to a lane by `Lane.call`. The loop and the lane race to pop `claim`:
    the lane wins if the call returned while the loop still waited (it then releases `done`),
    the loop wins if it stopped waiting first (the lane then delivers through `future`)."""

    __slots__ = ("done", "claim", "future", "settled", "result", "error", "elapsed")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.claim = [True]
        self.future: asyncio.Future[Any] | None = None
        self.settled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.elapsed: float | None = None


class Executors:
    """The lanes and pools of one app. Created with the app; `shutdown` on server exit.

    Every method but `_finished` runs on the event loop.
    """

    def __init__(
        self, max_abandoned_threads: int, process_workers: int = 0, lane_idle_s: float | None = None,
        socket_fds: int = 0,
    ) -> None:
        self.max_abandoned_threads = max_abandoned_threads
        #: File descriptors the sessions' sockets may hold (the session capacity).
        self.socket_fds = socket_fds
        #: How long a session's lane may sit idle before its thread exits (None: never).
        self.lane_idle_s = lane_idle_s
        self._process_workers = process_workers
        self._processes: ProcessPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: collections.deque[_Outcome] = collections.deque()
        self._wake_pending = False
        self._names = itertools.count(1)
        self._lanes: set[Lane] = set()
        self._threaded: set[Lane] = set()  # lanes of `_lanes` with a thread now
        self._parking: set[Lane] = set()  # those of them that park when idle
        self._park_timer: asyncio.TimerHandle | None = None
        self._park_loop: asyncio.AbstractEventLoop | None = None
        self._abandoned: set[Lane] = set()
        self._retiring: set[Lane] = set()
        self._shared: dict[type, Lane] = {}
        # Lanes' open eventfds. Added on the loop, discarded by the exiting lane thread: set
        # operations are atomic under the GIL.
        self._fds: set[int] = set()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, remembered as the one finished calls wake (an app served again
        on a new loop, e.g. in-process in another `asyncio.run`, moves with it)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._wake_pending = False
        return loop

    # ------------------------------------------------------------ lanes

    @property
    def live_lanes(self) -> int:
        """Lane threads serving sessions now (a parked lane has none)."""
        return len(self._threaded)

    @property
    def abandoned_threads(self) -> int:
        """Lane threads written off by a deadline whose call has not returned yet."""
        self._abandoned = {lane for lane in self._abandoned if lane.thread is not None and lane.thread.is_alive()}
        return len(self._abandoned)

    def lane(self, env_class: type | None = None) -> Lane:
        """A lane for a new session: its own, or, for an env class with
        ``REQUIRES_SINGLE_THREAD_EXECUTOR``, the one lane all its sessions share. A lane of its
        own parks when idle (`lane_idle_s`) unless the class is ``THREAD_BOUND``; a shared lane
        never parks.

        Raises `LaneLimit` when ``max_abandoned_threads`` written-off threads are still running,
        RuntimeError when the OS starts no more threads.
        """
        shared = env_class is not None and bool(getattr(env_class, "REQUIRES_SINGLE_THREAD_EXECUTOR", False))
        if shared and env_class in self._shared:
            return self._shared[env_class]
        abandoned = self.abandoned_threads
        if abandoned >= self.max_abandoned_threads:
            raise LaneLimit(abandoned, self.max_abandoned_threads)
        self.loop()
        keeps = shared or self.lane_idle_s is None or bool(getattr(env_class, "THREAD_BOUND", False))
        lane = Lane(self, f"envsdk-env-lane-{next(self._names)}", self.may_wake_by_fd(), keeps)
        self._lanes.add(lane)
        self.unparked(lane)
        if shared:
            assert env_class is not None
            self._shared[env_class] = lane
        return lane

    def may_wake_by_fd(self) -> bool:
        """Whether a lane thread starting now may hold an eventfd: lanes hold at most
        `_fd_budget` of them, and never one that a session's socket may need (each of
        `socket_fds` sessions holds one, and `_FDS_SPARED` are left for the rest). A server at
        the limit cannot accept a connection: asyncio then stops accepting for a second at a
        time, and handshakes waiting in the backlog time out."""
        return len(self._fds) < min(_fd_budget(), _fd_limit() - self.socket_fds - _FDS_SPARED)

    def unparked(self, lane: Lane) -> None:
        """`lane` (a session's) has a thread now: counted, and watched for idleness if it parks."""
        if lane not in self._lanes:
            return
        self._threaded.add(lane)
        if lane.keeps_thread or self.lane_idle_s is None:
            return
        self._parking.add(lane)
        loop = self._loop
        if loop is not None and (self._park_timer is None or self._park_loop is not loop):
            self._park_loop = loop
            self._park_timer = loop.call_later(self.lane_idle_s, self.park_idle)

    def park_idle(self) -> None:
        """Park every lane idle since the previous pass (`Lane.park_if_idle`); runs every
        ``lane_idle_s`` while some lane may park, so an idle lane's thread exits after
        ``lane_idle_s`` to twice that."""
        self._park_timer = None
        done = [lane for lane in self._parking if lane.keeps_thread or lane.park_if_idle()]
        self._parking.difference_update(done)
        self._threaded.difference_update(lane for lane in done if lane.parked)
        if self._parking and self._park_loop is not None and not self._park_loop.is_closed():
            self._park_timer = self._park_loop.call_later(self.lane_idle_s or 0.0, self.park_idle)

    def is_shared(self, lane: Lane) -> bool:
        return lane in self._shared.values()

    def retire(self, lane: Lane) -> None:
        """A session is done with `lane`: its thread exits after the calls queued so far (a
        shared lane stays for the other sessions)."""
        if self.is_shared(lane) or lane.retired:
            return
        lane.retired = True
        self._forget(lane)
        if len(self._retiring) > 64 + len(self._lanes):  # forget the threads that exited
            self._retiring = {old for old in self._retiring if old.thread is not None and old.thread.is_alive()}
        if not lane.parked:
            self._retiring.add(lane)
        lane.stop()

    def abandon(self, lane: Lane) -> None:
        """Write `lane` off (a call on it passed its deadline): no new work goes to it; its
        thread runs what is queued (the caller queues the env's close) and exits."""
        if lane.abandoned:
            return
        lane.abandoned = True
        lane.retired = True
        self._forget(lane)
        for cls, shared in list(self._shared.items()):
            if shared is lane:
                del self._shared[cls]
        self._abandoned.add(lane)
        lane.stop()

    def _forget(self, lane: Lane) -> None:
        self._lanes.discard(lane)
        self._threaded.discard(lane)
        self._parking.discard(lane)

    async def wait_threads(self, timeout_s: float) -> None:
        """Wait (polling, up to `timeout_s`) until every retired or written-off lane thread has
        run what was queued on it (an env's close, after the call it was running) and exited."""
        give_up_at = self.loop().time() + timeout_s
        while True:
            self._retiring = {lane for lane in self._retiring if lane.thread is not None and lane.thread.is_alive()}
            if not self._retiring and not self.abandoned_threads:
                return
            if self.loop().time() >= give_up_at:
                return
            await asyncio.sleep(0.05)

    def _finished(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        # On a lane thread. Only the first outcome of a batch wakes the loop.
        self._done.append((future, result, error))
        loop = self._loop  # set before any lane exists
        if loop is not None and not self._wake_pending:
            self._wake_pending = True
            try:
                loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is closed: the server is gone and nobody waits
                pass

    def _deliver(self) -> None:
        # Cleared first: an outcome appended from now on schedules its own wake-up.
        self._wake_pending = False
        done = self._done
        while done:
            future, result, error = done.popleft()
            if future.done():  # its deadline passed, or the caller gave up
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    # ------------------------------------------------------------ process pool

    async def run_in_process(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the process pool (a one-off daemon thread when there is none)."""
        if self._process_workers <= 0:
            lane = Lane(self, f"envsdk-run-{next(self._names)}")
            try:
                return await lane.submit(fn, args)  # type: ignore[no-any-return]
            finally:
                lane.stop()
        if self._processes is None:
            self._processes = ProcessPoolExecutor(max_workers=self._process_workers)
        return await self.loop().run_in_executor(self._processes, fn, *args)

    def bind(self) -> contextvars.Token[Executors | None]:
        """Make these the executors `run_in_process` uses in the current context (and in every
        task started from it)."""
        return _CURRENT.set(self)

    def shutdown(self) -> None:
        """Let every idle lane thread exit; never waits for a running call (lanes are
        daemons, so a call that never returns does not hold up the process's exit)."""
        for lane in list(self._lanes):
            lane.retired = True
            lane.stop()
        self._lanes.clear()
        self._threaded.clear()
        self._parking.clear()
        if self._park_timer is not None:
            self._park_timer.cancel()
            self._park_timer = None
        self._shared.clear()
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)
            self._processes = None


class LaneLimit(Exception):
    """No new lane: `abandoned` written-off threads are still running (cap `limit`)."""

    def __init__(self, abandoned: int, limit: int) -> None:
        super().__init__(f"{abandoned} env calls are still running past their deadlines (limit {limit})")
        self.abandoned = abandoned
        self.limit = limit


async def run_in_process(fn: Callable[..., T], *args: Any) -> T:
    """Await ``fn(*args)`` in the serving app's process pool, off the event loop and the GIL.

    For CPU-heavy work inside an ``async def`` environment method (e.g. generating a hard
    Sudoku board). ``fn`` and ``args`` must be picklable (a module-level function). With
    ``ServerConfig.process_workers == 0`` the call runs in a one-off daemon thread instead;
    outside a server (no app bound) it runs in a fresh default executor thread.
    """
    executors = _CURRENT.get()
    if executors is None:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    return await executors.run_in_process(fn, *args)


class LoopStalls:
    """Counts and logs the stretches env coroutines hold the event loop longer than
    `threshold_s` between two awaits (see the module docstring). On the loop only."""

    MAX_METHODS = 64  # distinct labels kept in /metrics; later ones count as "other"
    LOG_EVERY_S = 60.0

    def __init__(self, threshold_s: float | None) -> None:
        self.threshold_s = threshold_s
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._logged: dict[str, tuple[float, int]] = {}  # label -> (when last logged, count then)

    def watch(self, coro: Any, owner: Any, kind: str) -> Any:
        """`coro` (a coroutine of `owner`'s `kind` call), timed stretch by stretch."""
        if self.threshold_s is None or not inspect.iscoroutine(coro):
            return coro
        return _Watched(coro, self, owner, kind)

    def report(self, owner: Any, kind: str, held_s: float) -> None:
        label = f"{getattr(owner, '__name__', type(owner).__name__)}.{kind}"
        if label not in self.counts and len(self.counts) >= self.MAX_METHODS:
            label = "other"
        count = self.counts[label] = self.counts.get(label, 0) + 1
        self.seconds[label] = self.seconds.get(label, 0.0) + held_s
        now = time.monotonic()
        last = self._logged.get(label)
        if last is None:
            logger.warning(
                "%s held the event loop for %.3f s without awaiting: every session waited. An async "
                "def env method must not block; make it a plain def (it then runs on the session's "
                "lane thread, under its deadline) or await the slow part (asyncio.to_thread, "
                "envsdk.server.run_in_process). Counted in /metrics as envsdk_loop_stalls_total.",
                label, held_s,
            )
        elif now - last[0] >= self.LOG_EVERY_S:
            logger.warning(
                "%s held the event loop %d more time(s) since the last report (latest %.3f s)",
                label, count - last[1], held_s,
            )
        else:
            return
        self._logged[label] = (now, count)


class _Watched:
    """Awaitable proxy of a coroutine that reads the clock around each stretch it runs."""

    __slots__ = ("_coro", "_kind", "_owner", "_stalls")

    def __init__(self, coro: Any, stalls: LoopStalls, owner: Any, kind: str) -> None:
        self._coro, self._stalls, self._owner, self._kind = coro, stalls, owner, kind

    def __await__(self) -> Any:
        coro, clock = self._coro, time.perf_counter
        threshold = self._stalls.threshold_s or 0.0
        value: Any = None
        error: BaseException | None = None
        while True:
            started = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                held = clock() - started
                if held > threshold:
                    self._stalls.report(self._owner, self._kind, held)
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation (or any throw) goes to the coroutine
                value, error = None, exc
