"""A command's own process: its standard output once nobody reads it, and SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


def let_stdout_go() -> None:
    """Point standard output at /dev/null after a write to it failed with a closed pipe
    (`envsdk ... | head`), so that the interpreter's own flush at exit neither raises again nor
    prints "Exception ignored"; the command's status is then its own, not a write error's."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def print_out(text: str) -> None:
    """``print(text)`` where a reader of standard output that went away (`envsdk ... | head`)
    costs nothing: the text and all that follows are dropped (`let_stdout_go`), and the command
    goes on to its end and its own status."""
    try:
        print(text)
    except BrokenPipeError:
        let_stdout_go()


def flush_out() -> None:
    """Flush standard output before the command returns its status (at exit a closed pipe can no
    longer be handled); a reader that went away is let go as in `print_out`."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        let_stdout_go()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command stands as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def sigterm_interrupts(own_process: bool) -> Iterator[None]:
    """While the block runs, SIGTERM (`kill`, a job scheduler) raises `Terminated` where the
    command stands, so what is under way is undone as on Ctrl-C (a temporary file removed)
    instead of the process ending in the middle of it. Only where the process is the command's
    own, on its main thread, and unless SIGTERM is ignored; the handler before is put back."""
    if (not own_process or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN):
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
