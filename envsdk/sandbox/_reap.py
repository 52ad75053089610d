"""`kill_until_gone`: the one way the host kills a set of processes that may still be forking."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection

__all__ = ["kill_until_gone"]


def kill_until_gone(listed: Callable[[], Collection[int]], rounds: int = 100) -> None:
    """Stop, then kill, every process `listed` names, again until it names none (or `rounds`
    passes): stopped first, they cannot fork while the others are being killed."""
    for _ in range(rounds):
        pids = listed()
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.01)
