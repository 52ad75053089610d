"""The ``completions.jsonl`` record: one JSON object per trajectory, schema ``envsdk.completions/1``.

Every field has one shape, and nothing is written twice:

=====================  ======================================================================
``schema``             ``"envsdk.completions/1"`` (readers refuse other values)
``uuid``               the episode's id (the dataset row's ``uuid`` when it has one)
``env``                the environment's name (``env_config["name"]``)
``seed``               the seed the episode was reset with, or null
``env_config``         the dataset row's ``env_config``, as given
``status``             ``done`` | ``max_turns`` | ``length`` | ``error`` | ``cancelled``
``reason``             why it ended, in words, or null
``truncated``          true when the length limit cut the episode's last completion (its
                       ``finish_reason`` was "length", or it passed ``max_completion_chars``);
                       ``infos["cut_replies"]`` then names the rule that dealt with it (``env``:
                       sent to the environment; ``penalty``: not sent, ``infos["format_penalty"]``
                       added to the reward; ``mask``: not sent, left out of training). The
                       episode ended there: ``status`` is ``length`` unless the environment
                       ended it on that reply (``done``)
``error_kind``         the exception class name when ``status`` is ``error``, else null
``server``             the base URL of the environment server that played the episode (secrets
                       masked), or null for an environment played in-process; when the episode
                       was played again after its server failed it (`envsdk.rollout.run_batches`),
                       the server of the attempt recorded, and ``infos["lost_attempts"]`` lists
                       the attempts before it (``server``, ``error_kind``, ``reason``). Records
                       written before this field existed have none: read it as null
``success``            true/false where the environment states it (a boolean ``success`` in
                       its step info) or the scheduler does (Sudoku: solved); null where
                       nobody does: a positive reward is not taken for success
``turns``              policy replies
``total_reward``       the episode's reward (what a trainer gets): the sum of
                       ``step_rewards`` unless the scheduler shapes it, and then
                       ``infos["total_reward_is"]`` says how (Sudoku: the five-part shaped
                       total, 4.0 for a perfect game, while its ``step_rewards`` sum to 1.0)
``step_rewards``       the environment's reward at each step, one number per step
``reward_components``  name → ``{"value": episode value, "steps": [one value per step]}``;
                       a step value is null where the part was not evaluated, ``steps`` is
                       ``[]`` for a part with no per-step value. Any scheduler or rubric
                       fills it: episode values from ``rollout_infos["reward_parts"]``,
                       per-step values from each step's ``components`` (`envsdk.rewards`)
``infos``              the scheduler's other episode facts (``rollout_infos`` without the
                       numbers above), e.g. Sudoku's ``cells_filled`` and ``moves_tried``
``messages``           the conversation: what the model read and what it replied
``timings``            seconds: ``reset``, ``policy``, ``env``, ``total``, and each timing
                       the environment reported on its steps (a step's metadata
                       ``timings``, e.g. the coding server's ``time_s``) summed over the
                       episode: latencies are kept here, never among the reward parts
``final_observation``  the observation of the step at which the environment ended the episode
                       (a game's verdict: TextArena's "Congratulations! …"), which the model
                       never read, so no message holds it; null when the environment did not
                       end it (``max_turns``, ``length``, ``error``: the last observation the
                       model read is in ``messages``)
``eval``               in runs of ``envsdk rollout`` (`envsdk.evaluate`): ``example`` (the
                       seed or dataset row), ``index`` (which of its ``--rollouts-per-example``),
                       ``run`` (the run's id) and ``attempt`` (1, then 2… for each ``--resume``);
                       in a training run's records (`envsdk.integrations.trl.make_rollout_func`'s
                       ``completions``): ``example`` is the GRPO group (``group-N``: the N-th
                       group of prompts the trainer sent, whose rollouts share one
                       ``env_config``) and ``index`` the generation within it
``tokens``             only with ``envsdk rollout --tokens`` and a policy that gives them: per
                       assistant turn its prompt (or the environment's added) token ids, its
                       completion ids and logprobs (`envsdk.tokens`)
``steps``              only in the full form (``envsdk rollout --record full``): per step
                       ``turn``, ``action``, ``observation`` (the full structured one),
                       ``reward``, ``done``, ``info``, ``duration_s``; and ``reset_info``
=====================  ======================================================================

The default, lean form leaves ``steps`` and ``reset_info`` out: the model's view of every
observation is already in ``messages``, and the one it never read is ``final_observation``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import logging
import math
import os
import re
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from itertools import chain
from operator import attrgetter, methodcaller
from pathlib import Path
from typing import IO, Any, Literal

from pydantic_core import PydanticSerializationError, to_json

from envsdk.env import RolloutRequest
from envsdk.errors import mask_secrets
from envsdk.rewards.parts import REWARD_PARTS, TIMINGS, all_finite_floats
from envsdk.tokens import TOKENS

__all__ = [
    "SCHEMA", "RecordForm", "EVAL_KEY", "FORMAT_PENALTY_INFO", "Status", "StepRecord", "Trajectory", "trajectory_record", "episode_components", "record_bytes",
    "RecordError", "check_record", "finite_number", "quantile", "mean_and_std", "number_text", "stated_success", "done_reason", "success_text", "SUMMARY_FIELDS", "summary_facts", "RecordsWritten",
    "RecordsBusy", "LockFileError", "hold_records", "rehold", "lock_path", "part_basis", "basis_labels",
]

SCHEMA = "envsdk.completions/1"
RecordForm = Literal["lean", "full"]
#: The key of a record (and of a request's ``data_dict``) naming its group: ``example`` and rollout
#: ``index`` (and, in a run of ``envsdk rollout``, its ``run`` and ``attempt``).
EVAL_KEY = "eval"
#: The ``infos`` key of the format penalty an episode's reward holds (a reply cut by the length
#: limit under ``--cut-replies penalty``, Sudoku's reply with no move): part of ``total_reward``,
#: not of ``reward_components``.
FORMAT_PENALTY_INFO = "format_penalty"

Status = Literal["running", "done", "max_turns", "length", "error", "cancelled"]


@dataclass
class StepRecord:
    """One environment step: the reply that caused it and everything the environment said."""

    turn: int
    action: Any
    observation: Any
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "action": self.action,
            "observation": self.observation,
            "reward": self.reward,
            "done": self.done,
            "info": self.info,
            "components": self.components,
            "duration_s": self.duration_s,
        }


_REWARD = attrgetter("reward")
_COMPONENTS = attrgetter("components")


@dataclass
class Trajectory:
    """One episode: its messages, steps, rewards, how it ended and how long it took.

    ``runtime`` is the scheduler's per-episode handle (an env instance, a client); it is never
    written to records. ``success`` is set by the scheduler when the episode ends: True or
    False where the environment or the scheduler states it, None where nobody does.
    """

    request: RolloutRequest
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    status: Status = "running"
    reason: str | None = None
    error_kind: str | None = None
    turns: int = 0
    total_reward: float = 0.0
    success: bool | None = None
    #: The length limit cut the last completion (`envsdk.schedulers.base.MultiTurnScheduler.take_reply`).
    truncated: bool = False
    rollout_infos: dict[str, Any] = field(default_factory=dict)
    reset_info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    runtime: Any = field(default=None, repr=False)

    @property
    def uuid(self) -> str:
        return self.request.uuid

    @property
    def env_config(self) -> dict[str, Any]:
        return self.request.env_config

    @property
    def seed(self) -> Any:
        cfg = self.env_config
        if "seed" in cfg:
            return cfg["seed"]
        reset_kwargs = cfg.get("reset_kwargs")
        return reset_kwargs.get("seed") if isinstance(reset_kwargs, dict) else None

    @property
    def step_rewards(self) -> list[float]:
        return list(map(_REWARD, self.steps))

    @property
    def server(self) -> str | None:
        """The base URL of the server the episode played on (its scheduler handle's
        ``base_url``, secrets masked), or None for an episode played in-process or not begun."""
        base_url = getattr(self.runtime, "base_url", None)
        return mask_secrets(base_url) if isinstance(base_url, str) else None

    def start_over(self) -> None:
        """Forget everything the episode did (messages, steps, rewards, how it ended, its
        handle), keeping its request: it is played again from its reset, as if for the first
        time (after its server failed it). The first attempt's record is never written."""
        for spec in fields(self):
            if spec.name == "request":
                continue
            if spec.default_factory is not MISSING:
                setattr(self, spec.name, spec.default_factory())
            else:
                setattr(self, spec.name, spec.default)

    def finish(self, status: Status, reason: str | None = None) -> None:
        """Set how the episode ended; the first call wins (a later close error cannot rewrite it)."""
        if self.status == "running":
            self.status = status
            self.reason = reason

    def to_dict(self, form: RecordForm = "lean") -> dict[str, Any]:
        """The JSON-ready record written to ``completions.jsonl`` (`trajectory_record`)."""
        return trajectory_record(self, form)


