"""The training examples as a user runs them from an empty folder (issue 25, findings 3 and 16):
they leave a saved model and ``completions.jsonl``, the environment_factory CPU recipe runs on
the tiny local model, and learn_cpu checks its dependencies before the first step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, envsdk, user_env

pytest.importorskip("trl")


def _python(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """The README's tiny model, built in the user's folder as the README says."""
    built = _python("-c", "from envsdk.tiny_model import build_tiny_model; build_tiny_model('tiny')", cwd=tmp_path, timeout=120)
    assert built.returncode == 0, built.stderr
    return tmp_path


@pytest.mark.timeout(600)
def test_3_a_grpo_example_saves_the_model_and_writes_completions_for_report(tiny: Path) -> None:
    run = _python(
        str(REPO / "examples" / "train_grpo_frozen_lake.py"), "--model", "./tiny", "--cpu", "--max-steps", "2",
        "--batch-size", "2", "--num-generations", "2", "--output-dir", "out", cwd=tiny, timeout=560,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tiny / "out" / "final" / "config.json").is_file() and (tiny / "out" / "final" / "tokenizer_config.json").is_file()
    records = [json.loads(line) for line in (tiny / "out" / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4 and sorted({r["global_step"] for r in records}) == [1, 2]
    assert all(r["schema"] == "envsdk.completions/1" for r in records)
    # The saved model loads where a model is asked for.
    again = envsdk("rollout", "--env", "frozen_lake", "--policy", "transformers", "--model", "out/final",
                   "--episodes", "1", "--max-turns", "1", "--no-progress", cwd=tiny)
    assert again.returncode == 0, again.stderr
    reported = envsdk("report", "out/completions.jsonl", cwd=tiny)
    assert reported.returncode == 0, reported.stderr
    assert (tiny / "out" / "completions_report" / "training.png").is_file()


@pytest.mark.timeout(600)
def test_16_the_environment_factory_cpu_recipe_runs_on_the_tiny_model(tiny: Path) -> None:
    run = _python(
        str(REPO / "examples" / "train_grpo_sudoku.py"), "--model", "./tiny", "--cpu", "--max-steps", "1",
        "--adapter", "environment_factory", "--batch-size", "2", "--num-generations", "2", "--max-turns", "2",
        "--max-completion-length", "256", "--output-dir", "out", cwd=tiny, timeout=560,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "does not support tool calling" not in run.stderr
    assert (tiny / "out" / "final" / "config.json").is_file()


def test_16_the_tiny_template_renders_tool_calls_and_plain_chat_as_before() -> None:
    from trl.chat_template_utils import supports_tool_calling

    from envsdk.tiny_model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    assert supports_tool_calling(tokenizer)
    chat = [{"role": "system", "content": "Play."}, {"role": "user", "content": "a map"}, {"role": "assistant", "content": "up"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\na map<|im_end|>\n"
        "<|im_start|>assistant\nup<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.timeout(300)
def test_16_learn_cpu_checks_its_dependencies_before_the_first_step(tmp_path: Path) -> None:
    # matplotlib absent, as after `bash scripts/setup.sh train` alone.
    code = (
        "import sys, runpy; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['learn_cpu.py', '--out', 'runs']; runpy.run_path({str(REPO / 'examples' / 'learn_cpu.py')!r}, run_name='__main__')"
    )
    started = time.monotonic()
    run = _python("-c", code, cwd=tmp_path, timeout=280)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "[1/6]" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "matplotlib" in run.stderr and "setup.sh train,report" in run.stderr
    assert time.monotonic() - started < 120
    page = (REPO / "docs" / "training.md").read_text(encoding="utf-8").split("## See it learn", 1)[1].split("\n## ", 1)[0]
    assert "setup.sh train,report" in page
