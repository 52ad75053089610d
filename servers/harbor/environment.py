"""`HarborEnvironment`: Harbor tasks played in containers, verified once the agent is done.

One container per episode, started at reset from the task's image (built when the server
started, `HarborTasks.build`) and closed once the episode has its verdict (or the session
ends): nothing of one episode reaches the next. The agent works through four tools (the
``@tool`` methods, and the step action `HarborAction` of the same): ``bash(command)``,
``read_file(path)``, ``write_file(path, content)`` and ``submit()``.

The episode ends at ``submit``, when the agent's time is up (``[agent] timeout_sec``, wall
clock from reset, capped by the server: a command is cut at the time left, and the step that
finds no time left ends the episode) or at the step limit. Then the verifier, in the same
container, as Harbor runs it: every process the agent left is killed (the container is
restarted, its files kept); ``/logs/verifier`` is made, empty; the task's ``tests/`` is copied
to ``/tests`` only now; ``bash /tests/test.sh`` runs under ``[verifier] timeout_sec``; every
process the tests left is killed (a daemon cannot change the reward once ``test.sh`` is done);
the reward is read from ``/logs/verifier/reward.json`` or ``reward.txt`` (`parse_reward`: a
plain file of at most 64 KiB, copied out by the engine into memory, never more). ``/logs`` and
``/tests`` are tmpfs mounts the engine makes with the container (`HarborLimits.container_limits`:
root's, mode 0755; ``/tests`` sized by the task's ``tests/``), and the restart makes both anew,
empty: what the agent wrote there, and any mode or ACL it gave them, is gone, and a mount point
cannot be renamed, so the tests' own programs run as another user cannot swap either for theirs
even where ``/`` was left writable to all. So nothing the agent wrote where the verifier looks,
and no process it or the tests left, can stand in for the verifier's output, and the agent
never sees the tests. The verifier's output stays in the server's log (debug level); the wire
carries its exit status and seconds only.

The tests run in the agent's container, with the programs found there: before they run, the
engine's list of what the agent changed is checked (`servers.harbor.tamper`), with every
process stopped; a change to a program, library or Python start-up file the verification
depends on (``bash``, ``python``, ``sitecustomize.py``, ``/etc/ld.so.preload``, a program
that shadows a system one on the PATH...) means the tests are not run and the reward is 0.0,
the paths named in ``metadata.verifier.tampered``. What the tests read as data is the
agent's work, as in Harbor.

Every method is a plain function: the server runs it on the session's lane under its
deadline, and every container call has its own deadline inside.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import re
import shlex
import stat
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from envsdk.env import Environment
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.protocol import MAX_ECHOED_CHARS, ErrorCode, FrameError, shorten_input
from envsdk.rewards.parts import REWARD_COMPONENTS, TIMINGS
from envsdk.sandbox import CompletedRun, SandboxError, SandboxPathError
from envsdk.sandbox.container import (
    ContainerError,
    ContainerLimits,
    ContainerProvider,
    ContainerSandbox,
    EngineOutputTooLarge,
)
from envsdk.tools import tool
from envsdk.web import WebView
from servers.harbor import tamper
from servers.harbor.models import HarborAction, HarborObservation, HarborState
from servers.harbor.tasks import HarborTask, TaskError, scan_tasks

__all__ = [
    "MAX_REWARD",
    "MAX_REWARD_NUMBERS",
    "MAX_STEPS",
    "MAX_STEPS_LIMIT",
    "PART_NAME",
    "HarborEnvironment",
    "HarborLimits",
    "HarborOptionError",
    "HarborTasks",
    "Verdict",
    "parse_reward",
    "verify",
]

# Under envsdk's loggers, so a server's --log-level reaches it (debug: the verifier's output).
logger = logging.getLogger("envsdk.harbor")

_T = TypeVar("_T")

#: Default most tool calls of one episode (a reset option changes it, up to `MAX_STEPS_LIMIT`).
MAX_STEPS = 100
MAX_STEPS_LIMIT = 10_000
#: Where the verifier writes, and what of it is read.
VERIFIER_DIR = "/logs/verifier"
_REWARD_BYTES = 64 * 1024
_REWARD_NAMES = ("reward.json", "reward.txt")
#: A reward file's tar archive, as the engine copies it out: the file, its headers, the end.
_REWARD_ARCHIVE_BYTES = _REWARD_BYTES + 16 * 1024
#: The size of the /logs tmpfs: the verifier's reward and what the tests log there (the agent
#: may write there in its turn too: gone at the restart).
LOGS_TMPFS_BYTES = 16 << 20
#: Of the /tests tmpfs, beyond the task's tests/: what the tests write beside themselves
#: (Python's byte code, pytest's cache).
TESTS_TMPFS_MARGIN = 16 << 20
#: A reward or part of larger magnitude is a broken verifier (see `parse_reward`).
MAX_REWARD = 1e6
#: At most this many numbers in a reward.json, the reward among them.
MAX_REWARD_NUMBERS = 32
_NAME_CHARS = 64
#: What a reward.json part may be named: it goes back to the client as it is.
PART_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{_NAME_CHARS}}}", re.ASCII)
#: Of a name that is refused, the message shows this many characters (escaped).
_NAME_SHOWN = 32
#: Deadline of the verifier's own housekeeping commands (not the tests).
_SETUP_TIMEOUT_S = 30.0
#: Deadline of the check of the agent's changes: the engine's list of them takes up to about
#: 15 s on an idle 2-core machine for changes within the check's budget (deep trees cost most),
#: so twice that leaves room for a loaded one.
_CHECK_TIMEOUT_S = 60.0
# Checks, with the shell's own builtins (no program of the agent's), that /logs and /tests
# are the engine's tmpfs mounts (exactly one each), empty, as the restart left them, then makes
# /logs/verifier; its exit status says what was not so (`_NOT_FRESH`).
_FRESH = (
    "shopt -s nullglob dotglob; n=0; while read -r _ _ _ _ point _ rest; do "
    'case "$point ${rest#*- }" in "/logs tmpfs "*|"/tests tmpfs "*) n=$((n + 1)) ;; esac; '
    'done < /proc/self/mountinfo; [ "$n" = 2 ] || exit 3; '
    'for d in /logs /tests; do left=("$d"/*); [ -d "$d" ] && [ ! -L "$d" ] && [ "${#left[@]}" = 0 ] || exit 4; done; '
    f"mkdir {VERIFIER_DIR} && [ -d {VERIFIER_DIR} ] && [ ! -L {VERIFIER_DIR} ] || exit 5"
)
_NOT_FRESH = {
    3: "/logs and /tests are not tmpfs mounts of the engine's (start the container with HarborLimits.container_limits)",
    4: "/logs or /tests was not empty after the restart",
    5: f"{VERIFIER_DIR} could not be made",
}


class HarborOptionError(FrameError, ValueError):
    """A reset option the server cannot use (an unknown task, a bad seed or step limit): the
    client's mistake, answered VALIDATION_ERROR."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.VALIDATION_ERROR, shorten_input(message))


