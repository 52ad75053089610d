"""docs/evaluation.md, as a reader runs it: every bash block, in order, in an empty folder with
only the installed ``envsdk`` on the PATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ENVSDK, user_env
from tests.docs.blocks import doc_block

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _blocks() -> list[str]:
    """Groups, resume, run files, re-scoring and tokens: the page's blocks in its order."""
    return [
        doc_block("docs/evaluation.md", "evaluate-groups").text,
        doc_block("docs/evaluation.md", "evaluate-resume").text,
        doc_block("docs/evaluation.md", "evaluate-run-file").text,
        doc_block("docs/evaluation.md", "evaluate-rescore").text,
        doc_block("docs/evaluation.md", "evaluate-tokens").text,
    ]


def test_every_evaluate_example_runs_from_an_empty_folder(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    blocks = _blocks()
    env = {**user_env(), "PATH": f"{ENVSDK.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for block in blocks:
        done = subprocess.run(["bash", "-e", "-c", block], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
        assert done.returncode == 0, f"{block}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    summary = json.loads((tmp_path / "run" / "completions.eval.json").read_text())
    assert summary["records"] == 16 and summary["examples"] == 8
    assert (tmp_path / "again" / "completions.jsonl").is_file() and (tmp_path / "strict.jsonl").is_file()
    assert "Groups and pass@k" in (tmp_path / "completions_report" / "report.html").read_text()
    assert all("tokens" in json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines())
