"""A run's memory does not grow with its episodes: once an episode's record is written, the
rollout process keeps only how it ended (a Sudoku episode kept whole is 200-300 KB, so a
100,000-episode evaluation held every one of them until it ended)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from envsdk.registry import import_spec
from envsdk.rollout import Batch, RolloutReport, make_requests, run_batches
from tests.cli.conftest import ServeFn, envsdk, user_env
from tests.eval.conftest import records

pytestmark = pytest.mark.timeout(240)

# Parity's answers, and at each episode's first turn the number of trajectories in this process
# that still hold their messages (those in flight, and any finished one that was kept), its
# highest so far written to probe.txt.
PROBE = """\
import gc
from pathlib import Path
from policies import Parity

class Probe(Parity):
    most = 0

    async def act(self, messages):
        if not any(m["role"] == "assistant" for m in messages):
            held = sum(1 for o in gc.get_objects() if type(o).__name__ == "Trajectory" and o.messages)
            Probe.most = max(Probe.most, held)
            Path("probe.txt").write_text(str(Probe.most))
        return await super().act(messages)
"""


def test_the_rollout_process_keeps_only_the_episodes_in_flight(workdir: Path, serve: ServeFn) -> None:
    (workdir / "probe.py").write_text(PROBE, encoding="utf-8")
    url = serve("graded:app", cwd=workdir, env={**user_env(), "GRADED_STEP_S": "0"})
    result = envsdk("rollout", "--env", "graded", "--base-url", url, "--policy", "probe.py:Probe", "--episodes", "30",
                    "--concurrency", "2", "--no-progress", "--out", "c.jsonl", cwd=workdir)
    assert result.returncode == 0, result.stderr
    saved = records(workdir / "c.jsonl")
    assert len(saved) == 30 and all(r["messages"] for r in saved)  # released only once written
    # The probe sees its own episode and at most one other in flight: no finished one is kept.
    assert 1 <= int((workdir / "probe.txt").read_text()) <= 2
    assert "episodes        30" in result.stdout and "statuses        done=30" in result.stdout


# The oracle, counting at every turn the step records in this process that still hold an
# observation; the most seen is written to probe.txt.
STEP_PROBE = """\
import gc
from pathlib import Path
from envsdk.policies import SudokuOraclePolicy
from envsdk.records import StepRecord

class StepProbe(SudokuOraclePolicy):
    most = 0

    async def act(self, messages):
        held = sum(1 for o in gc.get_objects() if type(o) is StepRecord and o.observation is not None)
        StepProbe.most = max(StepProbe.most, held)
        Path("probe.txt").write_text(str(StepProbe.most))
        return await super().act(messages)
"""


def test_an_episode_in_flight_keeps_only_its_last_observation_when_records_are_lean(workdir: Path) -> None:
    """A lean record holds no per-step observation, yet each Sudoku step kept its observation
    (the server's whole reply: text, board, metadata) until the episode's record was written:
    twenty-odd per episode in flight. Now only each episode's last step keeps one."""
    (workdir / "probe.py").write_text(STEP_PROBE, encoding="utf-8")
    result = envsdk("rollout", "--env", "sudoku", "--policy", "probe.py:StepProbe", "--episodes", "2",
                    "--concurrency", "1", "--no-progress", "--out", "c.jsonl", cwd=workdir)
    assert result.returncode == 0, result.stderr
    saved = records(workdir / "c.jsonl")
    assert [r["status"] for r in saved] == ["done", "done"] and all(r["success"] for r in saved)
    assert all(len(r["step_rewards"]) > 10 for r in saved)  # episodes long enough to tell
    assert int((workdir / "probe.txt").read_text()) == 1


def test_a_released_run_reports_what_a_kept_one_does(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir, env={**user_env(), "GRADED_STEP_S": "0"})
    # By its file, as the CLI loads it: the name `policies` is this test suite's own package.
    Parity = import_spec(f"{workdir / 'policies.py'}:Parity")

    def run(release: bool, out: Path) -> RolloutReport:
        batch = Batch("graded", make_requests("graded", 12, 0, url), Parity(), url)
        return asyncio.run(run_batches([batch], concurrency=3, out=out, progress=False, release=release))

    kept = run(False, workdir / "kept.jsonl")
    released = run(True, workdir / "released.jsonl")
    assert all(t.messages and t.steps for t in kept.trajectories)
    assert not any(t.messages or t.steps or t.rollout_infos or t.runtime for t in released.trajectories)
    assert [t.status for t in released.trajectories] == ["done"] * 12
    assert sorted(map(repr, released.facts)) == sorted(map(repr, kept.facts)) and len(kept.facts) == 12
    assert {**vars(released.summary), "elapsed_s": 0} == {**vars(kept.summary), "elapsed_s": 0}
    strip = lambda r: {k: v for k, v in r.items() if k not in ("timings", "uuid")}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, records(workdir / "released.jsonl")))) == sorted(
        map(json.dumps, map(strip, records(workdir / "kept.jsonl")))
    )