@dataclass(frozen=True)
class HarborLimits:
    """What the server gives a task at most, and how much of a tool's output the agent sees.

    command_timeout_s: one ``bash`` command at most (and never past the agent's time left).
    max_agent_timeout_s: cap on ``[agent] timeout_sec``, and the agent's time for a task that sets none.
    max_verifier_timeout_s, max_build_timeout_s: caps on ``[verifier] timeout_sec`` and
        ``[environment] build_timeout_sec``.
    max_cpus, max_memory_mb, max_storage_mb: caps on the task's ``[environment]`` resources.
    pids: processes and threads of one container.
    output_bytes: of a tool's output, the agent sees at most this many bytes (its start and
        its end); the container keeps up to 1 MiB of each stream of a command.
    max_steps: tool calls of an episode unless its reset says otherwise.
    """

    command_timeout_s: float = 180.0
    max_agent_timeout_s: float = 3600.0
    max_verifier_timeout_s: float = 600.0
    max_build_timeout_s: float = 1800.0
    max_cpus: float = 4.0
    max_memory_mb: int = 4096
    max_storage_mb: int = 4096
    pids: int = 1024
    output_bytes: int = 16 * 1024
    max_steps: int = MAX_STEPS

    def __post_init__(self) -> None:
        for name, spec in self.__dataclass_fields__.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"HarborLimits.{name} must be a positive number, got {value!r}")
            if spec.type == "int" and not isinstance(value, int):
                raise ValueError(f"HarborLimits.{name} must be a whole number, got {value!r}")
        if self.max_steps > MAX_STEPS_LIMIT:
            raise ValueError(f"HarborLimits.max_steps must be at most {MAX_STEPS_LIMIT}, got {self.max_steps}")

    @property
    def step_timeout_s(self) -> float:
        """Deadline of one step or tool call: a command, then (when it ended the episode) the
        verifier, with room for restarting the container and copying the tests in."""
        return self.command_timeout_s + self.max_verifier_timeout_s + 2 * _SETUP_TIMEOUT_S + _CHECK_TIMEOUT_S + 60.0

    def agent_timeout_s(self, task: HarborTask) -> float:
        return min(task.agent_timeout_s or math.inf, self.max_agent_timeout_s)

    def verifier_timeout_s(self, task: HarborTask) -> float:
        return min(task.verifier_timeout_s, self.max_verifier_timeout_s)

    def container_limits(self, task: HarborTask, base: ContainerLimits | None = None) -> ContainerLimits:
        """The container of `task` (`base`: the provider's defaults, for what a task does not
        set): its resources and build time, each capped here, and the verifier's tmpfs
        folders: ``/logs`` (`LOGS_TMPFS_BYTES`) and ``/tests`` (the task's ``tests/`` and
        `TESTS_TMPFS_MARGIN`), counted in its memory limit and its promise of store room."""
        return replace(
            base or ContainerLimits(),
            cpus=min(task.cpus, self.max_cpus),
            memory_mb=min(task.memory_mb, self.max_memory_mb),
            storage_mb=min(task.storage_mb, self.max_storage_mb),
            pids=self.pids,
            network=task.network,
            timeout_s=self.command_timeout_s,
            build_timeout_s=min(task.build_timeout_s, self.max_build_timeout_s),
            tmpfs=(("/logs", LOGS_TMPFS_BYTES), ("/tests", _tests_bytes(task.tests_dir) + TESTS_TMPFS_MARGIN)),
        )