def _stated(trajectory: Trajectory, key: str, kind: type) -> Any:
    """The `kind` value of `key` in the last step's info or in the observation metadata it
    carries (the frame's or the observation's), else None."""
    if not trajectory.steps:
        return None
    info = trajectory.steps[-1].info
    for where in (info, info.get("metadata"), info.get("frame_metadata")):
        if isinstance(where, dict) and isinstance(where.get(key), kind):
            return where[key]
    return None


def stated_success(trajectory: Trajectory) -> bool | None:
    """Whether the episode succeeded, as the environment states it: a boolean ``success`` in
    the last step's info or in the observation metadata it carries; None when it says nothing
    (a positive reward is not taken to mean success)."""
    stated = _stated(trajectory, "success", bool)
    return None if stated is None else bool(stated)


#: Longest environment's reason kept in a record's ``reason`` (the whole text stays in its
#: ``final_observation``).
_REASON_CHARS = 240


def done_reason(trajectory: Trajectory) -> str:
    """Why the environment ended the episode, in words: "environment signalled done", and what
    it said ended it when its last step states that (a string ``reason`` beside ``success``,
    as the TextArena server puts it: "…: Congratulations! You guessed the correct number."),
    on one line of at most `_REASON_CHARS` characters."""
    said = _stated(trajectory, "reason", str) if trajectory.steps and trajectory.steps[-1].done else None
    words = " ".join(said.split()) if said else ""
    if not words:
        return "environment signalled done"
    if len(words) > _REASON_CHARS:
        words = words[: _REASON_CHARS - 1] + "…"
    return f"environment signalled done: {words}"


