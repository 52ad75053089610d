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
    if sys.stdout is None:  # started with it closed (``>&-``): nothing is written anyway
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        # A caller's own stream with no descriptor behind it is left as it is: each later
        # write that fails is caught again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def cannot_write(exc: OSError) -> None:
    """Standard output cannot take what is written (its reader went away, a full disk, an I/O
    error): the rest of it is dropped, said once on stderr unless the reader just went away."""
    if not isinstance(exc, BrokenPipeError) and sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            print(f"envsdk: standard output cannot be written ({exc.strerror or exc}); the rest of it is dropped",
                  file=sys.stderr)
    let_stdout_go()


def print_out(text: str) -> None:
    """``print(text)`` where a standard output that cannot be written (a reader that went away,
    `envsdk ... | head`; ``> /dev/full``; closed, ``>&-``) costs nothing: the text and all that
    follows are dropped (`let_stdout_go`), and the command goes on to its end and its own status."""
    if sys.stdout is None:
        return
    try:
        print(text)
    except OSError as exc:
        cannot_write(exc)


def print_err(text: str) -> None:
    """``print(text, file=sys.stderr)`` where a standard error that cannot be written (full,
    ``2>/dev/full``; closed, ``2>&-``) costs nothing: the text is dropped, and the command goes on
    to its end and its own status. Never onto stdout, where ``print(file=None)`` puts it when
    stderr is closed."""
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def flush_out() -> None:
    """Flush standard output before the command returns its status (at exit a failed write can
    no longer be handled); one that cannot be written is let go as in `print_out`."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError as exc:
        cannot_write(exc)


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
