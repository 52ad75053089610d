"""Harbor task folders: reading one (`read_task`) or a folder of them (`load_tasks`, `scan_tasks`).

A task is a folder, as Harbor (Terminal-Bench's framework) lays it out:

* ``instruction.md``: what the agent is asked;
* ``task.toml``: ``version``, ``[metadata]`` (free-form), ``[agent] timeout_sec``,
  ``[verifier] timeout_sec, env``, ``[environment] build_timeout_sec, cpus, memory_mb,
  storage_mb, allow_internet`` (and Harbor's older ``memory``/``storage`` sizes, ``"2G"``);
* ``environment/Dockerfile`` and the files it copies: the agent's machine;
* ``tests/test.sh`` and its files: copied into the machine only once the agent is done;
* ``solution/solve.sh`` (optional): the oracle.

Defaults are Harbor's (verifier and build 600 s, one CPU, 2048 MB of memory, 10240 MB of
storage, no agent time limit) but one: a task has no network unless its ``task.toml`` asks
for it (``allow_internet = true`` or ``network_mode = "public"``), where Harbor's default is
the internet. Keys Harbor has and this server does not use are ignored, as Harbor ignores
keys it does not know; a value that cannot be used (a negative timeout, a GPU) is refused.

Every problem is a `TaskError` of one line naming the task and the file: ``task hello:
task.toml: [agent] timeout_sec must be a number > 0, got 'soon'``.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from envsdk.errors import EnvSDKError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "TASK_FILES",
    "HarborTask",
    "TaskError",
    "TaskFolderError",
    "is_task_folder",
    "load_tasks",
    "read_task",
    "scan_tasks",
]

#: The files every task must have, as its folder names them.
TASK_FILES = ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh")

# Harbor's own defaults (its TaskConfig).
_VERIFIER_TIMEOUT_S = 600.0
_BUILD_TIMEOUT_S = 600.0
_CPUS = 1.0
_MEMORY_MB = 2048
_STORAGE_MB = 10240

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG])B?\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}


class TaskError(EnvSDKError, ValueError):
    """A task folder this server cannot serve: ``task <name>: <file>: <what is wrong>``, one
    line. ``task`` and ``file`` name them apart (``file`` relative to the task folder, or the
    path in the task's container for what the verifier left there)."""

    def __init__(self, task: str, file: str, problem: str) -> None:
        super().__init__(f"task {task}: {file}: {_one_line(problem)}")
        self.task = task
        self.file = file
        self.problem = problem


class TaskFolderError(EnvSDKError, ValueError):
    """The folder given as tasks holds none (missing, not a folder, no task folder in it)."""


@dataclass(frozen=True)
class HarborTask:
    """One task folder, read and checked (`read_task`).

    ``agent_timeout_s`` None: the task sets no agent time limit (the server's cap applies).
    ``network``: the task asked for the network. ``metadata``: its ``[metadata]`` table, with
    TOML dates and times as ISO text (JSON has none). ``verifier_env``: variables ``test.sh``
    runs with (``[verifier] env``). ``solution_dir`` None: the task has no ``solution/``.
    """

    name: str
    path: Path
    instruction: str
    agent_timeout_s: float | None = None
    verifier_timeout_s: float = _VERIFIER_TIMEOUT_S
    build_timeout_s: float = _BUILD_TIMEOUT_S
    cpus: float = _CPUS
    memory_mb: int = _MEMORY_MB
    storage_mb: int = _STORAGE_MB
    network: bool = False
    version: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    verifier_env: dict[str, str] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        """The build context of the task's image (its ``Dockerfile`` inside)."""
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        """What is copied to ``/tests`` once the agent is done (``test.sh`` inside)."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path | None:
        """The oracle's folder (``solve.sh`` inside), None when the task has none."""
        folder = self.path / "solution"
        return folder if folder.is_dir() else None


def is_task_folder(path: Path) -> bool:
    """Whether `path` is one task's folder rather than a folder of them: it holds a file or
    folder only a task has (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``)."""
    return any((path / name).exists() for name in ("task.toml", "instruction.md", "environment", "tests"))


def read_task(path: Path | str) -> HarborTask:
    """The task in folder `path` (its name is the folder's), checked: `TaskError` naming the
    first file that is missing or holds what this server cannot use."""
    folder = Path(path)
    name = folder.name
    for required in TASK_FILES:
        if not (folder / required).is_file():
            raise TaskError(name, required, "missing" if not (folder / required).exists() else "not a file")
    config = _read_toml(name, folder / "task.toml")
    instruction = _read_text(name, folder, "instruction.md")
    if not instruction.strip():
        raise TaskError(name, "instruction.md", "empty: the agent would be asked nothing")
    return _task(name, folder, instruction, config)


def scan_tasks(path: Path | str) -> tuple[list[HarborTask], list[TaskError]]:
    """Every task `path` holds (it is one task folder, or a folder of task folders: each
    folder in it not starting with a dot), sorted by name, and the error of each folder that is
    not a task this server can serve. `TaskFolderError` when `path` holds no task folder at all."""
    root = Path(path)
    if not root.is_dir():
        raise TaskFolderError(f"tasks folder {str(root)!r} {'is not a folder' if root.exists() else 'does not exist'}")
    folders = [root] if is_task_folder(root) else sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name
    )
    if not folders:
        raise TaskFolderError(
            f"tasks folder {str(root)!r} holds no task: give a task folder (instruction.md, task.toml, "
            "environment/Dockerfile, tests/test.sh) or a folder of them"
        )
    tasks: list[HarborTask] = []
    errors: list[TaskError] = []
    for folder in folders:
        try:
            tasks.append(read_task(folder))
        except TaskError as exc:
            errors.append(exc)
    return tasks, errors


