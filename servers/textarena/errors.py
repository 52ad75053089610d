"""The game servers' own errors, each carrying the wire code its reply gets.

They are `FrameError`s: raised by game code on a session's lane, the server answers them with
their own code (a bad option is the client's VALIDATION_ERROR, not the server's
EXECUTION_ERROR). Messages echo at most `MAX_ECHOED_CHARS` characters of client input
(`shown`).
"""

from __future__ import annotations

from typing import Any

from envsdk.protocol import MAX_ECHOED_CHARS, ErrorCode, FrameError, shorten_input

__all__ = ["TextArenaOptionError", "GamePoolBusy", "GenerationTimeout", "shown"]


def shown(value: Any) -> str:
    """`value` as an error or log line may echo it: its repr, cut to `MAX_ECHOED_CHARS`
    characters with a count of what was cut (containers are shortened before they are
    rendered, so a huge one costs nothing)."""
    text = repr(shorten_input(value))
    if len(text) > MAX_ECHOED_CHARS + 64:  # a short repr stays whole, quotes and count included
        return f"{text[:MAX_ECHOED_CHARS]}... ({len(text) - MAX_ECHOED_CHARS} more characters)"
    return text


class TextArenaOptionError(FrameError, ValueError):
    """A reset option, move or server setting has a value the game server cannot use
    (VALIDATION_ERROR)."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(ErrorCode.VALIDATION_ERROR, message, **details)


class GamePoolBusy(FrameError):
    """The game pool's queue is full (CAPACITY_REACHED): retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(ErrorCode.CAPACITY_REACHED, message, retry_after_s=retry_after_s)


class GenerationTimeout(FrameError):
    """A game generation ran past the pool's deadline (TIMEOUT); its worker was replaced."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(ErrorCode.TIMEOUT, message, timeout_s=timeout_s)
