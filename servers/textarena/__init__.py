"""Any TextArena game behind an envsdk server, wire-compatible with OpenEnv's TextArena server.

``create_textarena_app(env_id)`` builds the app; ``python -m servers.textarena`` serves it.
`TextArenaEnvironment` is the session class (``servers.sudoku`` specialises it for Sudoku). See
README.md for the settings, reset options, observation forms and opponents.
"""

from servers.textarena.app import create_textarena_app
from servers.textarena.environment import (
    TEXTARENA_ENV_IDS,
    GameRandom,
    TextArenaEnvironment,
    check_env_id,
    convert_messages,
)
from servers.textarena.errors import TextArenaOptionError
from servers.textarena.models import (
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)
from servers.textarena.nltk_data import NltkDataMissing
from servers.textarena.opponents import OPPONENT_GAMES

__all__ = [
    "create_textarena_app",
    "TEXTARENA_ENV_IDS",
    "GameRandom",
    "TextArenaEnvironment",
    "TextArenaOptionError",
    "check_env_id",
    "convert_messages",
    "TextArenaAction",
    "TextArenaMessage",
    "TextArenaObservation",
    "TextArenaState",
    "NltkDataMissing",
    "OPPONENT_GAMES",
]