# Keys of rollout_infos that the record already holds elsewhere: never copied into ``infos``.
_NOT_INFOS = frozenset({"total_reward", "step_rewards", REWARD_PARTS, TOKENS})


class RecordError(ValueError):
    """A JSON object is not a ``envsdk.completions/1`` record."""


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a JSON number a float holds and is finite, else None (a
    bool, a string, NaN, an infinity, an int of more digits than any float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of non-empty `values`: always one of the values, so a 0/1
    reward has a 0/1 p90, never an interpolated 0.5."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation of non-empty finite `values`, finite however large
    they are (a sum of rewards near the largest float overflows to infinity): taken over the
    values scaled by the largest magnitude, then scaled back."""
    scale = max(map(abs, values)) or 1.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / len(scaled)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in scaled) / len(scaled))
    return mean * scale, std * scale


def number_text(value: float, places: int = 3) -> str:
    """`value` with `places` decimals, or in exponent form from a million on: a reward near the
    largest float is 309 digits written out."""
    return f"{value:.{places}f}" if abs(value) < 1e6 else f"{value:.{places}g}"


def success_text(successes: int, stated: int, episodes: int) -> str:
    """How a success rate is reported (rollout summary, ``envsdk report``): `successes` over the
    `stated` episodes that state success, with how many of the `episodes` do not; "n/a" when
    none does (an unstated success is not a failure)."""
    if not stated:
        return "n/a (neither the env nor the scheduler states success)"
    unstated = f"; {episodes - stated} not stated" if stated < episodes else ""
    return f"{successes / stated:.1%} ({successes}/{stated}{unstated})"


#: How an episode's value of a reward part can be made from its step values, in the order a
#: label prefers them where the values fit several (all zero, or one step): a mean or a last
#: value reads as a score, a sum as a count.
PART_BASES = ("mean", "last", "sum")


def part_basis(value: float | None, steps: Sequence[float | None]) -> tuple[frozenset[str], int]:
    """How an episode's `value` of a reward part is made from its per-step values `steps`: the
    `PART_BASES` that give it (several may, e.g. for one step) and how many steps evaluated the
    part. An empty set: none gives it (an episode-level part, such as a final score)."""
    done = [v for v in steps if v is not None]
    if value is None or not done:
        return frozenset(), len(done)
    total = math.fsum(done)
    made = {"sum": total, "mean": total / len(done), "last": done[-1]}
    return frozenset(how for how, number in made.items() if math.isclose(value, number, rel_tol=1e-9, abs_tol=1e-12)), len(done)


def basis_labels(bases: Mapping[str, Iterable[tuple[frozenset[str], int]]]) -> dict[str, str]:
    """What each reward part's episode values are, from every episode's `part_basis` of it:
    ``"summed over 3 steps"``, ``"mean over 1-8 steps"``, ``"last of 2-5 steps"``, ``"1 step per
    episode"``, or ``"per episode"`` when no one rule makes every episode's value from its steps.
    A summary prints it beside the part, so that a part summed over steps is not read as a 0/1
    score. Where a part's values fit several rules (all zero), the rule the run's other parts
    show alone is taken (one scheduler makes them all alike), else `PART_BASES`' order."""
    found: dict[str, tuple[frozenset[str], int, int]] = {}
    for name, per_episode in bases.items():
        # An episode that ended before its first step has no step values: it says nothing of the rule.
        stepped = [(fits, n) for fits, n in per_episode if n]
        if not stepped:
            continue
        common = frozenset(PART_BASES)
        for fits, _ in stepped:
            common &= fits
        found[name] = (common, min(n for _, n in stepped), max(n for _, n in stepped))
    shown = {next(iter(common)) for common, _, _ in found.values() if len(common) == 1}
    labels: dict[str, str] = {}
    for name in bases:
        if name not in found or not found[name][0]:
            labels[name] = "per episode"
            continue
        common, low, high = found[name]
        how = next((b for b in PART_BASES if b in common and b in shown), None) or next(b for b in PART_BASES if b in common)
        if high == 1:
            labels[name] = "1 step per episode"
            continue
        steps = f"{low} steps" if low == high else f"{low}-{high} steps"
        labels[name] = {"sum": f"summed over {steps}", "mean": f"mean over {steps}", "last": f"last of {steps}"}[how]
    return labels


def _with_reported(timings: dict[str, float], steps: Sequence[StepRecord]) -> dict[str, float]:
    """`timings` and each timing the environment reported on `steps` (in a step info's, or its
    observation metadata's, ``timings``), summed over the episode; a name `timings` already
    has keeps its value."""
    reported: dict[str, float] = {}
    for step in steps:
        info = step.info
        for where in (info, info.get("metadata"), info.get("frame_metadata")):
            said = where.get(TIMINGS) if isinstance(where, dict) else None
            if isinstance(said, dict):
                for name, value in said.items():
                    number = finite_number(value)
                    if number is not None:
                        reported[str(name)] = reported.get(str(name), 0.0) + number
                break
    return {**reported, **timings} if reported else timings


def episode_components(trajectory: Trajectory) -> dict[str, float]:
    """The episode values of the trajectory's reward components: the numbers its scheduler put
    in ``rollout_infos["reward_parts"]`` (a name → number mapping)."""
    declared = trajectory.rollout_infos.get(REWARD_PARTS)
    if not isinstance(declared, dict):
        return {}
    return {str(k): v for k, v in ((k, finite_number(v)) for k, v in declared.items()) if v is not None}


def trajectory_record(trajectory: Trajectory, form: RecordForm = "lean") -> dict[str, Any]:
    """The JSON-ready record of `trajectory` in `form` (see the module docstring)."""
    values = episode_components(trajectory)
    step_parts = list(map(_COMPONENTS, trajectory.steps))
    per_step: dict[str, list[float | None]] = {}
    # Every name a step has, in the order first seen; when the scheduler declares its components,
    # a step's other numbers (a running total) are not components.
    for name in dict.fromkeys(chain.from_iterable(step_parts)):
        if not values or name in values:
            column = list(map(methodcaller("get", name), step_parts))
            # Finite floats throughout (the usual case) are kept as they are.
            per_step[name] = column if all_finite_floats(column) else list(map(finite_number, column))
    components = {
        name: {"value": values.get(name), "steps": per_step.get(name, [])}
        for name in [*values, *(n for n in per_step if n not in values)]
    }
    infos = {k: v for k, v in trajectory.rollout_infos.items() if k not in _NOT_INFOS and k not in values}
    env_config = trajectory.env_config
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "uuid": trajectory.uuid,
        "env": env_config.get("name"),
        "seed": trajectory.seed,
        "env_config": env_config,
        "status": trajectory.status,
        "reason": trajectory.reason,
        "truncated": trajectory.truncated,
        "error_kind": trajectory.error_kind,
        "server": trajectory.server,
        "success": trajectory.success,
        "turns": trajectory.turns,
        "total_reward": trajectory.total_reward,
        "step_rewards": trajectory.step_rewards,
        "reward_components": components,
        "infos": infos,
        "messages": trajectory.messages,
        "timings": _with_reported(trajectory.timings, trajectory.steps),
        "final_observation": _final_observation(trajectory),
    }
    tag = trajectory.request.data_dict.get(EVAL_KEY)
    if isinstance(tag, dict):
        record[EVAL_KEY] = tag
    if TOKENS in trajectory.rollout_infos:
        record[TOKENS] = trajectory.rollout_infos[TOKENS]
    if form == "full":
        record["steps"] = [
            {
                "turn": s.turn,
                "action": s.action,
                "observation": s.observation,
                "reward": s.reward,
                "done": s.done,
                "info": s.info,
                "duration_s": s.duration_s,
            }
            for s in trajectory.steps
        ]
        record["reset_info"] = trajectory.reset_info
    return record


