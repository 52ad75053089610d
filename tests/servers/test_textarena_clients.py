"""Outside client code against the TextArena server: openenv 0.10.0's generic client playing a
word game served offline by the launcher, and the launcher started the way ms-swift starts
OpenEnv's server.

OpenEnv's own TextArena client (``envs/textarena_env``) is not tested here: it lives only in
OpenEnv's repository (neither the openenv wheel nor openenv-core ships it, and no package
registry carries it), and CI reaches nothing but the registries. Its tests, OpenEnv's
``TextArenaEnv`` and TRL's Wordle example environment class against this server, are in
scripts/openenv_upstream/test_textarena_client.py and reuse this module's servers and fixtures;
from the repository root, with a checkout of github.com/meta-pytorch/OpenEnv::

    OPENENV_SRC=/path/to/OpenEnv .venv/bin/python -m pytest scripts/openenv_upstream/test_textarena_client.py -p no:cacheprovider
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from envsdk.testing import free_port, stop_process

pytestmark = pytest.mark.timeout(120)

#: A tiny NLTK ``words`` corpus made here: real NLTK reads it, real TextArena Hangman plays it.
WORDS = ["apple", "bread", "chair", "dance", "eagle", "flame", "grape", "house"]


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


def test_uvicorn_serves_the_app_configured_from_the_environment_alone() -> None:
    """``uvicorn servers.textarena.asgi:app`` (the way OpenEnv's TextArena server is started):
    the game and its keyword arguments come from the environment; the wheel's client wins it."""
    from openenv.core.generic_client import GenericEnvClient

    proc, url = _serve(
        {"TEXTARENA_ENV_ID": "GuessTheNumber-v0", "TEXTARENA_KW_max_number": "50", "TEXTARENA_GAME_WORKERS": "1"},
        asgi=True,
    )
    try:
        with GenericEnvClient(base_url=url).sync() as client:
            result = client.reset(seed=21)
            assert "between 1 and 50" in result.observation["prompt"], result.observation["prompt"]
            low, high = 1, 50
            for _ in range(8):  # bisection over 50 numbers needs at most 6 guesses
                number = (low + high) // 2
                result = client.step({"message": f"[{number}]"})
                if result.done:
                    break
                latest = result.observation["messages"][0]["content"].rsplit("[GAME]", 1)[-1]
                low, high = (number + 1, high) if "higher" in latest else (low, number - 1)
            assert result.done and result.reward == 1.0
            assert client.state()["env_id"] == "GuessTheNumber-v0"
    finally:
        stop_process(proc)
