"""NLTK data for TextArena's word games, from local folders only: never a download at run time.

TextArena's word games (Wordle, Hangman, WordLadder, WordSearch, Codenames, SpellingBee's
dictionary, ...) call ``nltk.download("words")`` and friends when their module is imported or
their dictionary is built, and that call contacts NLTK's index server even when the data is
already installed. `forbid_downloads` replaces ``nltk.download`` in this process with a lookup
in NLTK's local search path (``NLTK_DATA`` and NLTK's default folders): installed data is
used as NLTK would use it, and missing data raises `NltkDataMissing`, whose message is one line
naming the missing resources and how to install them. `game_unavailable` turns that into the
reason a server refuses a game at start.

What the games need (textarena 0.7.4): the ``words`` corpus (its ``en`` and ``en-basic`` lists)
and, for Wordle, ``averaged_perceptron_tagger_eng``. No package registry ships these, so the
project installs none; put them in a folder on ``NLTK_DATA`` (``python -m nltk.downloader -d
DIR words averaged_perceptron_tagger_eng`` on a machine with network access, then copy DIR).
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

import nltk

__all__ = ["NltkDataMissing", "forbid_downloads", "game_unavailable", "is_installed"]

# Where NLTK keeps each kind of resource; an id is looked up under each.
_KINDS = ("corpora", "taggers", "tokenizers", "chunkers", "grammars", "misc", "models", "stemmers")
_LOCK = threading.Lock()
_ORIGINAL_DOWNLOAD: Any = None
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOT_FOUND = re.compile(r"Resource '?([\w./-]+)'? not found")


class _Survey(threading.local):
    # While `game_unavailable` builds a game: the missing ids, noted instead of raised, so that
    # one refusal names every resource the game asks for, not only the first.
    missing: list[str] | None = None


_SURVEY = _Survey()


class NltkDataMissing(LookupError):
    """A game asked for NLTK data that is not installed locally (nothing is downloaded)."""


def is_installed(resource: str) -> bool:
    """Whether NLTK finds `resource` (an id such as ``"words"``) in its local search path."""
    for kind in _KINDS:
        try:
            nltk.data.find(f"{kind}/{resource}")
            return True
        except LookupError:
            continue
    return False


def _local_download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
    """``nltk.download`` without the network: True when installed, else `NltkDataMissing`."""
    ids = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or [])
    missing = [str(i) for i in ids if not is_installed(str(i))]
    if missing and _SURVEY.missing is not None:
        _SURVEY.missing.extend(m for m in missing if m not in _SURVEY.missing)
        return False
    if missing:
        raise NltkDataMissing(_missing_message(missing))
    return True


def _missing_message(missing: list[str]) -> str:
    return (
        f"NLTK data not installed: {', '.join(missing)} (this server never downloads at run "
        f"time; install it into a folder on NLTK_DATA, e.g. `python -m nltk.downloader -d DIR "
        f"{' '.join(missing)}` where the network is reachable)"
    )


def forbid_downloads() -> None:
    """Make ``nltk.download`` a local lookup in this process (idempotent)."""
    global _ORIGINAL_DOWNLOAD
    with _LOCK:
        if _ORIGINAL_DOWNLOAD is None:
            _ORIGINAL_DOWNLOAD = nltk.download
            nltk.download = _local_download


def game_unavailable(env_id: str, **env_kwargs: Any) -> str | None:
    """None if ``ta.make(env_id, **env_kwargs)`` succeeds offline, else one line saying why.

    Building the game imports its module and loads its word lists, which is where TextArena
    asks for NLTK data; every resource it asks for and does not find is named.
    """
    import textarena as ta

    from textarena.envs.registration import ENV_REGISTRY

    forbid_downloads()
    missing: list[str] = []
    _SURVEY.missing = missing
    spec = ENV_REGISTRY.get(env_id)
    module = spec.entry_point.partition(":")[0] if spec is not None and isinstance(spec.entry_point, str) else ""
    # Imported afresh, so that its import-time downloads ask again for all they need; the module
    # imported before is put back after, so its classes stay the ones the rest of the process
    # holds (the built-in opponents are registered by game class).
    earlier = sys.modules.pop(module, None)
    try:
        ta.make(env_id, **env_kwargs)
    except LookupError as exc:  # NLTK's own "Resource ... not found" (several lines)
        # A module imported before downloaded nothing this time: NLTK's message names the rest.
        missing.extend(name for name in _NOT_FOUND.findall(_ANSI.sub("", str(exc))) if name not in missing)
        if not missing:
            return f"{env_id} is unavailable: NLTK data missing ({str(exc).strip()[:200]}); install it into a folder on NLTK_DATA"
    finally:
        _SURVEY.missing = None
        if earlier is not None:
            _restore(module, earlier)
    if missing:  # asked for and not installed, whether or not the game then failed
        return f"{env_id} is unavailable: {_missing_message(missing)}"
    return None


def _restore(name: str, module: Any) -> None:
    """Make `module` the one imported as `name` again, in ``sys.modules`` and on its package."""
    sys.modules[name] = module
    package, _, attribute = name.rpartition(".")
    if package in sys.modules:
        setattr(sys.modules[package], attribute, module)
