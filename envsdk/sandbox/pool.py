"""`SandboxPool`: sandboxes started ahead of need, so taking one does not pay the start-up."""

from __future__ import annotations

import logging
import threading

from envsdk.sandbox.base import Sandbox, SandboxError, SandboxProvider

__all__ = ["SandboxPool"]

logger = logging.getLogger("envsdk.sandbox")


class SandboxPool:
    """Keeps up to `warm` started sandboxes ready; `take` hands one out (or starts one when
    none is ready) and a background thread starts its replacement. Sandboxes are never given
    back: a used one is closed by its user, so no state leaks from one episode to the next.

    `warm` started sandboxes hold processes (about 20 MB resident each); `close` stops them.
    """

    def __init__(self, provider: SandboxProvider, warm: int = 4) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, got {warm}")
        self.provider = provider
        self.warm = warm
        self._ready: list[Sandbox] = []
        self._cond = threading.Condition()
        self._closed = False
        self._failures = 0
        self.started = 0
        self.taken_warm = 0
        self.taken_cold = 0
        self._thread: threading.Thread | None = None
        self.open()

    def open(self) -> None:
        """Start keeping `warm` sandboxes ready (again, after `close`)."""
        with self._cond:
            self._closed = False
            if self.warm and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._fill, name="envsdk-sandbox-pool", daemon=True)
                self._thread.start()

    @property
    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def take(self) -> Sandbox:
        """A started sandbox, warm if one is ready. Raises `SandboxStartError`."""
        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            while self._ready:
                sandbox = self._ready.pop()
                self._cond.notify_all()
                if sandbox.alive:
                    self.taken_warm += 1
                    return sandbox
                sandbox.close()
            self.taken_cold += 1
        return self.provider.start()

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.warm:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                sandbox = self.provider.start()
            except SandboxError as exc:
                # Back off (up to 30 s) rather than spin when sandboxes cannot start.
                self._failures += 1
                logger.warning("sandbox pool: %s", exc)
                # Waiting on the condition, not sleeping, lets `close` end the back-off at once.
                with self._cond:
                    self._cond.wait_for(lambda: self._closed, timeout=min(30.0, 0.5 * 2 ** min(self._failures, 6)))
                continue
            self._failures = 0
            with self._cond:
                self.started += 1
                if self._closed:
                    sandbox.close()
                    return
                self._ready.append(sandbox)

    def close(self) -> None:
        """Stop the background thread and close every ready sandbox."""
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, []
            self._cond.notify_all()
        for sandbox in ready:
            sandbox.close()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
