"""Reading Harbor task folders (no container needed): task.toml's fields and Harbor's defaults,
and a one-line error naming the task and the file for every folder that is not a task."""

from __future__ import annotations

from pathlib import Path

import pytest

from servers.harbor.tasks import (
    HarborTask,
    TaskError,
    TaskFolderError,
    load_tasks,
    read_task,
    scan_tasks,
)

FIXTURES = Path(__file__).parent / "harbor_fixtures"


def _task(folder: Path, toml: str = 'version = "1.0"\n', *, instruction: str = "Do it.\n") -> Path:
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text(instruction)
    return folder


def test_every_field_of_task_toml_is_read(tmp_path: Path) -> None:
    folder = _task(tmp_path / "fix-it", """
version = "1.0"

[metadata]
difficulty = "hard"
tags = ["a", "b"]
written = 2026-01-02

[verifier]
timeout_sec = 90
env = { STRICT = "1" }

[agent]
timeout_sec = 300.5

[environment]
build_timeout_sec = 120.0
cpus = 2
memory_mb = 1024
storage_mb = 512
allow_internet = true
""")
    (folder / "solution").mkdir()
    task = read_task(folder)
    assert task == HarborTask(
        name="fix-it", path=folder, instruction="Do it.\n", agent_timeout_s=300.5, verifier_timeout_s=90.0,
        build_timeout_s=120.0, cpus=2.0, memory_mb=1024, storage_mb=512, network=True, version="1.0",
        metadata={"difficulty": "hard", "tags": ["a", "b"], "written": "2026-01-02"}, verifier_env={"STRICT": "1"},
    )
    assert (task.environment_dir, task.tests_dir, task.solution_dir) == (
        folder / "environment", folder / "tests", folder / "solution"
    )


def test_harbor_defaults_except_the_network(tmp_path: Path) -> None:
    task = read_task(_task(tmp_path / "bare", ""))
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (None, 600.0, 600.0)
    assert (task.cpus, task.memory_mb, task.storage_mb) == (1.0, 2048, 10240)
    assert task.network is False and task.solution_dir is None and task.metadata == {}


@pytest.mark.parametrize(
    ("environment", "memory_mb", "storage_mb"),
    [('memory = "2G"\nstorage = "512M"', 2048, 512), ('memory = "1.5g"\nmemory_mb = 64', 1536, 10240),
     ("memory_mb = 4096.0", 4096, 10240)],
)
def test_harbors_older_size_fields_are_read(tmp_path: Path, environment: str, memory_mb: int, storage_mb: int) -> None:
    task = read_task(_task(tmp_path / "sizes", f"[environment]\n{environment}\n"))
    assert (task.memory_mb, task.storage_mb) == (memory_mb, storage_mb)


@pytest.mark.parametrize(("mode", "network"), [('network_mode = "public"', True), ('network_mode = "no-network"', False)])
def test_network_mode_is_read(tmp_path: Path, mode: str, network: bool) -> None:
    assert read_task(_task(tmp_path / "net", f"[environment]\n{mode}\nallow_internet = true\n")).network is network


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[agent]\ntimeout_sec = -1", "[agent] timeout_sec must be a number > 0, got -1"),
        ('[verifier]\ntimeout_sec = "soon"', "[verifier] timeout_sec must be a number > 0, got 'soon'"),
        ("[verifier]\ntimeout_sec = nan", "[verifier] timeout_sec must be a number > 0, got nan"),
        ("[environment]\ncpus = true", "[environment] cpus must be a number > 0, got True"),
        ("[environment]\nmemory_mb = 1.5", "[environment] memory_mb must be a whole number > 0, got 1.5"),
        ('[environment]\nstorage = "lots"', "[environment] storage must be a size like '2G' or '512M', got 'lots'"),
        ('[environment]\nallow_internet = "yes"', "[environment] allow_internet must be true or false, got 'yes'"),
        ('[environment]\nnetwork_mode = "allowlist"', "network_mode 'allowlist' is not served here"),
        ("[environment]\ngpus = 1", "[environment] gpus = 1: this server has no GPU to give"),
        ("agent = 3", "[agent] must be a table, got 3"),
        ("[verifier]\nenv = { A = 1 }", "[verifier] env must be a table of text values"),
        ('[verifier]\nenv = { "A-B" = "1" }', "[verifier] env: 'A-B' is not a variable name"),
        ("[agent\ntimeout_sec = 1", "not valid TOML"),
    ],
)
def test_a_value_that_cannot_be_used_is_one_line_naming_task_and_file(tmp_path: Path, toml: str, said: str) -> None:
    with pytest.raises(TaskError) as caught:
        read_task(_task(tmp_path / "bad-value", toml))
    message = str(caught.value)
    assert message.startswith("task bad-value: task.toml: ") and said in message
    assert "\n" not in message and (caught.value.task, caught.value.file) == ("bad-value", "task.toml")


@pytest.mark.parametrize("name", ["no-toml", "no-instruction", "no-test"])
def test_a_missing_file_of_a_fixture_is_named(name: str) -> None:
    file = {"no-toml": "task.toml", "no-instruction": "instruction.md", "no-test": "tests/test.sh"}[name]
    with pytest.raises(TaskError, match=f"^task {name}: {file}: missing$"):
        read_task(FIXTURES / name)


def test_an_empty_or_binary_instruction_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="^task blank: instruction.md: empty"):
        read_task(_task(tmp_path / "blank", instruction=" \n"))
    folder = _task(tmp_path / "binary")
    (folder / "instruction.md").write_bytes(b"\xff\xfe")
    with pytest.raises(TaskError, match="^task binary: instruction.md: not UTF-8 text$"):
        read_task(folder)


def test_a_folder_of_tasks_is_scanned_sorted_with_its_broken_folders_apart() -> None:
    tasks, errors = scan_tasks(FIXTURES)
    assert [t.name for t in tasks] == sorted(t.name for t in tasks)
    assert {"minimal", "parts", "sleepy", "bad-build"} <= {t.name for t in tasks}
    assert sorted(str(e) for e in errors) == [
        "task no-instruction: instruction.md: missing",
        "task no-test: tests/test.sh: missing",
        "task no-toml: task.toml: missing",
    ]
    with pytest.raises(TaskError, match="^task no-instruction: instruction.md: missing$"):
        load_tasks(FIXTURES)


def test_one_task_folder_is_served_alone() -> None:
    assert [t.name for t in load_tasks(FIXTURES / "minimal")] == ["minimal"]
    # A task folder that lacks its task.toml is still one task (its other files say so), not a folder of tasks.
    tasks, errors = scan_tasks(FIXTURES / "no-toml")
    assert tasks == [] and [str(e) for e in errors] == ["task no-toml: task.toml: missing"]


def test_a_folder_without_tasks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskFolderError, match="does not exist"):
        scan_tasks(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(TaskFolderError, match="is not a folder"):
        scan_tasks(tmp_path / "file")
    (tmp_path / "empty" / ".hidden").mkdir(parents=True)
    with pytest.raises(TaskFolderError, match="holds no task"):
        scan_tasks(tmp_path / "empty")
