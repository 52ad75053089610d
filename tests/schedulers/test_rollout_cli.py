"""`envsdk rollout`: the runner, its summary and its command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from envsdk.env import RolloutRequest
from envsdk.registry import envs
from envsdk.rollout import Stat, main, summarize
from envsdk.schedulers import Trajectory

REPO = Path(__file__).resolve().parents[2]


def test_summary_counts_successes_errors_and_quantiles() -> None:
    trajs = []
    for i in range(10):
        t = Trajectory(request=RolloutRequest())
        t.status, t.total_reward, t.turns, t.success = "done", float(i), 2, i >= 5
        components = {"correct": 1.0 if i >= 5 else 0.0}
        if i % 2:
            components["bonus"] = 0.5
        t.rollout_infos = {"reward_parts": components, "step_rewards": [1.0], "flag": True, "cells": 3}
        trajs.append(t)
    trajs[0].status, trajs[0].error_kind = "error", "ServerError"
    summary = summarize(trajs, elapsed_s=2.0)
    assert summary.success_rate == 0.5 and summary.statuses == {"done": 9, "error": 1}
    assert summary.errors == {"ServerError": 1}
    # Nearest rank: quantiles are observed values (a 0/1 component has a 0/1 p90).
    assert summary.total_reward == Stat(4.5, 4.0, 8.0, 10)
    assert summary.components["correct"] == Stat(0.5, 0.0, 1.0, 10)
    # Only the declared components, each over the episodes that have it.
    assert set(summary.components) == {"correct", "bonus"} and summary.components["bonus"].n == 5
    text = summary.render()
    assert "success rate    50.0% (5/10)" in text and "ServerError=1" in text
    assert math.isnan(Stat.of([]).mean)


@pytest.mark.timeout(120)
def test_cli_sudoku_oracle_in_a_fresh_process_prints_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "completions.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "envsdk.rollout", "--env", "sudoku", "--policy", "oracle",
         "--episodes", "8", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "success rate    100.0% (8/8)" in proc.stdout
    for name in ("total_reward", "empty_cell", "valid_move", "repetition", "progress", "correct", "turns"):
        assert name in proc.stdout
    assert "rollout sudoku" in proc.stderr  # the progress bar
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == list(range(8))
    assert all(r["total_reward"] == pytest.approx(4.0) for r in records)


@pytest.mark.timeout(60)
def test_cli_frozen_lake_oracle_prints_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fl.jsonl"
    code = main(["--env", "frozen_lake", "--policy", "oracle", "--episodes", "6", "--seed", "40",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "success rate    100.0% (6/6)" in stdout and "episodes        6" in stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == list(range(40, 46))
    assert all(r["status"] == "done" and r["total_reward"] == 1.0 for r in records)


def test_cli_unknown_env_exits_2_listing_known_envs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--env", "no_such_env", "--policy", "random", "--episodes", "1", "--out", str(tmp_path / "x.jsonl")])
    assert code == 2
    assert "frozen_lake" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_cli_loads_external_plugins_and_custom_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_test_policies.py").write_text(
        "class Hello:\n    async def act(self, messages):\n        return 'hello'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from envsdk.env import Env\n"
        "from envsdk.registry import envs\n"
        "class OneShot(Env):\n"
        "    async def reset(self, config):\n"
        "        return 'go', {}, None\n"
        "    async def step(self, messages):\n"
        "        return 'end', 1.0, True, {'said': messages[-1]['content'], 'success': True}\n"
        "envs['one_shot_cli_test'] = OneShot\n"
    )
    code = main(["--env", "one_shot_cli_test", "--policy", "cli_test_policies:Hello", "--episodes", "3",
                 "--external-plugins", str(plugin), "--out", str(tmp_path / "p.jsonl"), "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "success rate    100.0% (3/3)" in out.out
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["infos"]["step_infos"] for r in records] == [[{"said": "hello", "success": True}]] * 3
    del envs["one_shot_cli_test"]  # registries are process-wide; other tests list the names