def _final_observation(trajectory: Trajectory) -> Any:
    """The observation of the last step when the environment ended the episode there."""
    last = trajectory.steps[-1] if trajectory.steps else None
    return last.observation if last is not None and last.done else None


def check_record(record: Any, where: str) -> dict[str, Any]:
    """`record` if it is a ``envsdk.completions/1`` record, else `RecordError` naming `where`."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected a JSON object (a trajectory record), got {type(record).__name__}")
    schema = record.get("schema")
    if schema != SCHEMA:
        raise RecordError(
            f"{where}: schema is {json.dumps(schema)}, this envsdk reads {SCHEMA!r} (records written "
            "by `envsdk rollout --out`); re-run the rollout with this version"
        )
    if finite_number(record.get("total_reward")) is None:
        raise RecordError(f"{where}: no numeric 'total_reward'")
    success = record.get("success")
    if success is not None and not isinstance(success, bool):
        # Counted as it reads ("false" is true to Python), it made a failed episode a pass.
        raise RecordError(f"{where}: 'success' must be true, false or null, got {json.dumps(success)[:80]}")
    components = record.get("reward_components")
    if not isinstance(components, dict) or any(
        not isinstance(c, dict) or "value" not in c or not isinstance(c.get("steps"), list)
        for c in components.values()
    ):
        raise RecordError(f"{where}: 'reward_components' must map names to {{'value': number, 'steps': [...]}}")
    return record


#: The fields of a record that a run's summary reads (`envsdk.evaluate.summarize_groups`).
SUMMARY_FIELDS = ("uuid", EVAL_KEY, "total_reward", "success")


def summary_facts(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of `record` that a run's summary reads (`SUMMARY_FIELDS`, those it has)."""
    return {name: record[name] for name in SUMMARY_FIELDS if name in record}


