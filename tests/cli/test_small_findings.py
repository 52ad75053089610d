"""Small findings of a user's walk (issue 48, item 12), each as the user met it: the training
example and the tiny model without the ``train`` extra say so in one line; a misspelt TextArena
game id is matched to the game meant; a failing re-scoring function is named once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, assert_one_line_error, envsdk, user_env

pytestmark = pytest.mark.timeout(180)


def _python(*args: str, cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout, check=False)


def _without_torch(code: str) -> str:
    """`code` run where torch is not installed (an import of it fails as a missing module does)."""
    return f"import sys, runpy; sys.modules['torch'] = None; {code}"


def test_the_sudoku_training_example_without_torch_names_the_extra(tmp_path: Path) -> None:
    script = str(REPO / "examples" / "train_grpo_sudoku.py")
    run = _python("-c", _without_torch(
        f"sys.argv = ['train_grpo_sudoku.py', '--model', 'tiny', '--cpu']; runpy.run_path({script!r}, run_name='__main__')"
    ), cwd=tmp_path)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == (
        "train_grpo_sudoku.py: error: torch is not installed (envsdk's [train] extra): run pip install -e '.[train]' "
        "in the envsdk clone, or pip install torch"
    )
    assert not (tmp_path / "runs").exists()


def test_the_tiny_model_is_built_from_the_shell_and_says_what_is_missing(tmp_path: Path) -> None:
    built = _python("-m", "envsdk.tiny_model", "tiny", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert "tiny model written to tiny" in built.stdout
    assert (tmp_path / "tiny" / "config.json").is_file() and (tmp_path / "tiny" / "tokenizer.json").is_file()

    (tmp_path / "taken").write_text("a file", encoding="utf-8")
    taken = _python("-m", "envsdk.tiny_model", "taken", cwd=tmp_path)
    assert taken.returncode == 2 and "Traceback" not in taken.stderr, taken.stderr
    assert taken.stderr.strip().splitlines()[-1] == "python -m envsdk.tiny_model: error: cannot write taken: File exists"

    bare = _python("-c", _without_torch(
        "sys.argv = ['tiny_model', 'other']; runpy.run_module('envsdk.tiny_model', run_name='__main__')"
    ), cwd=tmp_path)
    assert bare.returncode == 1 and "Traceback" not in bare.stderr, bare.stderr
    assert bare.stderr.strip().startswith("python -m envsdk.tiny_model: error: envsdk.tiny_model needs torch")
    assert "[train]" in bare.stderr and len(bare.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "other").exists()


def test_a_misspelt_textarena_game_id_is_matched_to_the_game_meant(tmp_path: Path) -> None:
    run = _python("-m", "servers.textarena", "--env-id", "Wordl-v0", "--port", "0", cwd=tmp_path, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Unknown TextArena env id 'Wordl-v0' (did you mean 'Wordle-v0'?)" in run.stderr


def test_a_failing_score_function_is_named_once(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").write_text(
        json.dumps({"schema": "envsdk.completions/1", "uuid": "u0", "total_reward": 0.0, "success": False,
                    "reward_components": {}}) + "\n", encoding="utf-8",
    )
    (tmp_path / "mine.py").write_text("def score(record):\n    raise ValueError('no answer')\n", encoding="utf-8")
    failed = envsdk("rescore", "c.jsonl", "--score", "mine.py:score", cwd=tmp_path)
    assert_one_line_error(failed, "score() on record u0 raised ValueError: no answer")
    assert "score score" not in failed.stderr