def load_tasks(path: Path | str) -> list[HarborTask]:
    """Every task `path` holds (see `scan_tasks`), sorted by name; the first broken one's
    `TaskError` if any is."""
    tasks, errors = scan_tasks(path)
    if errors:
        raise errors[0]
    return tasks


# ---------------------------------------------------------------- reading task.toml


def _task(name: str, folder: Path, instruction: str, config: dict[str, Any]) -> HarborTask:
    sections = {}
    for section in ("metadata", "agent", "verifier", "environment"):
        value = config.get(section, {})
        if not isinstance(value, dict):
            raise TaskError(name, "task.toml", f"[{section}] must be a table, got {_shown(value)}")
        sections[section] = value
    agent, verifier, environment = sections["agent"], sections["verifier"], sections["environment"]
    version = config.get("version", config.get("schema_version", ""))
    if isinstance(version, bool) or not isinstance(version, (str, int, float)):
        raise TaskError(name, "task.toml", f"version must be text, got {_shown(version)}")
    agent_timeout = agent.get("timeout_sec")
    if environment.get("gpus", 0) not in (0, None):
        raise TaskError(name, "task.toml", f"[environment] gpus = {_shown(environment['gpus'])}: this server has no GPU to give")
    return HarborTask(
        name=name,
        path=folder,
        instruction=instruction,
        agent_timeout_s=None if agent_timeout is None else _positive(name, "agent", "timeout_sec", agent_timeout),
        verifier_timeout_s=_positive(name, "verifier", "timeout_sec", verifier.get("timeout_sec", _VERIFIER_TIMEOUT_S)),
        build_timeout_s=_positive(name, "environment", "build_timeout_sec", environment.get("build_timeout_sec", _BUILD_TIMEOUT_S)),
        cpus=_positive(name, "environment", "cpus", environment.get("cpus", _CPUS)),
        memory_mb=_megabytes(name, environment, "memory", _MEMORY_MB),
        storage_mb=_megabytes(name, environment, "storage", _STORAGE_MB),
        network=_network(name, environment),
        version=str(version),
        metadata=_jsonable(sections["metadata"]),
        verifier_env=_variables(name, verifier.get("env", {})),
    )


def _read_toml(name: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise TaskError(name, "task.toml", "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(name, "task.toml", f"not valid TOML ({exc})") from None
    except OSError as exc:
        raise TaskError(name, "task.toml", f"cannot be read ({exc.strerror or exc})") from None


def _read_text(name: str, folder: Path, file: str) -> str:
    try:
        return (folder / file).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise TaskError(name, file, "not UTF-8 text") from None
    except OSError as exc:
        raise TaskError(name, file, f"cannot be read ({exc.strerror or exc})") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _positive(name: str, section: str, key: str, value: Any) -> float:
    """`[section] key` as a finite number > 0 (seconds, CPUs)."""
    number = _number(value)
    if number is None:
        raise TaskError(name, "task.toml", f"[{section}] {key} must be a number > 0, got {_shown(value)}")
    return number


def _megabytes(name: str, environment: dict[str, Any], kind: str, default: int) -> int:
    """``<kind>_mb`` (a whole number of MB), or Harbor's older ``<kind>`` size (``"2G"``,
    ``"512M"``), which wins where both are given, as in Harbor."""
    if kind in environment and environment[kind] is not None:
        text = environment[kind]
        match = _SIZE.match(text) if isinstance(text, str) else None
        megabytes = math.floor(float(match.group(1)) * _SIZE_MB[match.group(2).upper()]) if match else 0
        if megabytes < 1:
            raise TaskError(
                name, "task.toml", f"[environment] {kind} must be a size like '2G' or '512M', got {_shown(text)}"
            )
        return megabytes
    value = environment.get(f"{kind}_mb", default)
    if isinstance(value, float) and value.is_integer():  # 2048.0, as Harbor's model takes it
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskError(name, "task.toml", f"[environment] {kind}_mb must be a whole number > 0, got {_shown(value)}")
    return value


def _network(name: str, environment: dict[str, Any]) -> bool:
    mode = environment.get("network_mode")
    if mode is not None:
        if mode == "public":
            return True
        if mode == "no-network":
            return False
        raise TaskError(
            name, "task.toml",
            f"[environment] network_mode {_shown(mode)} is not served here: use 'public' or 'no-network' "
            "(no per-host allow-list)",
        )
    allowed = environment.get("allow_internet", False)
    if not isinstance(allowed, bool):
        raise TaskError(name, "task.toml", f"[environment] allow_internet must be true or false, got {_shown(allowed)}")
    return allowed


def _variables(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TaskError(name, "task.toml", f"[verifier] env must be a table of text values, got {_shown(value)}")
    for key in value:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise TaskError(name, "task.toml", f"[verifier] env: {_shown(key)} is not a variable name")
    return dict(value)


def _jsonable(value: Any) -> Any:
    """`value` with TOML's dates and times as ISO text, so it travels as JSON."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())