@dataclass
class RecordsWritten:
    """What a `TrajectoryWriter` wrote to ``path``: its records lie between byte offsets ``start``
    and ``end``, and ``facts`` holds the fields a run's summary reads of each of them
    (`envsdk.records.summary_facts`), or is None when one of them is not a valid record."""

    path: Path
    start: int
    end: int
    facts: list[dict[str, Any]] | None = field(default_factory=list)


class _Prefix(io.RawIOBase):
    """The first `size` bytes of the unbuffered binary file `raw` (closed with it)."""

    def __init__(self, raw: io.FileIO, size: int) -> None:
        self._raw, self._left = raw, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        with memoryview(buffer) as view:
            got = self._raw.readinto(view[: min(len(view), self._left)]) or 0
        self._left -= got
        return got

    def close(self) -> None:
        self._raw.close()
        super().close()


def record_bytes(record: Any) -> bytes:
    """`record` as one line of JSON in UTF-8, ending in a newline: compact, its text as is (not
    ASCII escapes), NaN and infinities as Python's json writes them, a value JSON has no form for
    as pydantic gives it (a set as a list, an enum as its value) or else as its str(). Encoded
    by pydantic-core, in a quarter of the time json takes for a Sudoku record, most of it the
    conversation's text. A string holding a lone surrogate (what a "\\ud800" escape in a peer's
    JSON decodes to) cannot be UTF-8: the line then escapes it as JSON does (json's own
    encoding, ASCII), so the record is written, and read back the same, instead of failing to
    be written."""
    try:
        return to_json(record, fallback=str, inf_nan_mode="constants") + b"\n"
    except PydanticSerializationError:
        return (json.dumps(record, default=str) + "\n").encode()


