"""docs/harbor.md's blocks (and the README's Harbor recipe) run as a reader runs them: the set-up
script, the do-nothing agent, a served task folder played by the oracle, the container provider's
Python, the image map, the benchmark's command lines. The oracle's embedded run and `check-env`
are run by tests/cli/test_harbor_cli.py, which takes its command lines from these blocks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envsdk.sandbox.images import full_name, load_image_map
from envsdk.testing import free_port, stop_process
from tests._containers import requires_containers
from tests.cli.conftest import await_health, envsdk, user_env
from tests.docs.blocks import REPO, commands, doc_block
from tests.docs.conftest import substitute

TASKS = REPO / "servers" / "harbor" / "tasks"
NAMES = sorted(p.name for p in TASKS.iterdir() if p.is_dir())


def test_the_readme_recipe_is_the_pages_set_up_and_oracle_lines() -> None:
    readme = commands(doc_block("README.md", "harbor"))
    assert readme[0] == commands(doc_block("docs/harbor.md", "harbor-setup"))[0] == "bash scripts/setup_containers.sh"
    # The tools are served over MCP: the extra that brings it is one the project defines.
    assert readme[1] == "bash scripts/setup.sh mcp"
    assert re.search(r"^mcp = \[", (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.MULTILINE)
    # Pasted as a block, the lines after the set-up find envsdk on PATH.
    assert readme[2] == "source .venv/bin/activate"
    assert readme[3] == commands(doc_block("docs/harbor.md", "harbor-rollout"))[0]
    assert readme[3] == "envsdk rollout --env harbor --tasks servers/harbor/tasks --policy oracle"


@requires_containers
@pytest.mark.timeout(600)
def test_the_set_up_script_run_again_only_checks() -> None:
    line = commands(doc_block("docs/harbor.md", "harbor-setup"))[0]
    ran = subprocess.run(line.split(), cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # Everything is there already (the container tests' set-up made it): nothing is built again.
    kept = [line for line in ran.stdout.splitlines() if line.endswith("kept")]
    assert len(kept) == 2 and "debian-bookworm-slim.tar" in kept[0] and "python-3.11-slim-bookworm.tar" in kept[1], ran.stdout


@requires_containers
@pytest.mark.timeout(600)
def test_the_do_nothing_agent_scores_zero_on_every_task(tmp_path: Path) -> None:
    line = commands(doc_block("docs/harbor.md", "harbor-rollout"))[1]
    # After the oracle's line, from the same folder: it replaces that run's completions.jsonl.
    assert line.endswith("--policy noop --overwrite")
    args = substitute(line, {"servers/harbor/tasks": str(TASKS)}).split()[1:]
    ran = envsdk(*args, "--no-progress", cwd=tmp_path, timeout=540)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "pass@1=0.000" in ran.stdout, ran.stdout
    records = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(r["eval"]["example"] for r in records) == NAMES
    assert all(r["total_reward"] == 0.0 and r["success"] is False for r in records)


@requires_containers
@pytest.mark.timeout(600)
def test_a_served_folder_is_played_by_the_oracle_from_another_folder(tmp_path: Path) -> None:
    server_line, rollout_line, check_line = commands(doc_block("docs/harbor.md", "harbor-serve"))
    assert check_line.startswith("envsdk check-env harbor --tasks servers/harbor/tasks")  # run by test_harbor_cli
    port = free_port()
    served = substitute(server_line, {"servers/harbor/tasks": str(TASKS), "--port 8000": f"--port {port}"})
    assert served.startswith("python -m servers.harbor ")
    server = subprocess.Popen(
        [sys.executable, *served.split()[1:]], cwd=tmp_path, env=user_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = await_health(server, f"http://127.0.0.1:{port}", seconds=540)
        args = substitute(rollout_line, {"http://127.0.0.1:8000": url, "servers/harbor/tasks": str(TASKS)}).split()[1:]
        ran = envsdk(*args, "--no-progress", cwd=tmp_path, timeout=540)
    finally:
        stop_process(server, timeout_s=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "pass@1=1.000" in ran.stdout and f"episodes        {len(NAMES)}" in ran.stdout, ran.stdout


@requires_containers
@pytest.mark.timeout(300)
def test_the_container_providers_python_runs_as_written() -> None:
    block = doc_block("docs/harbor.md", "container-python")
    ran = subprocess.run([sys.executable, "-c", block.text], cwd=REPO, env=user_env(), capture_output=True,
                         text=True, timeout=240, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_image_map_reads_as_the_page_says(tmp_path: Path) -> None:
    # The archive the page names must exist (the map is refused otherwise): one of our own here.
    archive = tmp_path / "python-3.12-slim.tar"
    archive.write_bytes(b"")
    path = tmp_path / "images.toml"
    text = substitute(doc_block("docs/harbor.md", "image-map").text, {"/shared/images/python-3.12-slim.tar": str(archive)})
    path.write_text(text, encoding="utf-8")
    mapped = load_image_map(path)
    assert mapped[full_name("python:3.12-slim")] == str(archive)
    assert mapped[full_name("python:3.11-slim")] == "python:3.11-slim-bookworm"
    assert mapped[full_name("node:20-slim")] == "registry.cluster.local/base/node:20-slim"


def test_the_benchmark_lines_are_the_quick_run_the_smoke_test_plays_and_the_defaults() -> None:
    quick, full = commands(doc_block("docs/harbor.md", "harbor-bench"))
    assert quick == "python -m bench.harbor --quick" and full == "python -m bench.harbor"
    assert '"--quick"' in (REPO / "tests" / "perf" / "test_bench_harbor.py").read_text(encoding="utf-8")
    shown = subprocess.run([sys.executable, "-m", "bench.harbor", "--help"], cwd=REPO, capture_output=True, text=True,
                           timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "(default 1,16,64)" in shown.stdout and "(default 5)" in shown.stdout and "(default 300)" in shown.stdout
