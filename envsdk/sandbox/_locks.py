"""`lock_by`: an exclusive file lock taken across processes, waited for until a deadline."""

from __future__ import annotations

import fcntl
import time

__all__ = ["lock_by"]


def lock_by(fd: int, deadline: float) -> bool:
    """Take an exclusive ``flock`` on `fd`, retrying every 0.1 s while another process holds
    it; False once `deadline` (``time.monotonic()``) has passed without it. The lock goes with
    the descriptor (or the process)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