def record_line(record: Any) -> str:
    """`record_bytes` as text."""
    return record_bytes(record).decode()


def read_jsonl(path: str | Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """The JSON value of each non-blank line of `path`, with where it is (``file:line``).
    Raises `error` naming the file for a missing file, and the line for a line that is not JSON."""
    for where, _, value in read_jsonl_lines(path, error):
        yield where, value


def read_jsonl_lines(
    path: str | Path, error: type[Exception], hint: str = "", *, stop: int | None = None, first_hint: str | None = None
) -> Iterator[tuple[str, str, Any]]:
    """`read_jsonl` that also gives each line as read (ending in a newline), for a caller that
    writes lines back unchanged; `hint` is added to the error for a line that is not JSON, or
    `first_hint` when given and that line is the first and not cut off (the file is something
    else). With `stop`, only the file's first `stop` bytes are read."""
    source = Path(path)
    if not source.is_file():
        raise error(f"{source}: {'not a file' if source.exists() else 'no such file'}")
    lines = jsonl_lines(source, error, stop=stop)
    for number, line in lines:
        where = f"{source}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            what = f"not JSON ({exc.msg}: column {exc.colno})"
            said = first_hint if number == 1 and first_hint is not None else hint
            if next(lines, None) is None and ends_unfinished(source, stop):
                what = f"the last line is cut off mid-record, {what}: what wrote it was stopped, or still writes"
                said = hint
            raise error(f"{where}: {what}{said}") from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise error(f"{where}: not a record this envsdk reads ({' '.join(str(exc).split())[:200]})") from None
        except RecursionError:  # arrays or objects nested deeper than the parser goes
            raise error(f"{where}: not a record this envsdk reads (JSON nested too deep)") from None
        yield where, line, value


def ends_unfinished(path: Path, stop: int | None = None) -> bool:
    """Whether the regular file `path` (its first `stop` bytes) ends in a line without its newline."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END) if stop is None else stop
        if end == 0:
            return False
        handle.seek(end - 1)
        return handle.read(1) != b"\n"


def jsonl_lines(path: Path, error: type[Exception] = ValueError, *, stop: int | None = None) -> Iterator[tuple[int, str]]:
    """The non-blank lines of `path` (of its first `stop` bytes) with their line numbers, read
    one at a time and not parsed: each ends in a newline ("\\r\\n" becomes "\\n"). Lines end at
    "\\n" alone, as JSON Lines says, so a "\\r" or U+2028 inside one does not cut it. `error`
    names a line that is not UTF-8 text."""
    handle: IO[bytes]
    if stop is None:
        handle = path.open("rb")
    else:  # read as it goes, not the `stop` bytes at once: they may be most of a large file
        handle = io.BufferedReader(_Prefix(path.open("rb", buffering=0), stop))
    with handle:
        for number, raw in enumerate(handle, start=1):
            line = text_line(raw, f"{path}:{number}", error)
            if line.strip():
                yield number, line


def text_line(raw: bytes, where: str, error: type[Exception]) -> str:
    """`raw`, one line of a JSON Lines file, as text ending in a newline ("\\r\\n" read as
    "\\n"; one added to a last line without it). `error` names `where` for bytes that are not
    UTF-8."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start + 1} of the line)") from None
    if line.endswith("\r\n"):
        return line[:-2] + "\n"
    return line if line.endswith("\n") else line + "\n"


