"""A FrozenLake map past the size bound (64) is refused at once, locally and when served: it
was generated on the event loop (a served 3000 froze every session for 18 s) or for minutes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from envsdk.client.client import EnvClient
from envsdk.errors import ServerError
from tests.cli.conftest import ServeFn, assert_one_line_error, envsdk

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("size", ["65", "100000"])
def test_rollout_refuses_a_frozen_lake_above_the_bound_at_once(tmp_path: Path, size: str) -> None:
    started = time.monotonic()
    result = envsdk(
        "rollout", "--env", "frozen_lake", "--episodes", "2", "--env-config", f'{{"size": {size}}}',
        "--out", str(tmp_path / "out.jsonl"), cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 2, result
    assert_one_line_error(result, "envsdk rollout: error:", "size", "<= 64", size)
    assert time.monotonic() - started < 30


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
