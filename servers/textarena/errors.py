"""The TextArena server's own error: a setting or reset option it cannot use."""

from __future__ import annotations

__all__ = ["TextArenaOptionError"]


class TextArenaOptionError(ValueError):
    """A reset option or server setting has a value the TextArena server cannot use."""
