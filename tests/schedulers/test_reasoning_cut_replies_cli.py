"""Reasoning and cut replies through the real ``envsdk rollout`` from a temporary folder, with
scripted reasoning-style policies (`tests.schedulers.reasoning_policies`, copied there as a
user's policy file) on the embedded Sudoku and coding servers.

* What a reasoning model thinks is recorded, never played: Sudoku played the first ``[r c n]``
  of the completion, a move the model weighed inside ``<think>`` and rejected.
* A reply cut by the length limit ended the episode with status ``length`` and nothing added:
  it out-ranked a whole reply with no move (−1.0) and an invalid move, so GRPO rewarded
  rambling. The rule is now chosen per run (``--cut-replies env|penalty|mask``), its default
  ranks a cut reply with a reply naming no move, records flag the cut (``truncated``) and the
  summary says the rule and the count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from envsdk.games.humaneval import humaneval
from tests.cli.conftest import Result, assert_one_line_error, envsdk

pytestmark = pytest.mark.timeout(300)

POLICIES = Path(__file__).with_name("reasoning_policies.py")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A user's folder holding ``policies.py`` (the reasoning-style policies)."""
    shutil.copy(POLICIES, tmp_path / "policies.py")
    return tmp_path


def _rollout(folder: Path, env: str, policy: str, *flags: str, out: str = "completions.jsonl") -> Result:
    run = envsdk("rollout", "--env", env, "--policy", f"policies.py:{policy}", "--out", out, "--no-progress",
                 *flags, cwd=folder)
    assert run.returncode == 0, run.stderr
    return run


def _records(folder: Path, out: str = "completions.jsonl") -> list[dict[str, Any]]:
    lines = (folder / out).read_text(encoding="utf-8").splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["seed"])


def _assistant(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in record["messages"] if m["role"] == "assistant"]


# ---------------------------------------------------------------- reasoning


def test_sudoku_plays_the_move_after_the_reasoning_and_records_the_reasoning(folder: Path) -> None:
    """``<think>Could [1 5 4] work? No … So [1 5 9].</think> [1 5 9]`` played ``[1 5 4]``."""
    _rollout(folder, "sudoku", "ThinkingSudoku", "--episodes", "2", "--max-turns", "3", "--record", "full")
    for record in _records(folder):
        replies = _assistant(record)
        assert len(replies) == 3 and len(record["steps"]) == 3
        for reply, step in zip(replies, record["steps"]):
            assert step["action"] == {"message": reply["content"]}  # the move after </think>, alone
            assert "<think>" not in reply["content"] and reply["content"].startswith("[")
            assert reply["reasoning_content"].startswith("Could [") and "work? No" in reply["reasoning_content"]
        assert record["infos"]["moves_tried"] == [r["content"] for r in replies]
        parts = record["reward_components"]
        assert parts["valid_move"]["steps"] == [1.0, 1.0, 1.0] and parts["empty_cell"]["steps"] == [1.0, 1.0, 1.0]
        assert record["truncated"] is False


@pytest.mark.parametrize("policy", ["ThinkingCoder", "ThinkingBareCoder"])
def test_coding_runs_the_code_after_the_reasoning_and_records_the_draft(folder: Path, policy: str) -> None:
    """A wrong draft inside ``<think>`` is never run: the answer after it is (fenced or not)."""
    run = _rollout(folder, "coding", policy, "--episodes", "2", "--record", "full")
    assert "pass@1=1.000" in run.stdout, run.stdout
    problems = {p.task_id: p for p in humaneval()}
    for record in _records(folder):
        problem = problems[record["env_config"]["reset_kwargs"]["task_id"]]
        [reply] = _assistant(record)
        [step] = record["steps"]
        assert record["success"] is True and record["total_reward"] == 1.0
        assert step["action"]["code"].strip() == problem.solution.strip()
        assert "return None" in reply["reasoning_content"] and "return None" not in reply["content"]


# ---------------------------------------------------------------- cut replies


def test_by_default_a_cut_reply_is_not_played_and_ranks_with_a_reply_naming_no_move(folder: Path) -> None:
    cut = _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--record", "full")
    _rollout(folder, "sudoku", "GiveUpSudoku", "--episodes", "1", out="give_up.jsonl")
    [record] = _records(folder)
    [give_up] = _records(folder, "give_up.jsonl")
    assert record["status"] == "length" and record["truncated"] is True and record["turns"] == 2
    assert len(record["steps"]) == 1  # the cut reply never reached the game
    assert "not sent to the environment" in record["reason"] and record["infos"]["cut_replies"] == "penalty"
    assert record["infos"]["format_penalty"] == -1.0
    # Not above a whole reply that names no move (it was 1.0 higher, above an invalid move too).
    assert give_up["truncated"] is False and give_up["infos"]["format_penalty"] == -1.0
    assert record["total_reward"] == pytest.approx(give_up["total_reward"])
    reply = _assistant(record)[-1]
    assert reply["content"] == "" and reply["reasoning_content"].startswith("Row by row.")
    assert "cut replies     1 of 1 (--cut-replies penalty: not sent" in cut.stdout, cut.stdout


