"""`WorkerPool.shutdown` against its own dispatcher thread.

Shutdown kills the worker processes; the dispatcher, woken by their connections' end of file,
used to "replace" each one, closing its connection while shutdown closed the same connection:
two threads closing one descriptor (EBADF in a server's exit, and worse, a descriptor number
another thread may have reused in between). Once shutdown has taken the workers, they are its
own: the dispatcher must neither close their connections nor start replacements.
"""

from __future__ import annotations

import time

import pytest

from servers.textarena.pool import WorkerPool


def _ready(pool: WorkerPool, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pool._pool and all(w.ready for w in pool._pool):
            return
        time.sleep(0.05)
    raise AssertionError("the pool's worker did not start in time")


@pytest.mark.timeout(90)
def test_a_worker_shutdown_took_is_left_to_shutdown_by_the_dispatcher() -> None:
    pool = WorkerPool(workers=1)
    pool.warm()
    try:
        _ready(pool)
        worker = pool._pool[0]
        # Shutdown's first, locked part: stopped, and the workers are its own now.
        with pool._lock:
            pool._stopped = True
            pool._pool = []
        worker.process.kill()
        worker.process.join(timeout=10)
        # The dispatcher sees the end of file of the killed worker's connection.
        pool._collect(worker)
        assert not worker.conn.closed, "the dispatcher closed a connection shutdown owns"
        assert pool._pool == [], "the dispatcher started a replacement for a pool being shut down"
    finally:
        pool._stopped = False
        pool._pool = [worker] if not worker.conn.closed else []
        pool.shutdown()
    assert worker.conn.closed