def _tests_bytes(folder: Path) -> int:
    """What a copy of `folder` takes on a tmpfs: each file's pages, a page for each folder and link."""
    page = 4096
    total = page
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            info = os.lstat(os.path.join(root, name))
            total += page + (-(-info.st_size // page) * page if stat.S_ISREG(info.st_mode) else 0)
    return total


class HarborTasks:
    """The tasks a server serves (a folder of task folders, or one) and their images.

    Every folder is served by name, the broken ones too: a reset of one is answered with the
    `TaskError` that says what is wrong (a missing file, a ``task.toml`` value, an image that
    did not build), while the others play. `build` makes every image (cached by content, so a
    restart with the same tasks builds nothing).
    """

    def __init__(
        self, path: str | Path, provider: ContainerProvider, limits: HarborLimits | None = None, *,
        tamper_check: bool = True,
    ) -> None:
        self.provider = provider
        self.limits = limits or HarborLimits()
        #: Whether the verifier refuses to run tests once the agent changed what they run
        #: (`verify`'s `tamper_check`).
        self.tamper_check = tamper_check
        tasks, errors = scan_tasks(path)
        self.tasks: dict[str, HarborTask] = {t.name: t for t in tasks}
        self.broken: dict[str, TaskError] = {e.task: e for e in errors}
        self.names: list[str] = sorted([*self.tasks, *self.broken])
        self.images: dict[str, str] = {}

    def build(self) -> list[TaskError]:
        """Build the image of every task not built yet, each under its build timeout; a task
        whose image fails joins `broken` (one line in the log names it and its file). The
        errors of every broken task are returned."""
        for name, task in self.tasks.items():
            if name in self.images or name in self.broken:
                continue
            limits = self.limits.container_limits(task, self.provider.limits)
            started = time.monotonic()
            try:
                self.images[name] = self.provider.build_image(
                    task.environment_dir, name=name, timeout_s=limits.build_timeout_s,
                )
            except SandboxError as exc:
                # The provider's words name the Dockerfile by its full path; the task's file says it.
                said = str(exc).removeprefix(f"{task.environment_dir / 'Dockerfile'}: ")
                self.broken[name] = TaskError(name, "environment/Dockerfile", said)
            else:
                logger.info("task %s: image %s ready (%.1f s)", name, self.images[name], time.monotonic() - started)
        for error in self.broken.values():
            logger.warning("%s", error)
        return list(self.broken.values())

    def task(self, name: str) -> HarborTask:
        """The task named `name`, ready to start; its `TaskError` when it is broken (cut at a
        clause to what the wire keeps of an error: the log of `build` has it whole)."""
        if name in self.broken:
            raise _fit_for_the_wire(self.broken[name])
        if name not in self.images:
            raise TaskError(name, "environment/Dockerfile", "its image was not built (the server's build step did not run)")
        return self.tasks[name]

    def pick(self, seed: int | None, name: str | None) -> str:
        """A task's name: `name`, else the task ``seed % count`` of the sorted names (broken
        ones included, so a task's number does not change when another breaks), else one at
        random."""
        if name is not None:
            if not isinstance(name, str) or name not in self.names:
                shown = ", ".join(self.names[:20]) + (", ..." if len(self.names) > 20 else "")
                raise HarborOptionError(f"unknown task {name!r}: this server has {len(self.names)} ({shown})")
            return name
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise HarborOptionError(f"seed must be an integer, got {seed!r}")
        index = seed % len(self.names) if seed is not None else random.SystemRandom().randrange(len(self.names))
        return self.names[index]


def _fit_for_the_wire(error: TaskError) -> TaskError:
    """`error`, or where its line is longer than the wire keeps of an error's text (the server
    would cut it anywhere), the same error cut after a whole clause, saying where the rest is."""
    text = str(error)
    if len(text) <= MAX_ECHOED_CHARS:
        return error
    note = " (the whole error is in the server's log from its start)"
    budget = MAX_ECHOED_CHARS - len(f"task {error.task}: {error.file}: ") - len(note)
    if budget < 32:
        return error
    said = " ".join(error.problem.split())
    cut = max(said.rfind(": ", 0, budget), said.rfind("; ", 0, budget))
    return TaskError(error.task, error.file, (said[:cut] if cut > 0 else said[: budget - 3] + "...") + note)


# ---------------------------------------------------------------- the verifier


@dataclass(frozen=True)
class Verdict:
    """The verifier's outcome: the reward, reward.json's other named parts, and how the tests
    ran (``exit_code`` of ``test.sh``, ``seconds``, ``timed_out``: a run past ``[verifier]
    timeout_sec`` scores 0.0, whatever it wrote). `tampered`: the paths the agent changed that
    the verification depends on; then the tests were not run (``exit_code`` None), reward 0.0."""

    reward: float
    parts: dict[str, float]
    exit_code: int | None
    seconds: float
    timed_out: bool
    tampered: tuple[str, ...] = ()

    @property
    def reason(self) -> str | None:
        """Why the tests were not run (one line), or None when they ran."""
        return tamper.describe(self.tampered) if self.tampered else None

    def wire(self) -> dict[str, Any]:
        # Its seconds are not here: they are a timing (the step's ``timings.verifier_s``).
        wire: dict[str, Any] = {"exit_code": self.exit_code, "timed_out": self.timed_out}
        if self.tampered:
            wire.update(tampered=list(self.tampered[: tamper.SHOWN]), reason=self.reason)
        return wire


def verify(sandbox: ContainerSandbox, task: HarborTask, *, timeout_s: float, tamper_check: bool = True) -> Verdict:
    """Run `task`'s tests in `sandbox` once the agent is done (see the module docstring).
    `TaskError` when the tests leave no reward, or one that is not a finite number.
    `tamper_check` False: run the tests even when the agent changed what they run."""
    started = time.monotonic()
    if not tamper_check:
        sandbox.stop_processes()
    elif tampered := tamper.check(sandbox, task.verifier_env, timeout_s=_CHECK_TIMEOUT_S):
        logger.warning("task %s: %s (%d path%s in all)", task.name, tamper.describe(tampered), len(tampered),
                       "" if len(tampered) == 1 else "s")
        logger.debug("task %s: the paths: %s", task.name, tampered)
        return Verdict(reward=0.0, parts={}, exit_code=None, seconds=time.monotonic() - started, timed_out=False,
                       tampered=tuple(tampered))
    fresh = sandbox.bash(_FRESH, timeout=_SETUP_TIMEOUT_S)
    if fresh.returncode != 0:
        why = _NOT_FRESH.get(fresh.returncode, f"the check of /logs and /tests failed (exit status {fresh.returncode})")
        raise ContainerError(f"task {task.name}: the verifier's folders are not fresh for the tests: {why}")
    sandbox.copy_in(task.tests_dir, "/tests")
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in task.verifier_env.items())
    script = f"{exports}cd {shlex.quote(sandbox.workdir or '/')} 2>/dev/null || cd /\nbash /tests/test.sh\n"
    run = sandbox.bash(script, timeout=timeout_s)
    seconds = time.monotonic() - started
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "task %s: tests/test.sh exit %s in %.2f s%s\n--- stdout\n%s\n--- stderr\n%s", task.name, run.returncode,
            seconds, " (timed out)" if run.timed_out else "", _text(run.stdout), _text(run.stderr),
        )
    if run.timed_out:
        return Verdict(reward=0.0, parts={}, exit_code=run.returncode, seconds=seconds, timed_out=True)
    # A daemon the tests started (as root, or as the user they ran the agent's code as) must
    # not change the reward once test.sh is done: nothing runs while it is read.
    sandbox.kill_processes(timeout=_SETUP_TIMEOUT_S)
    found = _reward_files(sandbox, task.name)
    reward, parts = parse_reward(task.name, found["reward.json"], found["reward.txt"])
    return Verdict(reward=reward, parts=parts, exit_code=run.returncode, seconds=time.monotonic() - started, timed_out=False)


