"""docs/rollouts.md's first block, every command in its own empty folder holding what the line
names (the README's env, the plugin of docs/local-env.md, the clone's example data), against real
servers: a Sudoku server and an OpenAI-compatible endpoint where the line names their ports."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import REPO, ServeFn, envsdk, readme_env_source
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import substitute


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_rollout_line_plays_from_its_own_folder(tmp_path: Path, serve: ServeFn, openai_endpoint: Any) -> None:
    lines = commands(doc_block("docs/rollouts.md", "rollouts"))
    sudoku = serve(cwd=tmp_path, module="servers.sudoku")
    model_url, model = openai_endpoint("Qwen/Qwen3-1.7B", "[1 1 1]")
    # What each line needs in its folder, and how many records it writes.
    expected = [
        ({}, 64),
        ({}, 32),
        ({}, 8),
        ({"my_plugin.py": doc_block("docs/local-env.md", "plugin").text}, 8),
        ({"my_env.py": readme_env_source()}, 8),
        ({"examples/data": None}, 128),
        ({"examples/swift": None}, 256),
        ({}, 8),
    ]
    assert len(lines) == len(expected), lines
    for n, (line, (files, count)) in enumerate(zip(lines, expected)):
        folder = tmp_path / f"line{n}"
        folder.mkdir()
        for name, text in files.items():
            if text is None:
                shutil.copytree(REPO / name, folder / name)
            else:
                (folder / name).write_text(text, encoding="utf-8")
        if "--base-url" in line:
            line = substitute(line, {"http://127.0.0.1:8000": sudoku, "http://127.0.0.1:8001": model_url})
        ran = envsdk(*shlex.split(line)[1:], "--no-progress", cwd=folder, timeout=300)
        assert ran.returncode == 0, (line, ran.stderr[-3000:])
        records = _records(folder / "completions.jsonl")
        assert len(records) == count and not [r for r in records if r["status"] == "error"], (line, len(records))
        if "error_allowance" in line:
            assert all(r["env_config"]["reset_kwargs"] == {"error_allowance": 2} for r in records)
    assert model.requests and {r["model"] for r in model.requests} == {"Qwen/Qwen3-1.7B"}
