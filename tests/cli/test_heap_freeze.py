"""`envsdk rollout`, run as the program, takes its long-lived heap out of the collector's walks
and raises its young generation's threshold before the episodes start; a caller of
`envsdk.cli.main` keeps its collector as it was."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from envsdk.cli import main
from envsdk.rollout import GEN0_THRESHOLD
from tests.cli.conftest import envsdk

pytestmark = pytest.mark.timeout(240)

PROBE = """\
import gc
from envsdk.policies import Policy

class FreezeProbe(Policy):
    '''Moves down and says how many objects the collector no longer walks, and after how many
    new ones it walks the young generation.'''
    async def act(self, messages):
        return f"<action>down</action> young={gc.get_threshold()[0]} frozen={gc.get_freeze_count()}"
"""


def _replies(path: Path) -> list[str]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    replies = [m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"]
    assert replies, records
    return replies


def _young_thresholds(path: Path) -> set[int]:
    return {int(reply.split("young=", 1)[1].split()[0]) for reply in _replies(path)}


def _frozen_counts(path: Path) -> list[int]:
    return [int(reply.rsplit("frozen=", 1)[1]) for reply in _replies(path)]


def test_the_program_freezes_its_heap_before_the_episodes(folder: Path) -> None:
    (folder / "probe.py").write_text(PROBE, encoding="utf-8")
    rolled = envsdk("rollout", "--env", "frozen_lake", "--policy", "probe:FreezeProbe", "--episodes", "2",
                    "--max-turns", "2", "--no-progress", cwd=folder)
    assert rolled.returncode == 0, rolled.stderr
    # Modules, the policy and the planned run: tens of thousands of objects, walked no more.
    assert min(_frozen_counts(folder / "completions.jsonl")) > 10_000
    assert _young_thresholds(folder / "completions.jsonl") == {GEN0_THRESHOLD}


def test_a_caller_of_main_keeps_its_collector(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "probe.py").write_text(PROBE, encoding="utf-8")
    monkeypatch.chdir(folder)
    before = gc.get_freeze_count()
    threshold = gc.get_threshold()
    assert threshold[0] != GEN0_THRESHOLD
    code = main(["rollout", "--env", "frozen_lake", "--policy", "probe:FreezeProbe", "--episodes", "1",
                 "--max-turns", "1", "--no-progress", "--out", str(folder / "in_process.jsonl")])
    assert code == 0
    assert gc.get_freeze_count() == before and gc.get_threshold() == threshold
    assert _frozen_counts(folder / "in_process.jsonl") == [before]
    assert _young_thresholds(folder / "in_process.jsonl") == {threshold[0]}
