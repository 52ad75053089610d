"""What the documentation says a user sees of a run, each block run through the installed
``envsdk`` from an empty folder and compared with what it prints: the summary and ``envsdk show``
(docs/rollouts.md), Sudoku's hints switch, ``check-env`` naming every broken rule
(docs/serving.md), and the tiny model built from the shell as the training and evaluation pages
do it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import envsdk, user_env
from tests.docs.blocks import DocBlock, commands, doc_block
from tests.docs.conftest import run_shell

#: The summary's one line that changes from run to run: the steps' wall-clock time and rate.
_STEPS_TIMING = re.compile(r"^(steps\s+\d+ in )\d+\.\d+ s \(\d+\.\d+ steps/s\)$")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _untimed(lines: list[str]) -> list[str]:
    return [_STEPS_TIMING.sub(r"\1T", line) for line in lines]


def _headers(text: str) -> list[str]:
    """The header line of each episode `envsdk show` printed, its example and rollout index."""
    return [line.split(" | ")[0].removeprefix("=== ") for line in text.splitlines() if line.startswith("=== ")]


@pytest.mark.timeout(240)
def test_the_summary_is_what_the_page_shows_then_show_reads_its_records(tmp_path: Path) -> None:
    [run] = commands(doc_block("docs/rollouts.md", "summary-run"))
    ran = envsdk(*shlex.split(run)[1:], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    shown = doc_block("docs/rollouts.md", "summary").text.splitlines()
    # The page's sample has the timing line too; only its figures may differ.
    assert any(_STEPS_TIMING.match(line) for line in shown), shown
    assert _untimed(ran.stdout.splitlines()) == _untimed(shown), ran.stdout

    every, first_3, filtered, sampled = commands(doc_block("docs/rollouts.md", "show"))
    everything = envsdk(*shlex.split(every)[1:], cwd=tmp_path)
    assert everything.returncode == 0, everything.stderr
    assert _headers(everything.stdout) == ["seed-0 #0", "seed-1 #0", "seed-2 #0", "seed-3 #0"]
    three = envsdk(*shlex.split(first_3)[1:], cwd=tmp_path)
    assert three.returncode == 0 and _headers(three.stdout) == ["seed-0 #0", "seed-1 #0", "seed-2 #0"], three
    one = envsdk(*shlex.split(filtered)[1:], cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    head = doc_block("docs/rollouts.md", "show-output").text.splitlines()
    assert one.stdout.splitlines()[: len(head)] == head, one.stdout[:2000]
    assert _headers(one.stdout) == ["seed-2 #0"]
    # Every message once, cut after 60 characters: 1 system, 21 user turns and 21 replies.
    assert one.stdout.count("\n--- ") + one.stdout.startswith("--- ") == 43

    samples = envsdk(*shlex.split(sampled)[1:], cwd=tmp_path)
    assert samples.returncode == 0, samples.stderr[-3000:]
    summary, _, transcripts = samples.stdout.partition("trajectories written to random.jsonl\n")
    assert summary.startswith("policy          random\nepisodes        8\n") and "pass@1 s.e." in summary
    assert _headers(transcripts) == ["seed-0 #0", "seed-1 #0"], transcripts[:2000]
    assert len(_records(tmp_path / "random.jsonl")) == 8


@pytest.mark.timeout(240)
def test_a_show_filter_nothing_matches_is_one_line(tmp_path: Path) -> None:
    [run] = commands(doc_block("docs/rollouts.md", "summary-run"))
    assert envsdk(*shlex.split(run)[1:], "--no-progress", cwd=tmp_path).returncode == 0
    missing = envsdk("show", "completions.jsonl", "--example", "seed-7", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == ["envsdk show: error: no episode in completions.jsonl with example seed-7"]


@pytest.mark.timeout(240)
def test_the_hints_switch_and_a_rows_own_value(tmp_path: Path) -> None:
    done = run_shell(doc_block("docs/rollouts.md", "sudoku-hints").text, tmp_path, timeout=200)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    shown = _records(tmp_path / "all.jsonl")
    assert len(shown) == 4 and {r["infos"]["hints"] for r in shown} == {"all"}
    rejected = 0
    for record in shown:
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        assert "GUARANTEED MOVES (only one option): " in users[0]
        # A rejected move is listed from the next message on, beside the solution's moves.
        for text in users:
            if "was rejected" in text:
                rejected += 1
                assert "MOVES REJECTED (do not repeat): " in text and "GUARANTEED MOVES" in text, text
    assert rejected, "no random move was rejected: the listing went unchecked"
    # The row says "none": it wins over --sudoku-hints all, and the board comes alone.
    [row] = _records(tmp_path / "none.jsonl")
    assert row["seed"] == 3 and row["infos"]["hints"] == "none"
    users = [m["content"] for m in row["messages"] if m["role"] == "user"]
    assert any("was rejected" in text for text in users), users  # the header still names it
    assert not any("MOVES REJECTED" in text or "GUARANTEED" in text or "Other options" in text for text in users)
    assert 'sudoku-hints = "all"' in (tmp_path / "all.run.toml").read_text(encoding="utf-8")


#: An env whose reset draws from the module-level `random`: three rules broken.
BROKEN_ENV = '''
import random
from envsdk import Environment, Action, Observation, State

class Msg(Action):
    message: str

class Said(Observation):
    text: str = ""

class BrokenEnv(Environment):
    def reset(self, seed=None, episode_id=None, **kw):
        self._n = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return Said(text=f"start {random.random()}")
    def step(self, action: Msg) -> Said:
        self._n += 1
        return Said(text=f"you said {action.message}", done=self._n >= 2)
    @property
    def state(self) -> State:
        return self._state
'''


@pytest.mark.timeout(180)
def test_check_env_names_every_broken_rule_as_the_page_shows(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BROKEN_ENV, encoding="utf-8")
    checked = envsdk("check-env", "broken:BrokenEnv", cwd=tmp_path)
    assert checked.returncode == 1, checked
    printed = checked.stderr.strip().splitlines()
    shown = doc_block("docs/serving.md", "check-env-failed").text.strip().splitlines()
    assert len(printed) == len(shown), checked.stderr
    for line, said in zip(printed, shown):
        if said.endswith(" …"):
            assert line.startswith(said[: -len(" …")]), (line, said)
        else:
            assert line == said


def _tiny_model_line(block: DocBlock) -> tuple[str, str]:
    """The block's first line, its command and what its comment says it prints."""
    command, said = block.text.splitlines()[0].split("# prints: ")
    return command.strip(), said.strip()


@pytest.mark.timeout(240)
def test_the_tiny_model_is_built_from_the_shell_as_the_pages_say(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    lines = {
        _tiny_model_line(doc_block("docs/training.md", "train-cpu")),
        _tiny_model_line(doc_block("docs/evaluation.md", "evaluate-tokens")),
    }
    [(command, said)] = lines  # both pages give the same line
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "envsdk.tiny_model"], command
    built = subprocess.run([sys.executable, *words[1:]], check=False, cwd=tmp_path, env=user_env(),
                           capture_output=True, text=True, timeout=200)
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.strip() == said
    assert (tmp_path / "tiny" / "config.json").is_file() and (tmp_path / "tiny" / "tokenizer_config.json").is_file()
    # A DIR that is a file: one line, as docs/training.md says.
    (tmp_path / "taken").write_text("", encoding="utf-8")
    refused = subprocess.run([sys.executable, "-m", "envsdk.tiny_model", "taken"], check=False, cwd=tmp_path,
                             env=user_env(), capture_output=True, text=True, timeout=200)
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert errors == ["python -m envsdk.tiny_model: error: cannot write taken: File exists"], refused.stderr
