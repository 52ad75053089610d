"""What a user of ``envsdk rollout`` gets, run as they run it (the console script in a temporary
folder, no PYTHONPATH): the model reads the env's text, a tool server is played with tool calls
by the default policy, and success is reported only where something states it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, ServeFn, envsdk

pytestmark = pytest.mark.timeout(300)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _success_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("success rate"))


def test_the_model_reads_the_envs_text_and_a_reward_is_not_taken_for_success(folder: Path, serve: ServeFn) -> None:
    url = serve("my_env:MyEnv", cwd=folder)
    result = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "3", "--no-progress", cwd=folder)
    assert result.returncode == 0, result.stderr
    records = _records(folder / "completions.jsonl")
    for record in records:
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        # The observation's text field, as the env wrote it: no {"metadata": ..., "text": ...} dump.
        assert users[0] == f"say something (seed {record['seed']})"
        assert all(not u.startswith("{") and u.startswith("you said ") for u in users[1:])
    # Every reply scores len(reply) > 0, yet nothing states success: n/a, not 100%.
    assert any(r["total_reward"] > 0 for r in records)
    assert all(r["success"] is None for r in records)
    assert _success_line(result.stdout) == "success rate    n/a (neither the env nor the scheduler states success)"
    # The README's way to pick ms-swift's JSON dump instead.
    dumped = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "1", "--formatter", "json", "--overwrite",
                    "--no-progress", cwd=folder)
    assert dumped.returncode == 0, dumped.stderr
    first = _records(folder / "completions.jsonl")[0]["messages"][0]["content"]
    assert json.loads(first)["text"] == "say something (seed 0)"


def test_a_tool_server_is_played_with_tool_calls_and_its_state_reward(folder: Path, serve: ServeFn) -> None:
    url = serve(f"{REPO / 'examples' / 'ledger_tools.py'}:LedgerEnvironment", cwd=folder)
    for scheduler in ([], ["--scheduler", "tools"]):
        result = envsdk(
            "rollout", "--env", "ledger", "--base-url", url, "--episodes", "4", "--max-turns", "3",
            "--no-progress", "--overwrite", *scheduler, cwd=folder,
        )
        assert result.returncode == 0, result.stderr
        records = _records(folder / "completions.jsonl")
        assert len(records) == 4
        for record in records:
            system, first, *rest = record["messages"]
            assert system["role"] == "system" and "<tools>" in system["content"]
            assert first["content"].startswith("The ledger holds ")
            replies = [m["content"] for m in rest if m["role"] == "assistant"]
            # The default policy calls the listed tools; each call is played (not "done" at turn 1).
            assert len(replies) == 3 and all(r.startswith("<tool_call>") for r in replies), replies
            assert record["status"] == "max_turns" and record["turns"] == 3
            assert record["total_reward"] in (0.0, 1.0)
        # The ledger's state states its success beside its reward: the summary counts it.
        assert all(isinstance(record["success"], bool) for record in records), [r["success"] for r in records]
        solved = sum(record["success"] for record in records)
        assert _success_line(result.stdout).startswith(f"success rate    {100 * solved / 4:.1f}% ({solved}/4)")