def _reward_files(sandbox: ContainerSandbox, task: str) -> dict[str, bytes | None]:
    """reward.json and reward.txt as the tests left them (None: not there, or not a plain
    file; a link is not followed), with no process left to change them. Each is looked at
    first (``stat``: its type and size); a plain file of at most `_REWARD_BYTES` is copied out
    by the engine into memory (`ContainerSandbox.get_archive`, bounded) and read on the host,
    so no program in the container reads it; a larger one is a `TaskError`, never copied."""
    paths = [f"{VERIFIER_DIR}/{name}" for name in _REWARD_NAMES]
    # stat is the image's (the tamper check protects it); a file that is not there is no line.
    listed = sandbox.run(["stat", "-c", "%f %s %n", "--", *paths], timeout=_SETUP_TIMEOUT_S)
    kinds: dict[str, tuple[int, int]] = {}
    for line in listed.stdout.decode("utf-8", "replace").splitlines():
        try:
            raw_mode, raw_size, listed_path = line.split(" ", 2)
            kinds[listed_path] = (int(raw_mode, 16), int(raw_size))
        except ValueError:
            raise ContainerError(f"stat of the reward files answered {line[:80]!r}") from None
    found: dict[str, bytes | None] = {}
    for name, path in zip(_REWARD_NAMES, paths):
        mode, size = kinds.get(path, (0, 0))
        if not stat.S_ISREG(mode):
            found[name] = None
            continue
        if size > _REWARD_BYTES:
            raise TaskError(
                task, path, f"{size} bytes, more than the {_REWARD_BYTES} read: a reward is a number or a small JSON object",
            )
        try:
            archive = sandbox.get_archive(path, max_bytes=_REWARD_ARCHIVE_BYTES)
        except EngineOutputTooLarge:
            raise TaskError(task, path, f"grew past {_REWARD_BYTES} bytes while it was copied") from None
        found[name] = _archived_file(archive, path)
    return found


