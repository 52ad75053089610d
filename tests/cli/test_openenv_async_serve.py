"""``envsdk serve`` and ``envsdk check-env`` on an OpenEnv `Environment` that overrides
``reset_async`` / ``step_async``, from a user's folder with no PYTHONPATH: the async variants
answer, as on OpenEnv's own server, and the types come from ``step``'s annotations."""

from __future__ import annotations

from pathlib import Path

import pytest

from envsdk.client import EnvClient
from tests.cli.conftest import ServeFn, envsdk

pytestmark = pytest.mark.timeout(240)

ENVS = Path(__file__).resolve().parents[1] / "server" / "openenv_async_envs.py"


@pytest.fixture
def oe_folder(tmp_path: Path) -> Path:
    (tmp_path / "oe_env.py").write_text(ENVS.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


async def _played(url: str) -> tuple[str, str]:
    async with EnvClient(url) as env:
        reset = await env.reset(seed=4)
        step = await env.step({"message": "hi"})
    return reset.observation["text"], step.observation["text"]


async def test_serve_with_explicit_types_calls_the_async_overrides(serve: ServeFn, oe_folder: Path) -> None:
    url = serve("oe_env:OEnv", "--action", "oe_env:A", "--observation", "oe_env:O", cwd=oe_folder)
    assert await _played(url) == ("ASYNC reset 4", "ASYNC step hi")


async def test_serve_reads_the_types_from_an_openenv_envs_step_annotations(serve: ServeFn, oe_folder: Path) -> None:
    url = serve("oe_env:OEnv", cwd=oe_folder)
    assert await _played(url) == ("ASYNC reset 4", "ASYNC step hi")


def test_check_env_fails_an_env_whose_served_step_async_hangs(oe_folder: Path) -> None:
    result = envsdk("check-env", "oe_env:HangingStepAsyncEnv", "--call-timeout", "2", cwd=oe_folder)
    assert result.returncode == 1, result
    assert "step.returns" in result.stdout + result.stderr, result
    passed = envsdk("check-env", "oe_env:SoundAsyncEnv", cwd=oe_folder)
    assert passed.returncode == 0, passed
