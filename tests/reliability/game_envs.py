"""TextArena sessions for the game attack tests, served by ``envsdk serve`` in a child process."""

from __future__ import annotations

from servers.textarena.environment import TextArenaEnvironment


class UnguardedRotation(TextArenaEnvironment):
    """The TextArena session class with its free-for-all rotation left as TextArena ships it
    (a step that eliminates every player never returns), so that the path of a game step that
    never returns is the one tested: stopped after ``step_limit_s`` and answered TIMEOUT, well
    within the step deadline (2 s here)."""

    guard_rotation = False
    step_timeout_s = 2.0
