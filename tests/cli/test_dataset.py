"""``envsdk rollout --dataset`` with ms-swift rows, ``--scheduler NAME``, and envs found through
the ``envsdk.envs`` entry-point group: the real command in a temporary folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from envsdk.env import RolloutRequest
from envsdk.envs.frozen_lake import FrozenLakeEnv
from tests.cli.conftest import ServeFn, envsdk

pytestmark = pytest.mark.timeout(300)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _first_frozen_lake_observation(seed: int) -> str:
    env = FrozenLakeEnv({"seed": seed})
    request = RolloutRequest(messages=[], data_dict={"env_config": {"name": "frozen_lake", "seed": seed}})
    observation, _, _ = asyncio.run(env.reset(request))
    return observation


def test_dataset_of_16_mixed_rows_gives_16_trajectories_with_each_rows_env_and_seed(
    tmp_path: Path, serve: ServeFn
) -> None:
    sudoku_url = serve("--board-workers", "1", "--max-concurrent-envs", "16", cwd=tmp_path, module="servers.sudoku")
    rows = []
    for i in range(16):
        if i % 2 == 0:
            # Rows 0 and 8 share seed 100: the same board, a check that the seed reached the server.
            config = {"name": "sudoku", "base_url": sudoku_url, "seed": 100 + (i % 8)}
        else:
            config = {"name": "frozen_lake", "seed": 200 + i}
        rows.append({
            "messages": [{"role": "system", "content": "You are playing a game."}],
            "env_config": config,
            "uuid": f"row-{i}",
        })
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    result = envsdk("rollout", "--dataset", "rows.jsonl", "--max-turns", "4", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    records = {r["uuid"]: r for r in _records(tmp_path / "completions.jsonl")}
    assert sorted(records) == sorted(f"row-{i}" for i in range(16))
    for row in rows:
        record = records[row["uuid"]]
        assert record["env"] == row["env_config"]["name"]
        assert record["seed"] == row["env_config"]["seed"]
        assert record["env_config"]["seed"] == row["env_config"]["seed"]
        assert record["status"] != "error", record["reason"]
    firsts = {
        uuid: next(m["content"] for m in r["messages"] if m["role"] == "user") for uuid, r in records.items()
    }
    for i in range(1, 16, 2):
        assert firsts[f"row-{i}"] == _first_frozen_lake_observation(200 + i)
    assert firsts["row-0"] == firsts["row-8"]
    assert firsts["row-0"] != firsts["row-2"]


SCHEDULER_PLUGIN = """\
from envsdk.registry import schedulers
from envsdk.schedulers import GYMScheduler

class TaggingScheduler(GYMScheduler):
    async def on_trajectory_end(self, trajectory):
        trajectory.rollout_infos["tagged_by"] = "TaggingScheduler"
        # A class of the user's own may read its earlier steps: the lean run leaves them whole.
        trajectory.rollout_infos["observations"] = sum(s.observation is not None for s in trajectory.steps)
        await super().on_trajectory_end(trajectory)

schedulers["tagging"] = TaggingScheduler
"""


def test_scheduler_flag_picks_a_registered_scheduler_from_a_plugin(tmp_path: Path) -> None:
    (tmp_path / "sched.py").write_text(SCHEDULER_PLUGIN, encoding="utf-8")
    result = envsdk("rollout", "--env", "frozen_lake", "--scheduler", "tagging", "--external-plugins", "sched.py",
                    "--episodes", "3", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = _records(tmp_path / "completions.jsonl")
    assert [r["infos"]["tagged_by"] for r in saved] == ["TaggingScheduler"] * 3
    assert [r["infos"]["observations"] for r in saved] == [len(r["step_rewards"]) for r in saved]
    assert any(len(r["step_rewards"]) > 1 for r in saved)
    unknown = envsdk("rollout", "--env", "frozen_lake", "--scheduler", "nope", "--overwrite", "--no-progress", cwd=tmp_path)
    assert unknown.returncode == 2 and "no scheduler named 'nope'" in unknown.stderr


ENTRY_POINT_PACKAGE = """\
from envsdk.env import Env

class PackagedEnv(Env):
    def __init__(self, env_config):
        self.turn = 0
    async def reset(self, config):
        return "packaged env: say anything", {}, None
    async def step(self, messages):
        if self.turn >= 2:
            raise RuntimeError("the episode is over")
        self.turn += 1
        return "again", 1.0, self.turn >= 2, {}
    async def close(self):
        pass
"""


def test_an_installed_packages_entry_point_makes_its_env_known_without_plugins(tmp_path: Path) -> None:
    # An installed distribution as importlib.metadata finds it on the path: a package and its
    # dist-info with an `envsdk.envs` entry point (what `pip install` of a package declaring
    # `[project.entry-points."envsdk.envs"]` leaves in site-packages).
    (tmp_path / "packaged_env").mkdir()
    (tmp_path / "packaged_env" / "__init__.py").write_text(ENTRY_POINT_PACKAGE, encoding="utf-8")
    info = tmp_path / "packaged_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: packaged-env\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[envsdk.envs]\npackaged = packaged_env:PackagedEnv\n", encoding="utf-8")
    result = envsdk("rollout", "--env", "packaged", "--episodes", "2", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = _records(tmp_path / "completions.jsonl")
    assert [r["turns"] for r in records] == [2, 2]
    assert records[0]["messages"][0]["content"] == "packaged env: say anything"
    checked = envsdk("check-env", "packaged", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
