"""What an outsider found walking the README from an empty folder (issue #48's last "Must show"
item), each through the real command from a temporary folder: the format penalty survives a
weighted rescore; a training run's records are grouped as GRPO groups by ``envsdk report`` and
named by ``envsdk show``; the cut-reply summary says what penalty it gave; the evaluation recipe
says which extras it needs; and the smaller findings (run file, run.sh --resume, error lines)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.conftest import (
    ENVSDK,
    REPO,
    Result,
    ServeFn,
    envsdk,
    readme_env_source,
    user_env,
)
from tests.docs.blocks import commands, doc_block
from tests.eval.conftest import records

pytestmark = pytest.mark.timeout(300)

README = (REPO / "README.md").read_text(encoding="utf-8")

#: Sudoku policies: `CutOrOverwrite` cuts the reply of every even-numbered episode it starts (the
#: length limit, as a model rambling past --max-tokens) and, in the others, writes over a filled
#: cell of the board (a whole reply naming a move the game rejects); `AlwaysCut` cuts every reply.
#: Counted in this process: the runs play one episode at a time (--concurrency 1).
POLICIES = """\
import re
from envsdk.policies import Policy, PolicyOutput

ROW = re.compile(r"^R([1-9])\\s+(.*)$")


def filled_cell(messages):
    for line in messages[-1]["content"].splitlines():
        found = ROW.match(line.strip())
        if found:
            for column, cell in enumerate(re.findall(r"[1-9.]", found.group(2)), start=1):
                if cell != ".":
                    return int(found.group(1)), column, int(cell)
    raise ValueError("no filled cell on the board")


class CutOrOverwrite(Policy):
    def __init__(self):
        self.started = 0

    async def act(self, messages):
        if not any(m["role"] == "assistant" for m in messages):
            self.started += 1
        if self.started % 2 == 1:
            return PolicyOutput(text="Let me think about row 1 and", finish_reason="length")
        r, c, n = filled_cell(messages)
        return f"[{r} {c} {n}]"


class AlwaysCut(Policy):
    async def act(self, messages):
        return PolicyOutput(text="I will move to the", finish_reason="length")
"""


def _with_policies(tmp_path: Path) -> Path:
    (tmp_path / "pols.py").write_text(POLICIES, encoding="utf-8")
    return tmp_path


def _readme_rescore_weights() -> str:
    """The ``--weights`` of the README's rescore line (its "Evaluate a model" recipe)."""
    [line] = [c for c in commands(doc_block("README.md", "evaluate")) if c.startswith("envsdk rescore")]
    return line.split("--weights", 1)[1].split()[0]


def _sudoku_with_cut_replies(user: Path) -> Result:
    played = envsdk(
        "rollout", "--env", "sudoku", "--policy", "pols.py:CutOrOverwrite", "--episodes", "4", "--max-turns", "2",
        "--concurrency", "1", "--no-progress", "--out", "c.jsonl", cwd=user,
    )
    assert played.returncode == 0, played.stderr
    return played


# ------------------------------------------------------------------------------ H1


