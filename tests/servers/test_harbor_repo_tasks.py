"""The Harbor tasks shipped in servers/harbor/tasks: every folder is a complete task in Harbor's
format on one of the two offline base images, and, in real podman containers, each task's
oracle (solution/solve.sh, under the task's agent time limit) scores 1.0 while an agent that
does nothing scores 0.0, through the server's own verifier (`verify`: the agent's processes
stopped, /logs/verifier made fresh, tests/ copied in only then, test.sh run, reward read)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from envsdk.sandbox.container import ContainerProvider
from servers.harbor.environment import HarborLimits, HarborTasks, Verdict, verify
from servers.harbor.tasks import HarborTask, load_tasks
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

TASKS = Path(__file__).resolve().parents[2] / "servers" / "harbor" / "tasks"
NAMES = sorted(p.name for p in TASKS.iterdir() if p.is_dir() and not p.name.startswith("."))
BASES = ("debian:bookworm-slim", "python:3.11-slim-bookworm")
# Anything that would need a registry or a package index, which the tasks must never reach.
NETWORK_USE = re.compile(r"\b(apt-get|apt|pip3?|curl|wget|uv)\s+(install|update|add|http)|https?://", re.IGNORECASE)
LIMITS = HarborLimits()


def _base(task: HarborTask) -> str:
    lines = [line.strip() for line in (task.environment_dir / "Dockerfile").read_text().splitlines()]
    return next(line.split()[1] for line in lines if line.upper().startswith("FROM "))


def _writes(task: HarborTask) -> set[str]:
    """The reward files the task's tests write (test.sh or its Python helpers name them)."""
    text = "".join(p.read_text() for p in task.tests_dir.iterdir() if p.suffix in (".sh", ".py"))
    return {name for name in ("reward.txt", "reward.json") if name in text}


def test_every_shipped_task_is_complete_and_offline() -> None:
    tasks = load_tasks(TASKS)
    assert [t.name for t in tasks] == NAMES and len(tasks) >= 10
    for task in tasks:
        config = tomllib.loads((task.path / "task.toml").read_text())
        assert task.version == "1.0", task.name
        assert {"difficulty", "category", "tags", "author_name"} <= task.metadata.keys(), task.name
        assert task.agent_timeout_s is not None and "timeout_sec" in config["verifier"], task.name
        assert {"build_timeout_sec", "cpus", "memory_mb", "storage_mb"} <= config["environment"].keys(), task.name
        assert not task.network, task.name
        assert task.solution_dir is not None and (task.solution_dir / "solve.sh").is_file(), task.name
        assert _base(task) in BASES, task.name
        assert _writes(task), f"{task.name}: its tests name no reward file"
        for script in [task.environment_dir / "Dockerfile", *task.tests_dir.iterdir(), *task.solution_dir.iterdir()]:
            if script.suffix in ("", ".sh", ".py") and script.is_file():
                assert not NETWORK_USE.search(script.read_text()), f"{script} reaches for the network"
    bases = [_base(t) for t in tasks]
    assert all(bases.count(base) >= 4 for base in BASES), bases
    assert sum("reward.json" in _writes(t) for t in tasks) >= 2
    # One task is about its agent time limit: far below the minutes the shipped script needs.
    assert min(t.agent_timeout_s or 0 for t in tasks) <= 30


@pytest.fixture(scope="module")
def shipped(container_provider: ContainerProvider) -> HarborTasks:  # noqa: F811
    """Every shipped task with its image built (cached by content across runs)."""
    tasks = HarborTasks(TASKS, container_provider, LIMITS)
    assert tasks.build() == []
    return tasks


def _play(shipped: HarborTasks, name: str, *, oracle: bool) -> Verdict:
    """Start a fresh container of task `name`, run its oracle when asked (under the task's agent
    time limit), then its verifier; the container is removed whatever happens."""
    task = shipped.task(name)
    sandbox = shipped.provider.start(shipped.images[name], limits=LIMITS.container_limits(task))
    try:
        if oracle:
            assert task.solution_dir is not None
            sandbox.copy_in(task.solution_dir, "/solution")
            solved = sandbox.bash("bash /solution/solve.sh", timeout=LIMITS.agent_timeout_s(task))
            assert solved.returncode == 0 and not solved.timed_out, solved.stderr.decode(errors="replace")[-2000:]
        verdict = verify(sandbox, task, timeout_s=LIMITS.verifier_timeout_s(task))
    finally:
        sandbox.close()
    assert not verdict.timed_out
    return verdict


@requires_containers
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NAMES)
def test_the_oracle_scores_one_and_doing_nothing_scores_zero(shipped: HarborTasks, name: str) -> None:
    nothing = _play(shipped, name, oracle=False)
    assert (nothing.reward, set(nothing.parts.values()) - {0.0}) == (0.0, set())
    solved = _play(shipped, name, oracle=True)
    assert (solved.reward, set(solved.parts.values()) - {1.0}) == (1.0, set())
    named = "reward.json" in _writes(shipped.task(name))
    assert bool(solved.parts) is named and set(solved.parts) == set(nothing.parts)
