"""``envsdk show``: episodes printed as the model read them, by example in natural order, whatever
order they finished in; ``rollout --print-samples N`` prints the first N the same way;
``--limit``/``-n`` plays the first N examples of a dataset; the summary gives pass@1 a standard error."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from tests.cli.conftest import ServeFn, assert_one_line_error, envsdk
from tests.eval.conftest import records

pytestmark = pytest.mark.timeout(240)

#: A reasoning model: it thinks (mentioning a wrong answer) before its answer.
THINKER = """\
import re
from envsdk.policies import Policy

class Thinker(Policy):
    async def act(self, messages):
        n = int(re.search(r"question (\\d+)", messages[0]["content"]).group(1))
        answer = "right" if n % 2 == 0 else "wrong"
        return f"<think>is it wrong? maybe right for {n}</think>{answer}"
"""

#: A record as a tool-calling episode leaves it: an assistant turn with two native tool calls,
#: their results as tool turns, and a final answer.
TOOL_RECORD = {
    "schema": "envsdk.completions/1", "uuid": "ledger-1", "env": "ledger", "seed": 1, "env_config": {"name": "ledger"},
    "status": "done", "reason": "submitted", "error_kind": None, "success": True, "turns": 2, "total_reward": 1.0,
    "step_rewards": [0.0, 1.0], "reward_components": {}, "infos": {}, "timings": {},
    "messages": [
        {"role": "system", "content": "You keep a ledger."},
        {"role": "user", "content": "What is the balance of a plus b?"},
        {"role": "assistant", "content": "", "reasoning_content": "I need both balances.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "balance", "arguments": "{\"account\": \"a\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "balance", "arguments": "{\"account\": \"b\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20"},
        {"role": "tool", "tool_call_id": "call_2", "content": "7"},
        {"role": "assistant", "content": "27"},
    ],
}


def _headers(stdout: str) -> list[str]:
    return re.findall(r"^=== (\S+ #\d+) \|", stdout, re.MULTILINE)


def test_show_prints_each_episode_as_the_model_read_it_in_example_order(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    (workdir / "thinker.py").write_text(THINKER, encoding="utf-8")
    played = envsdk("rollout", "--env", "graded", "--base-url", url, "--policy", "thinker:Thinker", "--episodes", "12",
                    "--no-progress", cwd=workdir)
    assert played.returncode == 0, played.stderr
    # Records are written as episodes end: any order. `show` orders them by example, naturally.
    lines = (workdir / "completions.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    random.Random(3).shuffle(lines)
    (workdir / "completions.jsonl").write_text("".join(lines), encoding="utf-8")

    shown = envsdk("show", "completions.jsonl", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert _headers(shown.stdout) == [f"seed-{n} #0" for n in range(12)]
    first = shown.stdout.split("\n\n=== ")[0]
    assert "| env graded | status done | success yes | reward 1.000 | turns 2 ===" in first
    roles = re.findall(r"^--- (.+?) ---$", first, re.MULTILINE)
    assert roles == ["user", *["assistant: reasoning (kept apart from the reply, never read as the action)", "assistant",
                               "user"], "assistant: reasoning (kept apart from the reply, never read as the action)",
                     "assistant"]
    body = first.split("\n")
    assert body[body.index("--- user ---") + 1] == "question 0"
    assert "is it wrong? maybe right for 0" in first and "<think>" not in first

    two = envsdk("show", "completions.jsonl", "-n", "2", "--example", "seed-7", "--example", "seed-10", cwd=workdir)
    assert _headers(two.stdout) == ["seed-7 #0", "seed-10 #0"], two.stdout
    cut = envsdk("show", "completions.jsonl", "--limit", "1", "--max-chars", "4", cwd=workdir)
    assert "\nques… (6 more chars)\n" in cut.stdout


def test_show_marks_tool_calls_and_their_results(tmp_path: Path) -> None:
    (tmp_path / "tools.jsonl").write_text(json.dumps(TOOL_RECORD) + "\n", encoding="utf-8")
    shown = envsdk("show", "tools.jsonl", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == [
        "=== ledger-1 | env ledger | status done | success yes | reward 1.000 | turns 2 ===", "ended: submitted",
    ]
    assert (
        "--- assistant: reasoning (kept apart from the reply, never read as the action) ---\nI need both balances.\n"
        '--- assistant: tool call balance (id call_1) ---\n{"account": "a"}\n'
        '--- assistant: tool call balance (id call_2) ---\n{"account": "b"}\n'
        "--- tool: result of call_1 ---\n20\n--- tool: result of call_2 ---\n7\n--- assistant ---\n27"
    ) in shown.stdout


def test_show_refuses_what_is_not_records_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"schema": "other"}\n', encoding="utf-8")
    bad = envsdk("show", "bad.jsonl", cwd=tmp_path)
    assert_one_line_error(bad, "bad.jsonl:1", "schema")
    assert bad.returncode == 2
    missing = envsdk("show", "nothing.jsonl", cwd=tmp_path)
    assert_one_line_error(missing, "nothing.jsonl", "no such file")
    (tmp_path / "tools.jsonl").write_text(json.dumps(TOOL_RECORD) + "\n", encoding="utf-8")
    none = envsdk("show", "tools.jsonl", "--status", "error", cwd=tmp_path)
    assert_one_line_error(none, "no episode in tools.jsonl with status error")
    assert none.returncode == 1


def test_limit_plays_the_first_rows_of_a_dataset_and_print_samples_shows_them(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    rows = [{"uuid": f"q{n}", "env_config": {"name": "graded", "seed": n, "base_url": url}} for n in range(10)]
    (workdir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    played = envsdk("rollout", "--dataset", "rows.jsonl", "-n", "3", "--policy", "policies.py:Parity",
                    "--print-samples", "2", "--no-progress", cwd=workdir)
    assert played.returncode == 0, played.stderr
    assert sorted(r["uuid"] for r in records(workdir / "completions.jsonl")) == ["q0", "q1", "q2"]
    samples = played.stdout.split("as the model read them", 1)[1]
    assert _headers(samples) == ["q0 #0", "q1 #0"]
    assert "--- user ---\nquestion 1\n--- assistant ---\nwrong" in samples

    limited = envsdk("rollout", "--env", "graded", "--base-url", url, "--limit", "4", "--policy", "policies.py:Parity",
                     "--out", "env.jsonl", "--no-progress", cwd=workdir)
    assert limited.returncode == 0, limited.stderr
    assert len(records(workdir / "env.jsonl")) == 4
    both = envsdk("rollout", "--env", "graded", "--base-url", url, "--limit", "4", "--episodes", "5",
                  "--out", "both.jsonl", "--no-progress", cwd=workdir)
    assert_one_line_error(both, "--limit 4 and --episodes 5")


def test_the_summary_gives_pass_at_1_a_standard_error(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    played = envsdk("rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes", "4",
                    "--rollouts-per-example", "2", "--no-progress", cwd=workdir)
    assert played.returncode == 0, played.stderr
    # Examples' pass@1: 1, 0, 1, 0 (Parity is right on even questions): mean 0.5, sample std sqrt(1/3).
    error = math.sqrt(1 / 3) / math.sqrt(4)
    assert "pass@1=0.500  pass@2=0.500" in played.stdout
    assert f"\npass@1 s.e.     {error:.3f} (standard error over the 4 examples: the sample standard deviation of their " \
        "pass@1 / sqrt(4))\n" in played.stdout
    summary = json.loads((workdir / "completions.eval.json").read_text(encoding="utf-8"))
    assert summary["pass_at_1_stderr"] == pytest.approx(error)
