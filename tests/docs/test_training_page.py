"""docs/training.md's and docs/rewards.md's training commands, run from a folder laid out as the
clone's root (its ``examples/`` copied there), on CPU with the tiny model as the page says; the
GPU lines, which need vLLM and a GPU (``bench/gpu_check.sh`` runs them on one), are parsed by the
scripts they call."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.cli.conftest import REPO
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import run_shell

pytest.importorskip("trl")


@pytest.fixture
def clone_root(tmp_path: Path) -> Path:
    """A folder holding the clone's ``examples/``: where the page says to run its commands."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def test_the_gpu_lines_are_options_their_scripts_take() -> None:
    for line in commands(doc_block("docs/training.md", "train-gpu")):
        words = shlex.split(line)
        assert words[0] == "python", line
        spec = importlib.util.spec_from_file_location("example", REPO / words[1])
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        args = example.parse_args(words[2:])
        assert (args.model, args.use_vllm, args.vllm_mode) == ("Qwen/Qwen3-0.6B", True, "colocate"), line


@pytest.mark.timeout(120)
def test_a_second_run_into_one_output_dir_is_refused_as_the_page_shows(clone_root: Path) -> None:
    """The recipe's training line once an earlier run left its model and records there: refused
    at once, before any model loads, and the earlier run is left as it was."""
    _, train, *_ = commands(doc_block("docs/training.md", "train-cpu"))
    earlier = clone_root / "runs" / "grpo-sudoku"
    (earlier / "final").mkdir(parents=True)
    (earlier / "completions.jsonl").write_text('{"kept": true}\n', encoding="utf-8")
    refused = run_shell(train, clone_root, timeout=100)
    assert refused.returncode == 2, refused
    assert refused.stderr.strip() == doc_block("docs/training.md", "train-output-dir-refused").text.strip()
    assert (earlier / "final").is_dir() and (earlier / "completions.jsonl").read_text() == '{"kept": true}\n'


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cpu_recipe_then_the_reward_columns(clone_root: Path) -> None:
    cpu = run_shell(doc_block("docs/training.md", "train-cpu").text, clone_root, timeout=800)
    assert cpu.returncode == 0, cpu.stderr[-4000:]
    out = clone_root / "runs" / "grpo-sudoku"
    assert (out / "final" / "config.json").is_file() and (out / "final" / "tokenizer_config.json").is_file()
    steps = {json.loads(line)["global_step"] for line in (out / "completions.jsonl").read_text().splitlines()}
    assert steps == {1, 2, 3}  # the rollout_func run's episodes, each with the step it fed
    assert (clone_root / "runs" / "grpo-sudoku-tools" / "final" / "config.json").is_file()
    # Each step's parts: a signed figure, or n/a where TRL logged none (never a made-up +0.000).
    step_lines = [line for line in cpu.stdout.splitlines() if line.startswith("step ")]
    assert len(step_lines) == 4, cpu.stdout[-3000:]
    for line in step_lines:
        assert all(re.fullmatch(r"[a-z_]+=([+-]\d+\.\d{3}|n/a)", word) for word in line.split()[2:]), line

    # docs/rewards.md: the shaped rubric's parts in a rollout, then as TRL reward columns.
    parts = run_shell(doc_block("docs/rewards.md", "reward-parts").text, clone_root, timeout=800)
    assert parts.returncode == 0, parts.stderr[-4000:]
    records = [json.loads(line) for line in (clone_root / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(set(r["reward_components"]) == {"goal", "progress", "format"} for r in records)
    step_2 = next(line for line in parts.stdout.splitlines() if line.startswith("step 2: "))
    assert [word.split("=")[0] for word in step_2.split()[2:]] == ["env_reward", "goal", "progress", "format"], step_2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learn_cpu_and_its_reports(clone_root: Path) -> None:
    """The page's three lines; the run made small (its learning is tests/integrations/test_learn_cpu.py's)."""
    run, *reports = commands(doc_block("docs/training.md", "learn-cpu"))
    assert run == "HF_HUB_OFFLINE=1 python examples/learn_cpu.py --seed 0 --out runs/learn-cpu"
    small = "--sft-episodes 8 --sft-steps 2 --eval-episodes 4 --train-steps 2 --batch-size 4 --num-generations 2"
    done = run_shell("\n".join([f"{run} {small}", *reports]), clone_root, timeout=800)
    assert done.returncode == 0, done.stderr[-4000:]
    # Its last line is one JSON object (TRL prints dicts of its own before); the reports print after it.
    summary = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"'))
    assert summary["train_steps"] == 2 and set(summary) >= {"env", "eval_seeds", "before", "after", "seconds"}
    out = clone_root / "runs" / "learn-cpu"
    # The reports' own files, beside those learn_cpu.py draws into report/.
    assert (out / "comparison_report" / "compare.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "train" / "completions_report" / "training.png").read_bytes().startswith(b"\x89PNG")
