"""The README's "Evaluate" section, as a reader runs it: every bash block, in order, in an empty
folder with only the installed ``envsdk`` on the PATH."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ENVSDK, REPO, user_env

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _blocks() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Evaluate\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_every_evaluate_example_runs_from_an_empty_folder(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    blocks = _blocks()
    assert len(blocks) == 5  # groups, resume, run files, re-scoring, tokens
    env = {**user_env(), "PATH": f"{ENVSDK.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for block in blocks:
        done = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
        assert done.returncode == 0, f"{block}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    summary = json.loads((tmp_path / "run" / "completions.eval.json").read_text())
    assert summary["records"] == 16 and summary["examples"] == 8
    assert (tmp_path / "again" / "completions.jsonl").is_file() and (tmp_path / "strict.jsonl").is_file()
    assert "Groups and pass@k" in (tmp_path / "completions_report" / "report.html").read_text()
    assert all("tokens" in json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines())
