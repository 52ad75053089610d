"""Outside client code against the TextArena server: OpenEnv's own ``TextArenaEnv`` client and
TRL's Wordle example environment class, and a word game served offline by the launcher.

The openenv 0.10.0 wheel does not ship OpenEnv's TextArena client (``envs/textarena_env`` lives
only in OpenEnv's repository, and no package registry carries it). The tests that use it load
it unchanged from an OpenEnv source tree named by ``OPENENV_SRC`` (a checkout of
meta-pytorch/OpenEnv), or from an installed ``textarena_env`` package, and are skipped when
neither is there.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.testing import free_port, stop_process

pytestmark = pytest.mark.timeout(120)

#: A tiny NLTK ``words`` corpus made here: real NLTK reads it, real TextArena Hangman plays it.
WORDS = ["apple", "bread", "chair", "dance", "eagle", "flame", "grape", "house"]


def _openenv_textarena_env() -> types.ModuleType:
    """OpenEnv's ``textarena_env`` package (client and models), unchanged, or a skip."""
    try:
        return importlib.import_module("textarena_env")
    except ImportError:
        pass
    source = os.environ.get("OPENENV_SRC")
    package = Path(source or "/nonexistent") / "envs" / "textarena_env"
    if not (package / "client.py").is_file():
        pytest.skip(
            "OpenEnv's TextArena client is not in the openenv 0.10.0 wheel; set OPENENV_SRC to a "
            "checkout of meta-pytorch/OpenEnv to run this test"
        )
    sys.path.insert(0, str(package.parent))
    try:
        return importlib.import_module("textarena_env")
    finally:
        sys.path.remove(str(package.parent))


@pytest.fixture(scope="module")
def nltk_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nltk_data")
    corpus = root / "corpora" / "words"
    corpus.mkdir(parents=True)
    for name in ("en", "en-basic"):
        (corpus / name).write_text("\n".join(WORDS) + "\n")
    return root


def _serve(env: dict[str, str], *, asgi: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m servers.textarena`` (or ``uvicorn servers.textarena.asgi:app``, the way
    OpenEnv's server is started) in its own process; returns it and its base URL."""
    port = free_port()
    command = (
        ["-m", "uvicorn", "servers.textarena.asgi:app", "--port", str(port), "--log-level", "warning"]
        if asgi
        else ["-m", "servers.textarena", "--port", str(port), "--game-workers", "1", "--log-level", "warning"]
    )
    return _started([sys.executable, *command], env, port)


def _started(command: list[str], env: dict[str, str], port: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"the server exited with {proc.returncode}: {output}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    stop_process(proc)
    raise AssertionError("the server did not come up within 60 s")


@pytest.fixture(scope="module")
def hangman_url(nltk_data: Path) -> Iterator[str]:
    """Hangman served by the launcher, configured as OpenEnv's server is, with its NLTK data
    installed locally and downloads impossible (the proxy variables point nowhere)."""
    env = {
        "TEXTARENA_ENV_ID": "Hangman-v0",
        "NLTK_DATA": str(nltk_data),
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    proc, url = _serve(env)
    yield url
    stop_process(proc)


def _hangman_guesses() -> list[str]:
    letters = sorted({ch for word in WORDS for ch in word})
    return [f"[{ch}]" for ch in letters]


def test_the_wheel_client_plays_hangman_served_offline_from_local_nltk_data(hangman_url: str) -> None:
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=hangman_url).sync() as client:
        result = client.reset(seed=4)
        assert "Hangman" in result.observation["prompt"]
        for guess in _hangman_guesses():
            result = client.step({"message": guess})
            if result.done:
                break
        assert result.done
        target = client.state()["raw_state"]["game_state"]["target_word"]
    assert target in WORDS


def test_openenv_textarena_client_plays_hangman_guess_the_number_and_tictactoe(
    hangman_url: str, tmp_path: Path
) -> None:
    textarena_env = _openenv_textarena_env()
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
                guess = (low + high) // 2
                result = numbers.step(TextArenaAction(message=f"[{guess}]"))
                latest = result.observation.messages[0].content.rsplit("[GAME]", 1)[-1]
                low, high = (guess + 1, high) if "higher" in latest else (low, guess - 1)
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


def test_trl_wordle_example_environment_class_runs_against_the_server(hangman_url: str) -> None:
    """TRL's ``examples/scripts/openenv/wordle.py`` defines ``WordleEnv`` inside ``main()``;
    its ``reset`` and ``guess`` are reproduced here call for call. Two changes: the server URL
    is this test's (a word game that runs offline, Hangman, as no package installs Wordle's
    tagger), and ``.sync()`` is added to the client, because openenv 0.10.0's client is async."""
    textarena_env = _openenv_textarena_env()
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


def test_the_launcher_starts_as_ms_swifts_start_sudoku_server_is() -> None:
    """ms-swift starts OpenEnv's server with ``TEXTARENA_ENV_ID=Sudoku-v0 MAX_CONCURRENT_ENVS=8
    python start_sudoku_server.py`` (HOST, PORT from the environment): the same here."""
    from openenv.core.generic_client import GenericEnvClient

    port = free_port()
    script = Path(__file__).parents[2] / "servers" / "textarena" / "start_textarena_server.py"
    env = {"TEXTARENA_ENV_ID": "Sudoku-v0", "MAX_CONCURRENT_ENVS": "8", "PORT": str(port),
           "TEXTARENA_GAME_WORKERS": "1"}
    proc, url = _started([sys.executable, str(script)], env, port)
    try:
        with GenericEnvClient(base_url=url).sync() as client:
            result = client.reset(seed=1)
            assert "Sudoku" in result.observation["prompt"] and not result.done
        assert httpx.get(f"{url}/health", timeout=5).json()["max_sessions"] == 8
    finally:
        stop_process(proc)
