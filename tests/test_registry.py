"""Registries and plugin loading: user files outside the package register envs by name."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv
from envsdk.errors import EnvNotFoundError
from envsdk.registry import PluginLoadError, Registry, envs, load_plugins, schedulers

REPO = Path(__file__).resolve().parents[1]

COUNTDOWN_PLUGIN = '''
from envsdk.env import Env
from envsdk.registry import envs


class CountdownEnv(Env):
    """Say a number; done when the reply is "0"."""

    async def reset(self, config):
        self.start = int(config.env_config.get("start", 3))
        return f"count down from {self.start}", {"start": self.start}, "Reply with the next number."

    async def step(self, messages):
        reply = messages[-1]["content"].strip()
        return f"you said {reply}", float(reply == "0"), reply == "0", {}


envs["{name}"] = CountdownEnv
'''



def _write_plugin(tmp_path: Path, env_name: str, file_name: str = "my_plugin.py") -> Path:
    path = tmp_path / file_name
    path.write_text(COUNTDOWN_PLUGIN.replace("{name}", env_name))
    return path


@pytest.mark.timeout(60)
def test_builtins_resolve_without_importing_their_packages() -> None:
    code = (
        "import sys; from envsdk.registry import envs, schedulers;"
        "assert 'envsdk.envs' not in sys.modules and 'envsdk.schedulers' not in sys.modules;"
        "print(envs['frozen_lake'].__qualname__, schedulers['gym'].__qualname__);"
        "import envsdk.schedulers as s; print(schedulers['sudoku'] is s.SudokuScheduler)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45, check=True)
    assert out.stdout.split() == ["FrozenLakeEnv", "GYMScheduler", "True"]


def test_builtin_is_listed_and_resolves_to_the_class() -> None:
    assert "frozen_lake" in envs and "frozen_lake" in list(envs)
    assert envs["frozen_lake"] is FrozenLakeEnv


def test_missing_name_error_lists_the_known_names(clean_envs: None) -> None:
    envs["zeta_env"] = FrozenLakeEnv
    with pytest.raises(EnvNotFoundError) as excinfo:
        envs["no_such_env"]
    message = str(excinfo.value)
    assert "'no_such_env'" in message
    assert "known envs: " + ", ".join(sorted(envs)) in message
    assert "zeta_env" in message and "frozen_lake" in message
    assert isinstance(excinfo.value, KeyError)


def test_empty_registry_says_none_are_known() -> None:
    with pytest.raises(EnvNotFoundError, match="known schedulers: none"):
        Registry("scheduler")["multi_turn"]
    with pytest.raises(EnvNotFoundError, match="known schedulers: coding, gym, openenv, sudoku"):
        schedulers["multi_turn"]


def test_assignment_overrides_a_builtin_and_deleting_forgets_it() -> None:
    registry: Registry[type] = Registry("env", builtins={"lake": "envsdk.envs.frozen_lake:FrozenLakeEnv"})
    registry["lake"] = int
    assert registry["lake"] is int and len(registry) == 1
    del registry["lake"]
    assert "lake" not in registry and len(registry) == 0


def test_plugin_outside_the_package_registers_an_env_that_runs_by_name(tmp_path: Path, clean_envs: None) -> None:
    modules = load_plugins([_write_plugin(tmp_path, "countdown")])
    assert len(modules) == 1
    env = envs["countdown"]({"start": 2})

    async def episode() -> list[tuple[str, float, bool, dict[str, object]]]:
        observation, info, system = await env.reset(RolloutRequest(data_dict={"env_config": {"start": 2}}))
        assert (observation, info, system) == ("count down from 2", {"start": 2}, "Reply with the next number.")
        return [await env.step([{"role": "assistant", "content": n}]) for n in ("1", "0")]

    assert asyncio.run(episode()) == [("you said 1", 0.0, False, {}), ("you said 0", 1.0, True, {})]


def test_plugins_with_the_same_file_name_do_not_replace_each_other(tmp_path: Path, clean_envs: None) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = load_plugins(
        [_write_plugin(tmp_path / "a", "count_a", "plugin.py"), _write_plugin(tmp_path / "b", "count_b", "plugin.py")]
    )
    assert first is not second and first.__name__ != second.__name__
    assert envs["count_a"] is not envs["count_b"]


def test_loading_the_same_plugin_twice_runs_it_once(tmp_path: Path, clean_envs: None) -> None:
    path = _write_plugin(tmp_path, "count_once")
    (first,) = load_plugins(path)
    cls = envs["count_once"]
    (again,) = load_plugins([str(path)])
    assert again is first and envs["count_once"] is cls


def test_missing_plugin_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match="plugin file not found: .*nope.py"):
        load_plugins([tmp_path / "nope.py"])


def test_plugin_that_raises_names_the_file_and_chains_the_cause(tmp_path: Path) -> None:
    path = tmp_path / "broken_plugin.py"
    path.write_text("raise ValueError('bad config in plugin')\n")
    with pytest.raises(PluginLoadError, match="broken_plugin.py raised .*ValueError: bad config") as excinfo:
        load_plugins([path])
    assert isinstance(excinfo.value.__cause__, ValueError)
    # A fixed file loads on the next try: the failed import left nothing behind.
    path.write_text("LOADED = True\n")
    (module,) = load_plugins([path])
    assert module.LOADED is True


def test_example_plugin_registers_its_environments(clean_envs: None) -> None:
    load_plugins([REPO / "examples" / "frozen_lake_plugin.py"])
    slippery = envs["frozen_lake_slippery"]
    big = envs["frozen_lake_8x8"]
    assert issubclass(slippery, FrozenLakeEnv) and issubclass(big, FrozenLakeEnv)

    async def first_observations(seed: int) -> tuple[str, str]:
        a, _, _ = await slippery({"seed": seed}).reset(RolloutRequest())
        b, _, _ = await big({"seed": seed}).reset(RolloutRequest())
        return a, b

    small_map, big_map = asyncio.run(first_observations(4))
    assert len([line for line in big_map.splitlines() if line.count(" ") == 7]) == 8
    assert small_map != big_map
