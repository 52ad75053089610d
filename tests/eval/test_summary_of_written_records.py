"""The pass@k summary a run prints at its end takes the records this process just wrote from the
writer, not from the file, and only where that cannot change it: the earlier attempts' records
are still read from the file, a file that something else wrote to after the writer is read whole,
and a record that is not valid is reported by the file's reading, line and all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from envsdk.env import RolloutRequest
from envsdk.evaluate import EvalError, finish_run, summary_path
from envsdk.records import RecordsWritten, StepRecord, Trajectory
from envsdk.schedulers.base import TrajectoryWriter

pytestmark = pytest.mark.timeout(60)


def _trajectory(example: str, index: int, reward: float, success: bool | None, attempt: int = 1) -> Trajectory:
    request = RolloutRequest(
        messages=[], data_dict={"env_config": {"name": "graded", "seed": 1}, "eval": {
            "run": "r1", "attempt": attempt, "example": example, "index": index}},
    )
    trajectory = Trajectory(request=request, messages=[{"role": "user", "content": f"{example} ✓ \r\n"}])
    trajectory.steps.append(StepRecord(turn=1, action={"message": "x"}, observation={}, reward=reward, done=True,
                                       components={"right": reward}))
    trajectory.rollout_infos["reward_parts"] = {"right": reward}
    trajectory.total_reward, trajectory.success, trajectory.status, trajectory.turns = reward, success, "done", 1
    return trajectory


def _write(out: Path, trajectories: list[Trajectory], *, append: bool) -> RecordsWritten:
    with TrajectoryWriter(out, append=append) as writer:
        for trajectory in trajectories:
            writer.write(trajectory)
    return writer.written


def _summary(out: Path, written: RecordsWritten | None) -> tuple[str | None, dict[str, object]]:
    summary = finish_run(out, written)
    table = summary.render() if summary is not None else None
    return table, json.loads(summary_path(out).read_text(encoding="utf-8"))


def test_a_resumed_run_sums_up_the_earlier_records_from_the_file_and_its_own_from_the_writer(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    earlier = [_trajectory("seed-0", 0, 1.0, True), _trajectory("seed-1", 0, 0.0, False), _trajectory("seed-2", 1, 0.5, None)]
    now = [_trajectory("seed-0", 1, 0.0, False, 2), _trajectory("seed-1", 1, 1.0, True, 2),
           _trajectory("seed-2", 0, 0.25, True, 2)]
    first = _write(out, earlier, append=False)
    assert (first.start, first.end) == (0, out.stat().st_size)
    written = _write(out, now, append=True)
    assert (written.start, written.end) == (first.end, out.stat().st_size)
    assert written.facts is not None and len(written.facts) == 3

    from_memory = _summary(out, written)
    from_file = _summary(out, None)
    assert from_memory == from_file
    summary = from_memory[1]
    # Every record counted, the earlier attempt's as well: 3 groups of 2, one success in each.
    assert summary["records"] == 6 and summary["examples"] == 3
    assert summary["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert summary["success_not_stated"] == 1


def test_a_file_that_grew_after_the_writer_is_read_whole(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    written = _write(out, [_trajectory("seed-0", 0, 0.0, False)], append=False)
    _write(out, [_trajectory("seed-0", 1, 1.0, True)], append=True)  # another writer, after this one
    _, summary = _summary(out, written)
    assert summary["records"] == 2 and summary["pass_at_k"]["1"] == 0.5


def test_a_record_that_is_not_valid_is_named_by_the_files_reading(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    written = _write(out, [_trajectory("seed-0", 0, 1.0, True), _trajectory("seed-1", 0, math.nan, False)], append=False)
    assert written.facts is None
    with pytest.raises(EvalError, match=r"c\.jsonl:2: no numeric 'total_reward'"):
        finish_run(out, written)


def test_the_summary_file_is_the_summary_one_line_per_example() -> None:
    """``<stem>.eval.json`` is written with the C encoder (an indented dump is encoded in Python):
    it must read back as the summary, keys in order, with one line per example."""
    from envsdk.evaluate import summary_text

    groups = [{"example": f"e{i}", "n": 2, "correct": i % 2, "mean_reward": i / 3, "reward_std": math.nan if i == 0 else 0.25,
               "pass_at_k": {"1": 0.5, "2": 1.0}} for i in range(5)]
    summary = {"records": 10, "examples": 5, "planned": None, "pass_at_k": {"1": 0.5}, "groups": groups}
    text = summary_text(summary)
    read = json.loads(text)
    assert list(read) == list(summary) and read["groups"][1] == groups[1] and read["planned"] is None
    assert math.isnan(read["groups"][0]["reward_std"])
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith('{"example"')) == 5
    assert json.loads(summary_text({**summary, "groups": []}))["groups"] == []