#: How the temporary files of `write_atomically` end (``.<name>.<random><suffix>`` beside the file).
TEMPORARY_SUFFIX = ".envsdk-tmp"


def write_atomically(path: Path, text: str | Iterable[str]) -> None:
    """Replace `path` with `text` (a string, or pieces written one after another) so that a
    reader sees the old file or the new one, never part of one: the text goes to a synced
    temporary file beside it, which is renamed over it. A symbolic link is written through:
    the file it points at is replaced, and the link stays; but a link to what is not a regular
    file (``/dev/null``, a pipe, a folder) is itself replaced, and what it leads to left alone."""
    if path.is_symlink():
        real = Path(os.path.realpath(path))
        if real.is_file() or not os.path.lexists(real):
            path = real
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    try:
        # The file keeps its permissions (a new one gets 0644), not mkstemp's 0600.
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o644
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if isinstance(text, str):
                handle.write(text)
            else:
                handle.writelines(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(held: Path, names: Sequence[str]) -> int:
    """Remove the temporary files `write_atomically` left beside `held` for `names` (files in its
    folder) when a process was killed while it wrote them; how many were removed. Only for a
    caller holding `held` (`hold_records`): nothing else writes those names then."""
    # A name that is a symbolic link had its temporary files beside the file it points at.
    by_folder: dict[str, set[str]] = {}
    for name in names:
        for place in {held.parent / name, Path(os.path.realpath(held.parent / name))}:
            by_folder.setdefault(str(place.parent), set()).add(place.name)
    removed = 0
    for folder, named in by_folder.items():
        made = re.compile("|".join(rf"\.{re.escape(name)}\.\w+{re.escape(TEMPORARY_SUFFIX)}" for name in sorted(named)))
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if made.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
    return removed


class RecordsBusy(ValueError):
    """Another process is writing the records file this one was asked to write."""


class LockFileError(ValueError):
    """A records file, or the lock file beside it, is not something this package may write: a
    folder or device given as the records file, or a link, folder, pipe or foreign file where
    the lock goes. Nothing is written through it, and nothing the package did not make is
    removed."""


@dataclass
class _Hold:
    lock_fd: int  # the lock file, flocked; -1 where the filesystem has no locks
    data_fd: int  # the records file itself, flocked; -1 until it exists
    count: int = 0


# Records files this process holds, by their lock file's path.
_HELD: dict[str, _Hold] = {}
_HELD_LOCK = threading.Lock()
# What `flock` answers on a filesystem without locks (some network and FUSE ones): the file is
# then written unheld, with a warning, rather than not at all.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
# What a lock file of this package holds: nothing yet, or its holder's pid and a newline.
_LOCK_TEXT = re.compile(rb"\d{0,20}\n?")


def lock_path(path: str | Path) -> Path:
    """The lock file of a records file and of the run files named after it (``<stem>.run.toml``,
    ``<stem>.eval.json``): ``<stem>.envsdk.lock`` in the same folder (its real path)."""
    path = Path(path)
    return Path(os.path.realpath(path.parent)) / f"{path.stem}.envsdk.lock"


@contextlib.contextmanager
def hold_records(path: str | Path) -> Iterator[None]:
    """Hold the records file `path` for this process while in the block: a second process that
    asks for it, by any of its names, gets `RecordsBusy` (naming the holder's pid) instead of
    appending beside this one, compacting the file under it or truncating it.

    Two exclusive ``flock`` locks: on ``<stem>.envsdk.lock`` beside the file (which also guards
    the run files named after the stem; removed when the hold ends), and on the records file
    itself once it exists (a symbolic or hard link to it is the same file). The kernel drops both
    when the process ends, however it ends: a SIGKILL leaves only a stale lock file that the next
    holder takes over. Within one process holds nest (a run holds its file, then its writer
    does); `rehold` locks the file again after it was replaced. `LockFileError` for a `path` that
    exists and is not a regular file, or a lock file that is not one of this package's."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise LockFileError(f"{path} is {'a folder' if os.path.isdir(path) else 'not a regular file'}; give a file to write")
    lock = lock_path(path)
    key = str(lock)
    with _HELD_LOCK:
        hold = _HELD.get(key)
        if hold is None:
            lock.parent.mkdir(parents=True, exist_ok=True)
            hold = _Hold(_take(lock, path), -1)
            try:
                _hold_data(hold, path)
            except BaseException:
                _release(hold, lock)
                raise
            _HELD[key] = hold
        else:
            _hold_data(hold, path)
        hold.count += 1
    try:
        yield
    finally:
        with _HELD_LOCK:
            hold.count -= 1
            if hold.count == 0:
                del _HELD[key]
                _release(hold, lock)


def rehold(path: str | Path) -> None:
    """Lock the records file `path` again after it was replaced by a new file (a compaction
    renames one over it), when this process holds it; else nothing."""
    with _HELD_LOCK:
        hold = _HELD.get(str(lock_path(path)))
        if hold is not None:
            _hold_data(hold, path)


def _release(hold: _Hold, lock: Path) -> None:
    if hold.data_fd >= 0:
        os.close(hold.data_fd)
    if hold.lock_fd >= 0:
        # Removed while still locked, and only while its name still leads to it (the folder may
        # have been moved, and another run's lock file be there now): a process that opened it
        # meanwhile finds, once it has the lock, that the name leads elsewhere, and tries again.
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(hold.lock_fd), os.lstat(lock)):
                os.unlink(lock)
        os.close(hold.lock_fd)


def _busy(path: str | Path, fd: int, how: str = "") -> RecordsBusy:
    return RecordsBusy(f"{path} is being written by another process (pid {_holder(fd)}){how}; wait for it to end or stop it")


def _open_lock(lock: Path) -> int:
    """`lock` opened for reading and writing: made when absent (and only then), else taken over
    when it is a file this package made (empty, or a pid). Never through a link, and never
    blocked by a pipe someone put there."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    while True:
        try:
            try:
                fd = os.open(lock, flags)
            except FileNotFoundError:
                try:
                    return os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:  # made by another process just now
                    continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                what = "a symbolic link" if exc.errno == errno.ELOOP else "a folder"
                raise LockFileError(f"{lock} is {what}, not a lock file of this package; remove it") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LockFileError(f"{lock} is not a regular file, not a lock file of this package; remove it")
            if not _LOCK_TEXT.fullmatch(os.pread(fd, 64, 0)):
                raise LockFileError(
                    f"{lock} is not a lock file of this package (it holds something else): move it, or write to"
                    " another file"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd


def _take(lock: Path, path: str | Path) -> int:
    """The locked descriptor of `lock`, whose name leads to it (-1: the filesystem has no locks);
    `RecordsBusy` when another process holds it."""
    while True:
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = _busy(path, fd)
            os.close(fd)
            raise busy from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            logging.getLogger("envsdk").warning(
                "%s: this filesystem has no file locks (%s); another process could write the same file", path, exc.strerror
            )
            with contextlib.suppress(OSError):
                os.unlink(lock)
            return -1
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(lock))
        except FileNotFoundError:  # its holder removed it between our open and our lock
            same = False
        if same:
            # Emptied first: a process killed between the two leaves a file the next one takes over.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def _hold_data(hold: _Hold, path: str | Path) -> None:
    """Lock the records file itself when it exists and its current file is not locked yet."""
    if hold.lock_fd < 0:
        return
    try:
        # Opened for writing, which it is held for (a file this process may not write is refused
        # here, before anything is made; and NFS grants exclusive locks only to writers).
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        if hold.data_fd >= 0 and os.path.samestat(os.fstat(hold.data_fd), os.fstat(fd)):
            os.close(fd)
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        busy = _busy(path, fd, " under another name for the same file")
        os.close(fd)
        raise busy from None
    except BaseException:
        os.close(fd)
        raise
    if hold.data_fd >= 0:
        os.close(hold.data_fd)
    hold.data_fd = fd


def _holder(fd: int) -> str:
    """The pid holding an flock on `fd`'s file: from the kernel's list of locks (Linux), else
    from a lock file's text (the holder writes its pid there), else "unknown"."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError):
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
                    return fields[4]
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace")
    except OSError:  # the records file is held open for writing only
        return "unknown"
    return text.strip() if text.endswith("\n") and text.strip().isdigit() else "unknown"