def test_h1_a_weighted_rescore_keeps_the_format_penalty_so_a_cut_reply_never_outranks_a_tried_move(
    tmp_path: Path,
) -> None:
    user = _with_policies(tmp_path)
    _sudoku_with_cut_replies(user)
    played = records(user / "c.jsonl")
    cut = [r for r in played if r["truncated"]]
    tried = [r for r in played if not r["truncated"]]
    assert len(cut) == 2 and len(tried) == 2
    assert all(r["infos"]["format_penalty"] == -1.0 for r in cut)

    weights = _readme_rescore_weights()
    assert weights == "correct=1,valid_move=0.1"
    rescored = envsdk("rescore", "c.jsonl", "--weights", weights, cwd=user)
    assert rescored.returncode == 0, rescored.stderr
    again = {r["uuid"]: r for r in records(user / "c.rescored.jsonl")}
    # The README's rescore keeps the penalty: a cut reply scores correct + 0.1 valid_move - 1.
    assert all(again[r["uuid"]]["total_reward"] == -1.0 for r in cut)
    assert max(again[r["uuid"]]["total_reward"] for r in cut) < min(again[r["uuid"]]["total_reward"] for r in tried)
    said = [line for line in rescored.stdout.splitlines() if "format_penalty" in line]
    assert said and "kept" in said[0] and "2 of 4" in said[0], rescored.stdout

    # Weighed like any part: doubled, or dropped by saying so.
    doubled = envsdk("rescore", "c.jsonl", "--weights", f"{weights},format_penalty=2", "--out", "x2.jsonl", cwd=user)
    assert doubled.returncode == 0, doubled.stderr
    assert {r["uuid"]: r["total_reward"] for r in records(user / "x2.jsonl") if r["truncated"]} == {
        r["uuid"]: -2.0 for r in cut
    }
    assert "weight 2" in next(line for line in doubled.stdout.splitlines() if "format_penalty" in line)
    dropped = envsdk("rescore", "c.jsonl", "--weights", "correct=1,format_penalty=0", "--out", "x0.jsonl", cwd=user)
    assert dropped.returncode == 0, dropped.stderr
    assert all(r["total_reward"] == 0.0 for r in records(user / "x0.jsonl"))

    # A score function is given the whole record: the summary says where the penalty is.
    (user / "score.py").write_text("def correct(record):\n    return record['reward_components']['correct']['value']\n")
    scored = envsdk("rescore", "c.jsonl", "--score", "score.py:correct", "--out", "s.jsonl", cwd=user)
    assert scored.returncode == 0, scored.stderr
    line = next(line for line in scored.stdout.splitlines() if "format_penalty" in line)
    assert "infos" in line and "2 of 4" in line, line


# ------------------------------------------------------------------------------ M2


def test_m2_the_summary_states_the_penalty_a_cut_reply_got_and_the_docs_give_a_local_envs(tmp_path: Path) -> None:
    user = _with_policies(tmp_path)
    lake = envsdk("rollout", "--env", "frozen_lake", "--policy", "pols.py:AlwaysCut", "--episodes", "2",
                  "--no-progress", "--out", "lake.jsonl", cwd=user)
    assert lake.returncode == 0, lake.stderr
    assert all(r["infos"]["format_penalty"] == 0.0 for r in records(user / "lake.jsonl"))
    line = next(line for line in lake.stdout.splitlines() if line.startswith("cut replies"))
    assert "2 of 2" in line and "the format penalty: 0.000)" in line, line

    sudoku = _sudoku_with_cut_replies(user)
    line = next(line for line in sudoku.stdout.splitlines() if line.startswith("cut replies"))
    assert "2 of 4" in line and "the format penalty: -1.000)" in line, line

    rollouts = (REPO / "docs" / "rollouts.md").read_text(encoding="utf-8")
    row = next(line for line in rollouts.splitlines() if line.startswith("| `penalty` (default)"))
    assert "a local `Env` 0.0" in row, row


# ------------------------------------------------------------------------------ H2