def test_cut_replies_env_plays_the_reply_after_the_reasoning_and_ends_the_episode(folder: Path) -> None:
    run = _rollout(folder, "sudoku", "CutAfterMoveSudoku", "--episodes", "1", "--record", "full",
                   "--cut-replies", "env")
    [record] = _records(folder)
    assert record["status"] == "length" and record["truncated"] is True and record["infos"]["cut_replies"] == "env"
    last = _assistant(record)[-1]
    assert record["steps"][-1]["action"] == {"message": last["content"].split(" because")[0]}
    assert len(record["steps"]) == 2 and record["reward_components"]["valid_move"]["steps"] == [1.0, 1.0]
    assert record["infos"]["format_penalty"] == 0.0
    assert "cut replies     1 of 1 (--cut-replies env: sent to the environment" in run.stdout, run.stdout

    # Cut inside its thinking, the reply is empty: the game's reply with no move.
    _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--cut-replies", "env", out="in_thought.jsonl")
    _rollout(folder, "sudoku", "GiveUpSudoku", "--episodes", "1", out="give_up.jsonl")
    [in_thought] = _records(folder, "in_thought.jsonl")
    [give_up] = _records(folder, "give_up.jsonl")
    assert in_thought["truncated"] is True and in_thought["infos"]["unparseable_reply"] is True
    assert in_thought["total_reward"] == pytest.approx(give_up["total_reward"])


def test_cut_replies_mask_ends_the_episode_flagged_with_its_reward_as_it_stood(folder: Path) -> None:
    run = _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--cut-replies", "mask")
    _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--max-turns", "1", out="one_turn.jsonl")
    [record] = _records(folder)
    [one_turn] = _records(folder, "one_turn.jsonl")
    assert record["status"] == "length" and record["truncated"] is True and record["infos"]["cut_replies"] == "mask"
    assert record["infos"]["format_penalty"] == 0.0
    assert record["total_reward"] == pytest.approx(one_turn["total_reward"])  # the first turn's, nothing added
    assert "cut replies     1 of 1 (--cut-replies mask: not sent" in run.stdout, run.stdout


def test_cut_humaneval_code_is_judged_under_env_and_not_run_by_default(folder: Path) -> None:
    default = _rollout(folder, "coding", "CutCoder", "--episodes", "2", "--record", "full")
    judged = _rollout(folder, "coding", "CutCoder", "--episodes", "2", "--record", "full", "--cut-replies", "env",
                      out="judged.jsonl")
    for record in _records(folder):
        assert record["truncated"] is True and record["steps"] == [] and record["success"] is False
        assert record["total_reward"] == 0.0  # what code that fails its tests gets
    assert "pass@1=0.000" in default.stdout, default.stdout
    for record in _records(folder, "judged.jsonl"):
        assert record["truncated"] is True and len(record["steps"]) == 1
        assert record["success"] is True and record["total_reward"] == 1.0
    assert "pass@1=1.000" in judged.stdout, judged.stdout


def test_the_cut_rule_is_written_to_the_run_file_and_a_wrong_one_is_refused(folder: Path) -> None:
    _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--cut-replies", "env")
    assert 'cut-replies = "env"' in (folder / "completions.run.toml").read_text()
    again = envsdk("rollout", "--config", "completions.run.toml", "--out", "again.jsonl", "--no-progress", cwd=folder)
    assert again.returncode == 0, again.stderr
    [record] = _records(folder, "again.jsonl")
    assert record["infos"]["cut_replies"] == "env"

    _rollout(folder, "sudoku", "CutSudoku", "--episodes", "1", "--cut-penalty", "-3", out="harsh.jsonl")
    [harsh] = _records(folder, "harsh.jsonl")
    assert harsh["infos"]["format_penalty"] == -3.0 and harsh["infos"]["cut_replies"] == "penalty"

    wrong = envsdk("rollout", "--env", "sudoku", "--cut-replies", "drop", "--no-progress", cwd=folder)
    assert_one_line_error(wrong, "--cut-replies", "env", "penalty", "mask")
    unused = envsdk("rollout", "--env", "sudoku", "--cut-replies", "mask", "--cut-penalty", "-2", "--no-progress",
                    cwd=folder)
    assert_one_line_error(unused, "--cut-penalty", "--cut-replies penalty")
