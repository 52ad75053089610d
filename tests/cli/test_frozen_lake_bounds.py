"""A FrozenLake map past the size bound (64) is refused at once, locally and when served: it
was generated on the event loop (a served 3000 froze every session for 18 s) or for minutes."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from envsdk.cli import main
from envsdk.client.client import EnvClient
from envsdk.envs import frozen_lake
from envsdk.envs.frozen_lake import FrozenLakeGame
from envsdk.errors import ServerError
from tests.cli.conftest import ServeFn, assert_one_line_error, envsdk

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("size", ["65", "100000"])
def test_rollout_refuses_a_frozen_lake_above_the_bound_at_once(
    tmp_path: Path, size: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ("rollout", "--env", "frozen_lake", "--episodes", "2", "--env-config", f'{{"size": {size}}}',
               "--out", str(tmp_path / "out.jsonl"))
    # As a user runs it: status 2, one line, nothing written (the timeout only bounds a hang).
    result = envsdk(*command, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result
    assert_one_line_error(result, "envsdk rollout: error:", "size", "<= 64", size)
    assert not (tmp_path / "out.jsonl").exists()

    # "At once" is a fact, not a time: the refusal comes before one cell of the map is drawn
    # (a side of 100000 is 10^10 cells: hours, and more memory than the machine has; a served
    # 3000 took 18 s). The same command in this process, each draw of a map's random counted.
    draws = [0]

    class CountingRandom(random.Random):
        def random(self) -> float:
            draws[0] += 1
            return super().random()

    monkeypatch.setattr(frozen_lake, "random", SimpleNamespace(Random=CountingRandom))
    FrozenLakeGame.generate(size=64, seed=1)  # the counter sees a map being drawn: 64 x 64 cells at least
    assert draws[0] >= 64 * 64
    draws[0] = 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # `main` adds the current folder to it
    assert main(list(command)) == 2
    assert draws[0] == 0, f"{draws[0]} cells of a map of side {size} were drawn before it was refused"
    assert "<= 64" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_served_frozen_lake_refuses_a_size_above_the_bound_as_invalid(tmp_path: Path, serve: ServeFn) -> None:
    url = serve("envsdk.envs.frozen_lake:FrozenLakeEnv", cwd=tmp_path)

    async def play() -> None:
        async with EnvClient(url) as client:
            started = time.monotonic()
            with pytest.raises(ServerError) as refused:
                await client.reset(seed=1, env_config={"size": 1000})
            assert time.monotonic() - started < 5
            assert refused.value.code == "VALIDATION_ERROR", refused.value
            assert "<= 64" in str(refused.value) and "1000" in str(refused.value)
            health = time.monotonic()
            async with httpx.AsyncClient() as http:
                assert (await http.get(url + "/health", timeout=5)).status_code == 200
            assert time.monotonic() - health < 1
            # the session goes on: the largest map is played
            result = await client.reset(seed=1, env_config={"size": 64})
            assert result.observation["text"].count("\n") == 65

    asyncio.run(play())


@pytest.mark.parametrize("size", ["1e999", "4.5", "-1e999", "true", '"4"', '"abc"'])
def test_rollout_refuses_a_frozen_lake_size_that_is_no_integer_at_once(tmp_path: Path, size: str) -> None:
    """1e999 (infinity, as JSON reads it) failed every episode with an OverflowError, and 4.5
    played a map of side 4, true a map of side 1's refusal ("got 1"), and "abc" Python's int()
    message, where the README says size is an integer from 2 to 64."""
    result = envsdk(
        "rollout", "--env", "frozen_lake", "--episodes", "2", "--env-config", f'{{"size": {size}}}',
        "--out", str(tmp_path / "out.jsonl"), cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 2, result
    assert_one_line_error(result, "envsdk rollout: error:", "size", "integer", "from 2 to 64")
    assert "invalid literal" not in result.stderr and "got 1" not in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