@pytest.mark.timeout(900)
def test_h2_training_records_are_grouped_as_grpo_groups_by_report_and_named_by_show(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("matplotlib")

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                              timeout=800, check=False)

    built = python("-m", "envsdk.tiny_model", "tiny")
    assert built.returncode == 0, built.stderr
    # One step of 2 GRPO groups of 2 generations (a batch of 4).
    trained = python(
        str(REPO / "examples" / "train_grpo_sudoku.py"), "--model", "./tiny", "--cpu", "--max-steps", "1",
        "--batch-size", "4", "--num-generations", "2", "--max-turns", "2", "--max-completion-length", "128",
        "--output-dir", "out",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    played = records(tmp_path / "out" / "completions.jsonl")
    assert len(played) == 4
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in played:
        groups.setdefault(record["eval"]["example"], []).append(record)
    assert len(groups) == 2 and all(sorted(r["eval"]["index"] for r in g) == [0, 1] for g in groups.values())
    assert all(len({json.dumps(r["env_config"], sort_keys=True) for r in g}) == 1 for g in groups.values())
    assert {r["env"] for r in played} == {"sudoku"}

    reported = envsdk("report", "out/completions.jsonl", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert "2 examples x 2 rollouts (4 records)" in reported.stderr, reported.stderr
    shown = envsdk("show", "out/completions.jsonl", "-n", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header = shown.stdout.splitlines()[0]
    assert header.startswith(f"=== {min(groups)} #0") and "env sudoku" in header, header


# ------------------------------------------------------------------------------ M3


def _hidden(user: Path, *modules: str) -> dict[str, str]:
    """A user's environment in which `modules` are not installed (an import of each fails as a
    missing package's does)."""
    hide = user / "hidden"
    for module in modules:
        (hide / module).mkdir(parents=True)
        (hide / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n", encoding="utf-8"
        )
    return {**user_env(), "PYTHONPATH": str(hide)}


def test_m3_the_evaluation_recipe_names_the_install_of_the_extras_its_commands_need(tmp_path: Path) -> None:
    block = doc_block("README.md", "evaluate")
    rollout = commands(block)[0]
    env = _hidden(tmp_path, "httpx", "matplotlib")
    failed = subprocess.run([str(ENVSDK), *rollout.split()[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert failed.returncode != 0 and "[openai]" in failed.stderr, failed.stderr
    (tmp_path / "c.jsonl").write_text("", encoding="utf-8")
    report = subprocess.run([str(ENVSDK), "report", "c.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert report.returncode != 0 and "[report]" in report.stderr, report.stderr
    section = README.split("## Evaluate a model", 1)[1].split("\n## ", 1)[0]
    said = re.findall(r"`bash scripts/setup\.sh ([a-z,]+)`", section)
    assert said, "the recipe names no `bash scripts/setup.sh EXTRAS`"
    assert {"openai", "report"} <= set(said[0].split(",")), said
    # setup.sh installs exactly the extras it is given, into the clone's .venv.
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert 'extras="${1:-}"' in setup and '-e ".[$extras]"' in setup


# ------------------------------------------------------------------------------ LOW findings


def test_l1_the_run_file_records_the_default_sudoku_hints_and_a_resume_names_them(tmp_path: Path) -> None:
    ran = envsdk("rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "2", "--max-turns", "1",
                 "--no-progress", "--out", "int/c.jsonl", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert 'sudoku-hints = "rejected"' in (tmp_path / "int" / "c.run.toml").read_text(encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--out", "int/c.jsonl", "--sudoku-hints", "all", cwd=tmp_path)
    assert resumed.returncode == 2
    assert "--sudoku-hints 'all' (the run has 'rejected')" in resumed.stderr, resumed.stderr


def _run_sh_checkout(tmp_path: Path) -> Path:
    """run.sh and pyproject.toml in a clone whose setup.sh does nothing (the real one would
    reinstall the shared virtual environment) and whose ``.venv/bin/envsdk`` is the installed one."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run.sh", root / "scripts" / "run.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "scripts" / "setup.sh").write_text("true\n", encoding="utf-8")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "envsdk").symlink_to(ENVSDK)
    return root


def test_l2_run_sh_resumes_the_main_job(tmp_path: Path) -> None:
    root = _run_sh_checkout(tmp_path)

    def run_sh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "scripts/run.sh", *args], cwd=root, env=user_env(), capture_output=True,
                              text=True, timeout=200, check=False)

    first = run_sh("--episodes", "2", "--no-progress")
    assert first.returncode == 0, first.stderr
    resumed = run_sh("--resume", "--episodes", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "nothing left to play" in resumed.stdout + resumed.stderr
    assert len(records(root / "runs" / "completions.jsonl")) == 2


#: Plays the ledger right in the text form: one deposit or withdrawal of the difference, then a
#: reply with no tool call, which ends the episode.
LEDGER_POLICY = """\
import json, re
from envsdk.policies import Policy


class Bookkeeper(Policy):
    async def act(self, messages):
        if any(m["role"] == "assistant" for m in messages):
            return "The ledger is at its target."
        said = re.search(r"holds (\\d+)\\. Bring it to exactly (\\d+)", messages[-1]["content"])
        start, target = int(said.group(1)), int(said.group(2))
        if start == target:
            return "The ledger is at its target."
        name = "deposit" if target > start else "withdraw"
        call = {"name": name, "arguments": {"amount": abs(target - start)}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
"""


def test_l5_the_ledger_example_states_success_in_its_state(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp")
    from envsdk.testing import running_server
    from examples.ledger_tools import create_ledger_app

    (tmp_path / "book.py").write_text(LEDGER_POLICY, encoding="utf-8")
    with running_server(create_ledger_app(max_concurrent_envs=8)) as url:
        played = envsdk("rollout", "--env", "ledger", "--base-url", url, "--policy", "book.py:Bookkeeper",
                        "--tool-format", "text", "--episodes", "4", "--max-turns", "2", "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    done = records(tmp_path / "completions.jsonl")
    assert [r["total_reward"] for r in done] == [1.0] * 4
    assert [r["success"] for r in done] == [True] * 4
    assert "success rate    100.0% (4/4)" in played.stdout, played.stdout


def test_l6_the_readme_says_which_serve_target_keeps_the_apps_capacity(tmp_path: Path, serve: ServeFn) -> None:
    (tmp_path / "my_env.py").write_text(readme_env_source(), encoding="utf-8")
    section = " ".join(README.split("## Serve your own environment", 1)[1].split("\n## ", 1)[0].split())
    assert "max_concurrent_envs=256" in doc_block("README.md", "my-env").text
    for target, sessions in (("my_env:MyEnv", 64), ("my_env:app", 256)):
        assert f"`serve {target}`" in section, target
        url = serve(target, cwd=tmp_path, env={**user_env(), "MAX_CONCURRENT_ENVS": ""})
        assert httpx.get(url + "/health", timeout=5).json()["max_sessions"] == sessions, target


def test_l7_the_readme_says_what_the_trl_block_needs_on_a_cpu() -> None:
    section = " ".join(README.split("## Train with TRL", 1)[1].split("\n## ", 1)[0].split())
    # What the README block's test adds to run it on a CPU (test_the_trl_block_trains_the_readmes_env).
    assert "add `use_cpu=True, bf16=False` to `GRPOConfig`" in section


def test_l9_a_misspelt_row_key_is_named_without_nesting_the_typo(tmp_path: Path) -> None:
    result = envsdk("rollout", "--env", "sudoku", "--episodes", "1", "--env-config", '{"reset_kwarg": {}}', cwd=tmp_path)
    assert result.returncode == 2
    assert "did you mean 'reset_kwargs'?" in result.stderr, result.stderr
    assert '"reset_kwarg":' not in result.stderr, result.stderr


def test_l10_show_says_a_file_is_not_records_and_names_the_statuses(tmp_path: Path) -> None:
    ran = envsdk("rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "1", "--max-turns", "1",
                 "--no-progress", "--out", "c.jsonl", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    for other in ("c.run.toml", "c.eval.json"):
        shown = envsdk("show", other, cwd=tmp_path)
        assert shown.returncode == 2
        assert "--resume" not in shown.stderr and "not a file of records" in shown.stderr, shown.stderr
    bogus = envsdk("show", "c.jsonl", "--status", "bogus", cwd=tmp_path)
    assert bogus.returncode == 2
    for status in ("done", "max_turns", "length", "error", "cancelled"):
        assert status in bogus.stderr, bogus.stderr


def test_l12_setup_sh_keeps_setuptools_editable_install_notice_out_of_the_users_terminal(tmp_path: Path) -> None:
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    log = tmp_path / "pip.log"
    (root / ".venv" / "bin").mkdir(parents=True)
    python = root / ".venv" / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "PYTHONWARNINGS=${{PYTHONWARNINGS:-}} $*" >> {log}\n', encoding="utf-8")
    python.chmod(0o755)
    done = subprocess.run(["bash", "scripts/setup.sh", "report"], cwd=root, env=user_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [install] = [line for line in log.read_text(encoding="utf-8").splitlines() if "-e .[report]" in line]
    assert "ignore:Editable installation" in install, install


def test_l13_the_readme_does_not_say_one_rollout_per_example_leaves_pass_at_k_out(tmp_path: Path) -> None:
    one = envsdk("rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "2", "--max-turns", "1",
                 "--no-progress", "--out", "c.jsonl", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert "pass@1=" in one.stdout  # one rollout per example, success stated: pass@1 is printed
    section = " ".join(README.split("## Serve your own environment", 1)[1].split("\n## ", 1)[0].split())
    assert "a summary of one rollout per example leaves pass@k out" not in section
