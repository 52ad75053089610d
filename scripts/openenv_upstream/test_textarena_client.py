"""OpenEnv's own TextArena client (``TextArenaEnv``, ``TextArenaAction``) and TRL's Wordle example
environment class, unchanged, against envsdk's TextArena server.

OpenEnv's TextArena client lives only in OpenEnv's repository (``envs/textarena_env``): no
package registry carries it, and the suite's CI reaches nothing but the registries, so these
tests are not in tests/. They load the client from an OpenEnv source tree (a checkout of
github.com/meta-pytorch/OpenEnv) named by ``OPENENV_SRC``, which they require. From the
repository root::

    OPENENV_SRC=/path/to/OpenEnv .venv/bin/python -m pytest scripts/openenv_upstream/test_textarena_client.py -p no:cacheprovider

The servers, their NLTK data and the Hangman guesses are the suite's own, from
tests/servers/test_textarena_clients.py.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from envsdk.testing import stop_process
from tests.servers.test_textarena_clients import (  # noqa: F401 (nltk_data, hangman_url: fixtures)
    WORDS,
    _hangman_guesses,
    _serve,
    hangman_url,
    nltk_data,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def textarena_env() -> types.ModuleType:
    """OpenEnv's ``textarena_env`` package (client and models), unchanged, from ``OPENENV_SRC``."""
    source = os.environ.get("OPENENV_SRC")
    if not source:
        pytest.fail(
            "OPENENV_SRC is not set: set it to a checkout of github.com/meta-pytorch/OpenEnv "
            "(these tests load OpenEnv's TextArena client from its envs/textarena_env)",
            pytrace=False,
        )
    package = Path(source) / "envs" / "textarena_env"
    if not (package / "client.py").is_file():
        pytest.fail(f"OPENENV_SRC={source} has no envs/textarena_env/client.py: not an OpenEnv checkout", pytrace=False)
    sys.path.insert(0, str(package.parent))
    try:
        module = importlib.import_module("textarena_env")
    finally:
        sys.path.remove(str(package.parent))
    assert Path(module.__file__ or "").resolve().parent == package.resolve(), (
        f"textarena_env was imported from {module.__file__}, not from OPENENV_SRC"
    )
    return module


def test_openenv_textarena_client_plays_hangman_guess_the_number_and_tictactoe(
    textarena_env: types.ModuleType, hangman_url: str  # noqa: F811
) -> None:
    TextArenaEnv, TextArenaAction = textarena_env.TextArenaEnv, textarena_env.TextArenaAction

    with TextArenaEnv(base_url=hangman_url).sync() as hangman:
        result = hangman.reset(seed=9)
        assert result.observation.prompt.startswith("[GAME] You are playing Hangman")
        for guess in _hangman_guesses():
            result = hangman.step(TextArenaAction(message=guess))
            if result.done:
                break
        assert result.done
        state = hangman.state()
        assert state.env_id == "Hangman-v0" and state.raw_state["game_state"]["target_word"] in WORDS

    proc, url = _serve({"TEXTARENA_ENV_ID": "GuessTheNumber-v0", "TEXTARENA_GAME_WORKERS": "1"}, asgi=True)
    try:
        with TextArenaEnv(base_url=url).sync() as numbers:
            result = numbers.reset(seed=21)
            low, high = 1, 20
            while not result.done:
                number = (low + high) // 2
                result = numbers.step(TextArenaAction(message=f"[{number}]"))
                latest = result.observation.messages[0].content.rsplit("[GAME]", 1)[-1]
                low, high = (number + 1, high) if "higher" in latest else (low, number - 1)
            assert result.reward == 1.0
            # OpenEnv's client sends reset kwargs as they are: the per-session options work.
            result = numbers.reset(seed=3, env_id="TicTacToe-v0", num_players=2, opponent="scripted")
            assert result.observation.current_player_id == 0
            for cell in range(9):
                if result.done:
                    break
                result = numbers.step(TextArenaAction(message=f"[{cell}]"))
            assert result.done and result.reward in (-1.0, 0.0, 1.0)
            assert numbers.state().env_id == "TicTacToe-v0"
    finally:
        stop_process(proc)


def test_trl_wordle_example_environment_class_runs_against_the_server(
    textarena_env: types.ModuleType, hangman_url: str  # noqa: F811
) -> None:
    """TRL's ``examples/scripts/openenv/wordle.py`` defines ``WordleEnv`` inside ``main()``;
    its ``reset`` and ``guess`` are reproduced here call for call. Two changes: the server URL
    is this test's (a word game that runs offline, Hangman, as no package installs Wordle's
    tagger), and ``.sync()`` is added to the client, because openenv 0.10.0's client is async."""
    TextArenaEnv, TextArenaAction = textarena_env.TextArenaEnv, textarena_env.TextArenaAction
    env_url = hangman_url

    class WordleEnv:
        def __init__(self) -> None:
            self.client: Any = TextArenaEnv(base_url=env_url).sync()

        def reset(self, **kwargs: Any) -> str | None:
            result = self.client.reset()
            self._last_full_feedback = result.observation.messages[0].content
            self.reward = 0.0
            self.done = False
            return str(self._last_full_feedback)

        def guess(self, guess: str) -> str:
            if self.done:
                raise ValueError("Game over.")
            result = self.client.step(TextArenaAction(message=guess))
            _full_feedback = result.observation.messages[0].content
            feedback = _full_feedback[len(self._last_full_feedback) :]
            self._last_full_feedback = _full_feedback
            if "You attempted an invalid move" in feedback:
                self.reward = 0.0
            else:
                self.reward = result.reward
            self.done = result.done
            return str(feedback)

    env = WordleEnv()
    try:
        first = env.reset()
        assert first is not None and "Hangman" in first
        feedbacks = []
        for guess in _hangman_guesses():
            feedbacks.append(env.guess(guess))
            if env.done:
                break
        assert env.done and -1.0 <= env.reward <= 1.0
        # Each feedback is only the text new since the last guess (the transcript only grows).
        assert all(f.startswith("\n[Player] ") for f in feedbacks), feedbacks[:2]
        with pytest.raises(ValueError, match="Game over"):
            env.guess("[z]")
        assert env.reset() is not None and not env.done
    finally:
        env.client.close()