def _archived_file(archive: bytes, path: str) -> bytes | None:
    """The first `_REWARD_BYTES` of the plain file `archive` (a tar of one file) holds."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            member = tar.next()
            if member is None or not member.isreg():
                return None
            extracted = tar.extractfile(member)
            return extracted.read(_REWARD_BYTES) if extracted is not None else None
    except tarfile.TarError as exc:
        raise ContainerError(f"the engine's copy of {path} is not a tar archive: {exc}") from None


def parse_reward(task: str, reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float, dict[str, float]]:
    """The reward and reward.json's other named parts, read as Harbor reads them: reward.json
    when it exists (its numeric fields; the reward is its ``reward``, else reward.txt's number,
    else its only field), else reward.txt (one number). `TaskError` naming the file for a file
    that is empty, not a number (or a JSON object), or not finite, and naming ``tests/test.sh``
    when it wrote neither.

    Two more rules, which Harbor does not have, because what a verifier writes goes to the
    client and to a trainer:

    - The parts' names go back on the wire (``metadata.reward_components``), so each numeric
      field's name must be a short identifier (`PART_NAME`: letters, digits, ``_ . : -``, 1 to
      64 characters), at most `MAX_REWARD_NUMBERS` numbers in all: text of any other shape
      (a verifier that named its parts after its tests' contents) would hand the tests to the
      model, so it is a broken verifier, named by a short escaped excerpt only.
    - Harbor leaves rewards unbounded (most tasks give 0 to 1, some a count or a score). A
      trainer averages them over a batch or normalises them per group, so one value out of
      all proportion (1e300 from a broken or subverted verifier) drowns every other
      episode's signal: a reward or part past `MAX_REWARD` either way is refused like NaN.
    """
    if reward_json is not None:
        file = f"{VERIFIER_DIR}/reward.json"
        try:
            parsed = json.loads(reward_json.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise TaskError(task, file, f"not JSON: {_excerpt(reward_json)}") from None
        if not isinstance(parsed, dict):
            raise TaskError(task, file, f"must be a JSON object of named numbers, got {_excerpt(reward_json)}")
        numbers = {
            key: value for key, value in parsed.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        if len(numbers) > MAX_REWARD_NUMBERS:
            raise TaskError(task, file, f"{len(numbers)} numbers, more than {MAX_REWARD_NUMBERS}")
        parts: dict[str, float] = {}
        for key, value in numbers.items():
            if not PART_NAME.fullmatch(key):
                shown = ascii(key[:_NAME_SHOWN]) + ("..." if len(key) > _NAME_SHOWN else "")
                raise TaskError(
                    task, file,
                    f"part name {shown} is not a short name (letters, digits, _ . : -, 1 to {_NAME_CHARS} characters)",
                )
            number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
            if not math.isfinite(number):
                raise TaskError(task, file, f"{key!r} is {_excerpt(str(value).encode())}, not a finite number")
            if abs(number) > MAX_REWARD:
                raise TaskError(task, file, f"{key!r} is {number!r}, past the bound on a reward ({MAX_REWARD:g} either way)")
            parts[key] = number
        if "reward" in parts:
            reward = parts.pop("reward")
        elif reward_txt is not None:
            reward = _reward_text(task, reward_txt)
        elif len(parts) == 1:
            reward = next(iter(parts.values()))
        else:
            raise TaskError(
                task, file,
                f"{len(parts)} numbers and no 'reward' among them: name the reward 'reward' or write it to reward.txt",
            )
        return reward, parts
    if reward_txt is not None:
        return _reward_text(task, reward_txt), {}
    raise TaskError(task, "tests/test.sh", f"wrote no reward ({VERIFIER_DIR}/reward.txt or reward.json)")


def _reward_text(task: str, data: bytes) -> float:
    file = f"{VERIFIER_DIR}/reward.txt"
    text = data.decode("utf-8", "replace").strip()
    if not text:
        raise TaskError(task, file, "empty")
    try:
        value = float(text)
    except ValueError:
        raise TaskError(task, file, f"not a number: {_excerpt(data)}") from None
    if not math.isfinite(value):
        # float() reads only digits, signs, points, exponents and inf/nan: no quotes needed,
        # but a long run of digits is cut like any excerpt.
        raise TaskError(task, file, f"{_excerpt(data)[1:-1]} is not a finite number")
    if abs(value) > MAX_REWARD:
        raise TaskError(task, file, f"{value!r} is past the bound on a reward ({MAX_REWARD:g} either way)")
    return value


def _excerpt(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# ---------------------------------------------------------------- the environment


@dataclass
class _Outcome:
    """One tool call's result: the text the agent reads, a command's exit status, metadata."""

    text: str
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False


class HarborEnvironment(Environment[HarborAction, HarborObservation, HarborState]):
    """A Harbor task in a container: the agent's tools, then the verifier (see the module docstring)."""

    # The server's own settings (create_harbor_app sets them from the server's limits) come
    # first; these cover the default limits.
    step_timeout_s: ClassVar[float] = HarborLimits().step_timeout_s
    reset_timeout_s: ClassVar[float] = 180.0
    close_timeout_s: ClassVar[float] = 60.0

    def __init__(self, tasks: HarborTasks) -> None:
        super().__init__()
        self._tasks = tasks
        self._limits = tasks.limits
        self._sandbox: ContainerSandbox | None = None
        self._task: HarborTask | None = None
        self._state = HarborState()
        self._done = False
        self._max_steps = self._limits.max_steps
        self._agent_timeout_s = 0.0
        self._deadline = 0.0

    # ---------------------------------------------------------------- OpenEnv calls

    def reset(  # type: ignore[override]
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        *,
        task: str | None = None,
        max_steps: int | None = None,
    ) -> HarborObservation:
        """Start an episode: the task named `task`, else task ``seed % count`` of the sorted
        names, else one at random; its container started, its instruction returned.
        `max_steps`: most tool calls (1..10000; default the server's)."""
        name = self._tasks.pick(seed, task)
        if max_steps is not None and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= MAX_STEPS_LIMIT
        ):
            raise HarborOptionError(f"max_steps must be an integer from 1 to {MAX_STEPS_LIMIT}, got {max_steps!r}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise HarborOptionError(f"episode_id must be a string, got {episode_id!r}")
        self._release()
        self._task, self._state = None, HarborState()  # until the container is up
        chosen = self._tasks.task(name)
        self._sandbox = self._tasks.provider.start(
            self._tasks.images[name], limits=self._limits.container_limits(chosen, self._tasks.provider.limits)
        )
        self._task, self._done = chosen, False
        self._max_steps = max_steps or self._limits.max_steps
        self._agent_timeout_s = self._limits.agent_timeout_s(chosen)
        self._deadline = time.monotonic() + self._agent_timeout_s
        self._state = HarborState(episode_id=episode_id or uuid.uuid4().hex, task=name)
        return HarborObservation(
            text=chosen.instruction,
            metadata={**self._task_info(), "agent_timeout_s": self._agent_timeout_s, "max_steps": self._max_steps},
        )

    def step(self, action: HarborAction) -> HarborObservation:
        """Call `action`'s tool; the observation of the call that ends the episode carries the
        verifier's reward."""
        started = time.monotonic()
        outcome, ended, verdict = self._call(action.tool, action.arguments())
        metadata: dict[str, Any] = {
            **self._task_info(),
            "tool": action.tool,
            "timed_out": outcome.timed_out,
            "truncated": outcome.truncated,
            TIMINGS: {"time_s": round(time.monotonic() - started, 4)},
        }
        if ended is not None:
            metadata["ended"] = ended
        if verdict is not None:
            metadata["verifier"] = verdict.wire()
            metadata[TIMINGS]["verifier_s"] = round(verdict.seconds, 3)
            if verdict.parts:
                metadata[REWARD_COMPONENTS] = dict(verdict.parts)
        return HarborObservation(
            text=outcome.text, exit_code=outcome.exit_code, done=self._done,
            reward=verdict.reward if verdict is not None else 0.0, metadata=metadata,
        )

    @property
    def state(self) -> HarborState:
        return self._state

    def close(self) -> None:
        self._release()

    # ---------------------------------------------------------------- tools (MCP)

    @tool
    def bash(self, command: str) -> str:
        """Run a command line with bash in the task's machine (a Linux container).

        Args:
            command: The command line; its output and exit status come back.

        Returns:
            What the command printed (stdout, then stderr), with its exit status when it is not 0.
        """
        return self._tool_text("bash", {"command": command})

    @tool
    def read_file(self, path: str) -> str:
        """Read a text file of the task's machine.

        Args:
            path: The file's path, absolute or relative to the working folder.

        Returns:
            The file's text.
        """
        return self._tool_text("read_file", {"path": path})

    @tool
    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the task's machine (made or replaced whole).

        Args:
            path: The file's path, absolute or relative to the working folder.
            content: The file's new text.

        Returns:
            How many bytes were written where.
        """
        return self._tool_text("write_file", {"path": path, "content": content})

    @tool
    def submit(self) -> str:
        """Say the task is done: the episode ends and the task's tests judge the machine as it is.

        Returns:
            The reward the tests gave.
        """
        return self._tool_text("submit", {})

    # ---------------------------------------------------------------- web page

    @staticmethod
    def render_web(observation: HarborObservation) -> WebView:
        """The /web page's view of an observation: the task's name, the text the model reads
        (the instruction, or a tool's output) and, on the step that ended the episode, why it
        ended and how the tests exited (the page shows the reward beside it). The actions are
        examples of step actions while the episode runs."""
        meta = observation.metadata
        lines = [f"# {meta.get('task', '')}", observation.text]
        actions: list[str] = ['{"tool": "bash", "command": "ls"}', '{"tool": "submit"}']
        if "ended" in meta:
            verifier = meta.get("verifier") or {}
            said = verifier.get("reason") or f"the tests exited {verifier.get('exit_code')}"
            lines.append(f"[episode over: {meta['ended']}; {said}]")
            actions = []
        return WebView(text="\n".join(lines), actions=actions)

    # ---------------------------------------------------------------- internals

    def _tool_text(self, name: str, arguments: dict[str, Any]) -> str:
        outcome, ended, verdict = self._call(name, arguments)
        if ended is None:
            return outcome.text
        said = _ENDED[ended].format(seconds=self._agent_timeout_s, steps=self._max_steps)
        reward = f"; reward {verdict.reward:g}" if verdict is not None else ""
        if verdict is not None and verdict.reason:
            reward += f" ({verdict.reason})"
        return f"{outcome.text}\n[episode over: {said}{reward}]".lstrip("\n")

    def _call(self, name: str, arguments: dict[str, Any]) -> tuple[_Outcome, str | None, Verdict | None]:
        """Run one tool call, then end the episode (verified) if it ended it: submitted, the
        agent's time up, or its last step."""
        sandbox, _ = self._running()
        time_left = self._deadline - time.monotonic()
        if time_left <= 0:
            outcome = _Outcome(text=f"[not run: the agent's {self._agent_timeout_s:g} s are up]")
            return outcome, "agent_timeout", self._end("agent_timeout")
        if name == "bash":
            outcome = self._bash(sandbox, arguments["command"], time_left)
        elif name == "read_file":
            outcome = self._read(sandbox, arguments["path"])
        elif name == "write_file":
            outcome = self._write(sandbox, arguments["path"], arguments["content"])
        else:
            outcome = _Outcome(text="")
        self._state.step_count += 1
        ended = (
            "submit" if name == "submit"
            else "agent_timeout" if self._deadline - time.monotonic() <= 0
            else "max_steps" if self._state.step_count >= self._max_steps
            else None
        )
        return outcome, ended, self._end(ended) if ended is not None else None

    def _bash(self, sandbox: ContainerSandbox, command: str, time_left: float) -> _Outcome:
        deadline = min(self._limits.command_timeout_s, time_left)
        run = self._guarded(lambda: sandbox.bash(command, timeout=deadline))
        return _bash_outcome(run, deadline, self._limits.output_bytes)

    def _read(self, sandbox: ContainerSandbox, path: str) -> _Outcome:
        limit = self._limits.output_bytes
        try:
            data = self._guarded(lambda: sandbox.read_file(path, max_bytes=limit + 1))
        except _FileRefused as exc:
            return _Outcome(text=f"error: {exc}")
        shown, cut = _shown(data, limit)
        note = f"\n[file cut: the first {limit} bytes are shown]" if cut else ""
        return _Outcome(text=shown + note, truncated=cut)

    def _write(self, sandbox: ContainerSandbox, path: str, content: str) -> _Outcome:
        data = content.encode("utf-8", "surrogatepass")
        try:
            self._guarded(lambda: sandbox.write_file(path, data))
        except _FileRefused as exc:
            return _Outcome(text=f"error: {exc}")
        return _Outcome(text=f"wrote {len(data)} bytes to {path}")

    def _guarded(self, call: Callable[[], _T]) -> _T:
        """`call`, turning a refused file path into `_FileRefused` (an answer to the agent),
        and ending the episode when the container itself failed."""
        try:
            return call()
        except _PATH_ERRORS as exc:
            raise _FileRefused(str(exc) or type(exc).__name__) from None
        except SandboxError:
            # The container is gone or hung: the episode cannot go on in it.
            self._release()
            self._done = self._state.done = True
            raise

    def _end(self, reason: str) -> Verdict:
        """End the episode: verify, record the verdict in the state, close the container."""
        sandbox, task = self._sandbox, self._task
        assert sandbox is not None and task is not None
        self._done = self._state.done = True
        self._state.ended = reason
        try:
            verdict = verify(sandbox, task, timeout_s=self._limits.verifier_timeout_s(task),
                             tamper_check=self._tasks.tamper_check)
        except Exception as exc:
            self._state.error = str(exc)
            raise
        finally:
            self._release()
        self._state.reward = verdict.reward
        self._state.success = verdict.reward >= 1.0
        self._state.reward_components = dict(verdict.parts)
        logger.info(
            "task %s: episode %s ended (%s): reward %g, tests exit %s in %.2f s%s", task.name,
            self._state.episode_id, reason, verdict.reward, verdict.exit_code, verdict.seconds,
            " (timed out)" if verdict.timed_out else " (not run: the agent changed what they run)" if verdict.tampered else "",
        )
        return verdict

    def _running(self) -> tuple[ContainerSandbox, HarborTask]:
        if self._task is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._done or self._sandbox is None:
            raise EpisodeDoneError(
                "The episode is over (submitted, out of time or out of steps); reset to start another",
                code=ErrorCode.EPISODE_DONE.value,
            )
        return self._sandbox, self._task

    def _task_info(self) -> dict[str, Any]:
        assert self._task is not None
        return {"task": self._task.name, "task_metadata": self._task.metadata}

    def _release(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()


_ENDED = {
    "submit": "submitted",
    "agent_timeout": "the agent's {seconds:g} s are up",
    "max_steps": "the step limit ({steps}) is reached",
}


class _FileRefused(Exception):
    """A file tool's path the container refused (no such file, a folder, outside the machine)."""


_PATH_ERRORS: tuple[type[BaseException], ...] = (SandboxPathError,)


def _bash_outcome(run: CompletedRun, deadline: float, limit: int) -> _Outcome:
    out, out_cut = _shown(run.stdout, limit // 2 if run.stderr else limit, both_ends=True)
    err, err_cut = _shown(run.stderr, limit // 2, both_ends=True)
    text = out + ("\n" if out and err and not out.endswith("\n") else "") + err
    notes: list[str] = []
    if run.timed_out:
        notes.append(f"[stopped: the command ran past {deadline:g} s]")
    elif run.returncode != 0:
        notes.append(f"[exit status {run.returncode}]")
    if run.note:
        notes.append(f"[{run.note}]")
    cut = out_cut or err_cut or run.truncated
    if cut:
        notes.append(f"[output cut: {run.stdout_bytes + run.stderr_bytes} bytes written, the start and end shown]")
    if not text and not notes:
        notes.append("[no output]")
    tail = "\n".join(notes)
    return _Outcome(
        text=text + ("\n" if text and tail and not text.endswith("\n") else "") + tail,
        exit_code=run.returncode, timed_out=run.timed_out, truncated=cut,
    )


def _shown(data: bytes, limit: int, *, both_ends: bool = False) -> tuple[str, bool]:
    """At most `limit` bytes of `data` as text (its start, or its start and end), and whether
    anything was cut."""
    if len(data) <= limit:
        return _text(data), False
    if not both_ends:
        return _text(data[:limit]), True
    half = limit // 2
    return f"{_text(data[:half])}\n[...]\n{_text(data[-half:])}", True
