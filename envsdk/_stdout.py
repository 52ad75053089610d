"""What a command does when its standard output is a pipe nobody reads any more."""

from __future__ import annotations

import os
import sys


def let_stdout_go() -> None:
    """Point standard output at /dev/null after a write to it failed with a closed pipe
    (`envsdk ... | head`), so that the interpreter's own flush at exit neither raises again nor
    prints "Exception ignored"; the command's status is then its own, not a write error's."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
