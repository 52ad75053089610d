"""Evaluation runs: groups of rollouts per example, pass@k, resumable runs and offline re-scoring.

* **Groups.** ``envsdk rollout --rollouts-per-example R`` plays every example (a seed, or a
  dataset row) R times, as GRPO's ``num_generations`` does. Each record carries ``eval``:
  ``{"example", "index", "run", "attempt"}`` — which example (a dataset row's uuid, the problem a
  seed plays where its request names it, ``HumanEval/7``, else ``seed-N``), which of its R
  rollouts, and which run and attempt wrote it. `summarize_groups` gives per-example and overall
  pass@k for every k ≤ R (the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` over n rollouts
  with c successes), stated with what one rollout is where the run said (``"1 attempt per
  sample, no test feedback"``), the mean reward of each example and its spread, and the share
  of groups whose rewards do not vary (a group GRPO learns nothing from).
* **Resume.** ``--resume`` continues a run into its existing ``completions.jsonl``: a torn last
  line (the process was killed while writing it) is cut off, every (example, index) with a
  record is skipped, and one whose record says ``status: error`` (a server went away) is played
  again — its old record is moved to ``<stem>.replaced.jsonl`` so the file holds each pair
  exactly once. The options come from the run's ``<stem>.run.toml`` (`envsdk.runfile`); an
  option that would change what the run plays is refused. A run holds its file from planning to
  summary (`envsdk.records.hold_records`), so a second run into it is refused, not interleaved.
* **Re-scoring.** ``envsdk rescore completions.jsonl --score file.py:func`` (or ``--weights
  name=w,…`` over the recorded reward components) recomputes every record's reward and success
  without playing again, writes the re-scored records, and prints the same pass@k summary.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import itertools
import json
import math
import numbers
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

from envsdk._process import print_err, print_out, sigterm_interrupts
from envsdk.env import RolloutRequest
from envsdk.records import (
    EVAL_KEY,
    FORMAT_PENALTY_INFO,
    LockFileError,
    RecordError,
    RecordsBusy,
    RecordsWritten,
    check_record,
    ends_unfinished,
    finite_number,
    hold_records,
    jsonl_lines,
    mean_and_std,
    number_text,
    read_jsonl_lines,
    record_line,
    rehold,
    remove_stale_temporaries,
    summary_facts,
    text_line,
    write_atomically,
)
from envsdk.runfile import (
    RUN_TABLE,
    RunFileError,
    options_digest,
    options_from,
    parse_with,
    read_run_file,
    run_file_path,
    run_file_text,
    written_options,
)

__all__ = [
    "EVAL_KEY",
    "EvalError",
    "ScoreFailedError",
    "pass_at_k",
    "GroupStats",
    "EvalSummary",
    "summarize_groups",
    "read_records",
    "iter_records",
    "recover_torn_tail",
    "RunPlan",
    "add_eval_arguments",
    "resolve_run_options",
    "plan_run",
    "check_rollouts",
    "MAX_ROLLOUTS",
    "PlannedRun",
    "planned_run",
    "finish_run",
    "summary_path",
    "rescore_records",
    "format_penalty_of",
    "add_rescore_parser",
    "rescore_command",
]

# Options a resumed run may change: how it runs, not what it plays (``out`` may be spelled another
# way from another folder: it names the file being resumed).
_CHANGEABLE_ON_RESUME = frozenset({
    "concurrency", "no_progress", "base_url", "api_base", "external_plugins", "out", "print_samples",
})
# Two rewards closer than this are the same reward (a group with only such rewards has no variance).
_SAME_REWARD = 1e-9
# The per-example rows printed in a summary; the report page lists them all.
_PRINTED_EXAMPLES = 20
#: The most rollouts one run plays: every one is planned (a request each) before the first plays.
MAX_ROLLOUTS = 1_000_000


class EvalError(ValueError):
    """An evaluation run or file cannot be used as asked; the message says what to change."""


class ScoreFailedError(EvalError):
    """A re-scoring function raised on a record (a failure of that function, not a usage error)."""


# ---------------------------------------------------------------- pass@k and groups


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `c` are correct: the chance that
    at least one of k samples drawn without replacement is correct, ``1 - C(n-c, k) / C(n, k)``.
    Exact in integers until the last division."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class GroupStats:
    """One example's rollouts: how many, how many succeeded, their rewards' mean and spread
    (population standard deviation), and pass@k for each k of the summary's up to `n`."""

    example: str
    n: int
    correct: int
    mean_reward: float
    reward_std: float
    pass_at: dict[int, float]

    @property
    def zero_variance(self) -> bool:
        return self.reward_std <= _SAME_REWARD


@dataclass(frozen=True)
class EvalSummary:
    """Groups of a run and their aggregates: overall pass@k (the mean over the groups) for each k
    that every group reaches, mean reward, and the share of groups with zero reward variance."""

    groups: list[GroupStats]
    pass_at: dict[int, float]
    mean_reward: float
    zero_variance_share: float
    records: int
    unstated: int = 0
    #: Records whose (example, index) an earlier record already had: files put together.
    repeated: int = 0
    #: What the run file beside the records planned, (examples, rollouts per example), when known.
    planned: tuple[int, int] | None = None
    #: What one rollout of the run is, as a pass@k sample (``"1 attempt per sample, no test
    #: feedback"``), when its run file says (`PlannedRun.sample`); pass@k is then stated with it.
    sample: str | None = None

    @property
    def ks(self) -> list[int]:
        """The k of the per-example pass@k: every k up to 10, beyond that powers of two and the largest n."""
        return _ks(max(g.n for g in self.groups))

    @property
    def smallest(self) -> int:
        """The fewest rollouts of an example: overall pass@k goes up to this k."""
        return min(g.n for g in self.groups)

    @property
    def success_stated(self) -> bool:
        """Whether any record states success: without one, pass@k is n/a (an unstated success
        is not a failure), not 0."""
        return self.unstated < self.records

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written beside the records (``<stem>.eval.json``); pass@k keys are strings."""
        return {
            "records": self.records,
            "examples": len(self.groups),
            "rollouts_per_example": {"min": self.smallest, "max": max(g.n for g in self.groups)},
            "repeated_pairs": self.repeated,
            "planned": {"examples": self.planned[0], "rollouts_per_example": self.planned[1]} if self.planned else None,
            "pass_at_k": {str(k): v for k, v in self.pass_at.items()} if self.success_stated else None,
            "pass_at_1_stderr": self.pass_at_1_stderr,
            "sample": self.sample,
            "mean_reward": self.mean_reward,
            "zero_variance_share": self.zero_variance_share,
            "success_not_stated": self.unstated,
            "groups": [
                {
                    "example": g.example, "n": g.n, "correct": g.correct, "mean_reward": g.mean_reward,
                    "reward_std": g.reward_std,
                    "pass_at_k": {str(k): v for k, v in g.pass_at.items()} if self.success_stated else None,
                }
                for g in self.groups
            ],
        }

    def pass_line(self) -> str:
        """The overall pass@k line of `render`, with what a sample is when that is known."""
        if not self.success_stated:
            return f"{'pass@k':<16}n/a (no record states success)"
        numbers = "  ".join(f"pass@{k}={v:.3f}" for k, v in self.pass_at.items())
        return f"{'pass@k':<16}{numbers}" + (f" ({self.sample})" if self.sample else "")

    def stderr_line(self) -> str | None:
        """The line under `pass_line` giving pass@1's standard error (`pass_at_1_stderr`), with
        how it is taken; None where there is none."""
        error = self.pass_at_1_stderr
        if error is None:
            return None
        examples = len(self.groups)
        return (
            f"{'pass@1 s.e.':<16}{error:.3f} (standard error over the {examples} examples: the sample standard "
            f"deviation of their pass@1 / sqrt({examples}))"
        )

    @property
    def pass_at_1_stderr(self) -> float | None:
        """The standard error of overall pass@1, a mean over the examples of each one's pass@1
        (c/n): their sample standard deviation over the square root of their number, as
        lm-eval states its metrics' errors. With one rollout per example it is
        ``sqrt(p(1-p)/(E-1))``. None for fewer than two examples, or where no record states
        success."""
        if len(self.groups) < 2 or not self.success_stated:
            return None
        values = [g.pass_at[1] for g in self.groups]
        mean = math.fsum(values) / len(values)
        variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return math.sqrt(variance / len(values))

    def render(self, examples: int = _PRINTED_EXAMPLES) -> str:
        """A plain-text table: the overall numbers, then up to `examples` per-example rows."""
        sizes = sorted({g.n for g in self.groups})
        size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        flat = sum(g.zero_variance for g in self.groups)
        error = self.stderr_line()
        lines = [
            f"{'groups':<16}{len(self.groups)} examples x {size} rollouts ({self.records} records)",
            self.pass_line(),
            *([error] if error else []),
            f"{'mean reward':<16}{number_text(self.mean_reward)}",
            f"{'zero variance':<16}{self.zero_variance_share:.1%} of groups ({flat}/{len(self.groups)}: "
            "every rollout got the same reward)",
        ]
        if self.planned is not None and (len(self.groups), self.records) != (self.planned[0], self.planned[0] * self.planned[1]):
            examples, rollouts = self.planned
            lines.append(
                f"{'':<16}cut short: the run planned {examples} examples x {rollouts} rollouts, the records hold "
                f"{len(self.groups)} examples and {self.records} of {examples * rollouts} rollouts; pass@k is over "
                "those (`envsdk rollout --resume` completes it)"
            )
        if self.repeated:
            lines.append(
                f"{'':<16}{self.repeated} record(s) repeat an (example, index) pair another record has: files of several "
                "runs put together? Each counts in pass@k"
            )
        largest = max(g.n for g in self.groups)
        short = sum(g.n < largest for g in self.groups)
        if short and self.success_stated:
            lines.append(
                f"{'':<16}overall pass@k stops at k={max(self.pass_at)}: {short} of {len(self.groups)} examples have fewer "
                f"than {largest} rollouts (a run cut short: `envsdk rollout --resume` completes it)"
            )
        if self.unstated and self.success_stated:
            lines.append(
                f"{'':<16}{self.unstated} record(s) do not state success (null): pass@k counts them as not "
                "correct; `envsdk rescore` can score them"
            )
        shown = self.groups[:examples]
        if shown:
            ks = self.ks
            width = max(9, *(len(f"pass@{k}") + 1 for k in ks))  # columns apart even for pass@16384
            n_width = max(4, len(str(max(g.n for g in self.groups))) + 1)
            lines += ["", f"{'example':<24}{'n':>{n_width}}{'c':>{n_width}}{'mean':>9}{'std':>9}"
                      + "".join(f"{'pass@' + str(k):>{width}}" for k in ks)]
            for g in shown:
                cells = "".join(
                    f"{g.pass_at[k]:>{width}.3f}" if k in g.pass_at and self.success_stated
                    else f"{'n/a' if k in g.pass_at else '-':>{width}}" for k in ks
                )
                lines.append(f"{g.example[:23]:<24}{g.n:>{n_width}}{g.correct:>{n_width}}"
                             f"{number_text(g.mean_reward):>9}{number_text(g.reward_std):>9}{cells}")
            if len(self.groups) > len(shown):
                lines.append(f"... and {len(self.groups) - len(shown)} more examples (envsdk report lists them all)")
        return "\n".join(lines)


def _ks(largest: int) -> list[int]:
    """Every k up to 10; beyond, the powers of two and the largest."""
    return sorted({*range(1, min(largest, 10) + 1), *(2**i for i in range(largest.bit_length())), largest})


def example_of(record: Mapping[str, Any]) -> tuple[str, int]:
    """(example, rollout index) of a record: its ``eval`` tag, or for a record without one (an
    older file, or one written by another tool) its own uuid as a group of one."""
    tag = record.get(EVAL_KEY)
    if isinstance(tag, dict) and isinstance(tag.get("example"), str) and isinstance(tag.get("index"), int):
        return tag["example"], tag["index"]
    return str(record.get("uuid")), 0


def natural_key(name: str) -> list[tuple[int, int, str]]:
    """Sort key of a name whose runs of digits compare as numbers: ``seed-2`` before ``seed-10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def summarize_groups(records: Iterable[Mapping[str, Any]], planned: PlannedRun | None = None) -> EvalSummary:
    """Group `records` by example (`example_of`) and compute pass@k, mean rewards and spreads.
    A record counts as correct when its ``success`` is true (null, not stated, is not). Raises
    `EvalError` when there are none. `planned` (`planned_run`): what the run set out to play,
    kept when every record is that run's, so the summary can say what is missing and what one
    rollout is (its ``sample``)."""
    grouped: dict[str, list[tuple[int, float, bool]]] = {}
    count = 0
    unstated = 0
    pairs: set[tuple[str, int]] = set()
    repeated = 0
    runs: set[Any] = set()
    for record in records:
        unstated += record.get("success") is None
        example, index = example_of(record)
        repeated += (example, index) in pairs
        pairs.add((example, index))
        tag = record.get(EVAL_KEY)
        runs.add(tag.get("run") if isinstance(tag, dict) else None)
        grouped.setdefault(example, []).append((index, float(record["total_reward"]), bool(record.get("success"))))
        count += 1
    if not grouped:
        raise EvalError("no records to summarize")
    groups: list[GroupStats] = []
    # pass@k for the k the summary shows (`_ks`), not every k up to n: each is a ratio of two
    # binomials of n, and n may be in the tens of thousands.
    ks = _ks(max(map(len, grouped.values())))
    # Examples in natural order (seed-2 before seed-10), not in the order their episodes ended.
    for example, members in sorted(grouped.items(), key=lambda item: natural_key(item[0])):
        members.sort()
        rewards = [r for _, r, _ in members]
        n, correct = len(members), sum(s for _, _, s in members)
        mean, std = mean_and_std(rewards)
        groups.append(GroupStats(example, n, correct, mean, std, {k: pass_at_k(n, correct, k) for k in ks if k <= n}))
    # Only for the k every example reaches: a mean over the groups that have k rollouts would
    # stand for the run while it left out every example a cut-short run played fewer times.
    smallest = min(g.n for g in groups)
    overall = {k: sum(g.pass_at[k] for g in groups) / len(groups) for k in ks if k <= smallest}
    # What the run file planned speaks for the records only when every one is that run's.
    ours = planned if planned is not None and runs == {planned.run} else None
    return EvalSummary(
        groups=groups,
        pass_at=overall,
        mean_reward=math.fsum(g.mean_reward * (g.n / count) for g in groups),
        zero_variance_share=sum(g.zero_variance for g in groups) / len(groups),
        records=count,
        unstated=unstated,
        repeated=repeated,
        planned=(ours.examples, ours.rollouts) if ours is not None else None,
        sample=ours.sample if ours is not None else None,
    )


class PlannedRun(NamedTuple):
    """What a run's file says it set out to play: its id, examples and rollouts per example, and
    what one rollout is as a pass@k sample when the run said (`plan_run`'s `sample`)."""

    run: str
    examples: int
    rollouts: int
    sample: str | None = None


def planned_run(out: str | Path) -> PlannedRun | None:
    """What the run file beside `out` planned, or None when that is not known: no run file, or
    one without an id or without the examples and rollouts its run planned."""
    run_file = run_file_path(out)
    try:
        document = read_run_file(run_file) if run_file.is_file() else {}
    except RunFileError:
        return None
    table = document.get(RUN_TABLE)
    if not isinstance(table, dict):
        return None
    run, examples, rollouts = table.get("id"), table.get("examples"), table.get("rollouts")
    sample = table.get(_SAMPLE)
    if isinstance(run, str) and isinstance(examples, int) and isinstance(rollouts, int):
        return PlannedRun(run, examples, rollouts, sample if isinstance(sample, str) else None)
    return None


# ---------------------------------------------------------------- reading and repairing records


def recover_torn_tail(path: Path) -> int:
    """Cut a last line that was not finished (no newline: the writer died mid-line) off `path`;
    return how many bytes were cut. A complete JSON object missing only its newline gets one."""
    if not path.is_file():
        return 0
    with path.open("rb+") as handle:
        tail = _unfinished_tail(handle)
        if tail is None:
            return 0
        start, whole = tail
        size = handle.seek(0, os.SEEK_END)
        if whole:
            handle.write(b"\n")
            return 0
        handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
        return size - start


def torn_start(path: Path) -> int | None:
    """Where the torn last line of `path` starts (what `recover_torn_tail` would cut), or None."""
    if not path.is_file():
        return None
    with path.open("rb") as handle:
        tail = _unfinished_tail(handle)
    return tail[0] if tail is not None and not tail[1] else None


#: The longest unfinished last line that is read to learn whether it is a whole record missing
#: only its newline; a longer one is cut as torn (its pair is played again), not read into memory.
TAIL_READ_LIMIT = 64 << 20
_TAIL_CHUNK = 1 << 20


def _unfinished_tail(handle: IO[bytes]) -> tuple[int, bool] | None:
    """Where the last line of the open file starts and whether it is a whole JSON value, when it
    lacks its newline; None when the file is empty or ends in one. The file is searched backwards
    a chunk at a time, so a last line of gigabytes is never held (nor one above `TAIL_READ_LIMIT`)."""
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return None
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return None
    start, end = 0, size
    while end > 0:
        begin = max(0, end - _TAIL_CHUNK)
        handle.seek(begin)
        cut = handle.read(end - begin).rfind(b"\n")
        if cut >= 0:
            start = begin + cut + 1
            break
        end = begin
    if size - start > TAIL_READ_LIMIT:
        return start, False
    handle.seek(start)
    try:
        json.loads(handle.read())
    except (ValueError, RecursionError):
        return start, False
    return start, True


def read_records(path: str | Path, *, stop: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The records of a completions file (with `stop`, of its first `stop` bytes) with their raw
    lines; `EvalError` names a line that is not a record (only a torn last line is repaired, by
    `recover_torn_tail`, never a middle one)."""
    return list(iter_records(path, stop=stop))


def iter_records(path: str | Path, *, stop: int | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """`read_records` one record at a time, for a reader that keeps less than every record: a
    run's file holds tens of KB per episode (much more with a model's text and token ids)."""
    lines = read_jsonl_lines(
        path, EvalError, "; `envsdk rollout --resume` repairs a run's torn last line, nothing else", stop=stop,
        first_hint="; not a file of records (`envsdk rollout --out` writes one JSON object a line)",
    )
    for where, line, value in lines:
        try:
            yield line, check_record(value, where)
        except RecordError as exc:
            raise EvalError(str(exc)) from None


def replaced_path(out: Path) -> Path:
    """Where a resume moves the records it plays again: ``<stem>.replaced.jsonl`` beside `out`."""
    return out.with_name(f"{out.stem}.replaced.jsonl")


class _Compacted(NamedTuple):
    done: set[tuple[str, int]]  # the pairs kept
    moved: int  # the records moved aside
    run: str | None  # the run that wrote the records (None: there are none)
    attempt: int  # the latest attempt that wrote one (0: none)
    cut: int  # the bytes of a torn last line to cut off
    repair: Callable[[], None]  # cuts it and moves the records not kept aside


def _compact(path: Path, run: str | None, run_file: Path) -> _Compacted:
    """Decide what a resume repairs: a torn last line to cut (`recover_torn_tail`), one record
    per (example, index) that did not end in an error to keep, the others to move to
    ``<stem>.replaced.jsonl``. `run`: the run the records must all come from (that of
    `run_file`), or None for that of the first record. Nothing is changed until the result's
    ``repair`` is called, once the run is sure to start.

    Raises `EvalError` for a record of another run: a file copied over this one, or written
    through another name, holds pairs this run never played. The file is read once to decide,
    keeping one flag per record, and read again to write each part: never held whole (nor as
    parsed records), as it may be larger than the memory."""
    keep: list[bool] = []
    done: set[tuple[str, int]] = set()
    attempt = 0
    torn = torn_start(path)
    for number, (_, record) in enumerate(iter_records(path, stop=torn), start=1):
        key = example_of(record)
        tag = record.get(EVAL_KEY)
        if not isinstance(tag, dict):
            raise EvalError(
                f"{path}: a record without an 'eval' tag (uuid {record.get('uuid')}); only a run written by "
                "`envsdk rollout` of this version can be resumed"
            )
        if not isinstance(tag.get("run"), str):
            raise EvalError(f"{path}: record {number} (uuid {record.get('uuid')}) has no run id in its 'eval' tag")
        if run is None:
            run = tag["run"]
        elif tag["run"] != run:
            whose = f"run {run}, whose run file is {run_file}" if run_file.is_file() else f"run {run}, as the records before it"
            raise EvalError(
                f"{path}: record {number} (uuid {record.get('uuid')}) was written by run {tag.get('run')}, not by "
                f"{whose}: the file holds another run's records (copied over it, or written through another name); "
                "resume each run in its own --out"
            )
        if isinstance(tag.get("attempt"), int):
            attempt = max(attempt, tag["attempt"])
        kept = key not in done and record.get("status") != "error"
        if kept:
            done.add(key)
        keep.append(kept)
    moved = keep.count(False)
    # The lines already put aside, read now: one that is not text refuses the resume before any repair.
    present = _line_digests(replaced_path(path)) if moved else set()

    def lines(wanted: bool) -> Iterator[str]:  # the records kept (True) or moved (False)
        return (line for (_, line), flag in zip(jsonl_lines(path), keep, strict=True) if flag is wanted)

    def repair() -> None:
        recover_torn_tail(path)
        if moved:
            _put_aside(replaced_path(path), lambda: lines(False), present)
            write_atomically(path, lines(True))
            rehold(path)  # a new file was renamed over it: lock that one too

    cut = path.stat().st_size - torn if torn is not None else 0
    return _Compacted(done, moved, run, attempt, cut, repair)


def _put_aside(aside: Path, moving: Callable[[], Iterable[str]], present: set[bytes] | None = None) -> None:
    """Add the lines `moving()` gives to the replaced-records file `aside`, each once. A
    compaction cut short (killed after it put its lines aside, before it rewrote the records
    file) left them there already, and one killed while it wrote them may have left a torn last
    line: it is cut, and the next compaction, which finds the same lines to move, writes only
    those not there yet. The file is replaced whole, so it is never torn again. It grows with
    every resumed run that replays errors, so it is read line by line, keeping a digest per line,
    and `moving()` is read twice (to learn whether anything is new, then to write), never held.
    `present`: those digests, when the caller has read them already."""
    if present is None:
        present = _line_digests(aside)

    def new_lines() -> Iterator[str]:
        seen = set(present)
        for line in moving():
            whole = line if line.endswith("\n") else line + "\n"
            digest = _digest(whole)
            if digest not in seen:
                seen.add(digest)
                yield whole

    if (aside.is_file() and ends_unfinished(aside)) or next(new_lines(), None) is not None:
        write_atomically(aside, itertools.chain(_whole_lines(aside), new_lines()))


def _line_digests(path: Path) -> set[bytes]:
    return {_digest(line) for line in _whole_lines(path)}


def _digest(line: str) -> bytes:
    return hashlib.blake2b(line.encode("utf-8"), digest_size=16).digest()


def _whole_lines(path: Path) -> Iterator[str]:
    """The lines of `path` that end in a newline ("\\r\\n" read as "\\n"; a torn last one is left
    out), one at a time. Nothing where `path` is not a regular file: a pipe or device in its
    place is replaced, never read."""
    if not path.is_file():
        return
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                return
            yield text_line(raw, f"{path}:{number}", EvalError)


# ---------------------------------------------------------------- the rollout command's hooks


class _Batch(Protocol):
    requests: list[RolloutRequest]
    policy: Any


@dataclass
class RunPlan:
    """What this invocation of a run plays: its id and attempt, and how much was already done."""

    run_id: str
    attempt: int
    planned: int
    already_done: int
    replayed_errors: int = 0
    to_play: int = 0
    append: bool = False
    notes: list[str] = field(default_factory=list)
    #: The records file, and the run file to write beside it (`start`).
    out: Path | None = None
    run_file_text: str | None = None
    #: What a resume repairs in the records (a torn last line, records played again), and what
    #: it says of that: done by `repair`.
    repairs: Callable[[], None] | None = None
    repair_notes: list[str] = field(default_factory=list)
    #: Whether the run replaces an earlier run's records (``--overwrite``): they are kept until an
    #: episode of this run ends without an error, when the writer calls `start`.
    replaces: bool = False
    #: Whether `start` was called (for a run that `replaces` another: whether --out holds its records).
    started: bool = False

    def repair(self) -> None:
        """Make the repairs a resume planned (once; nothing for a new run), saying what they were."""
        repairs, self.repairs = self.repairs, None
        if repairs is not None:
            repairs()
            for note in self.repair_notes:
                print(f"envsdk rollout: {note}", file=sys.stderr)

    def start(self) -> None:
        """`repair`, then write the run file beside the records and remove the summary of the
        records as they were. Called once the run is sure to start (after its
        pre-flight), or, for a run that `replaces` another, once its first episode without an
        error is written: a command refused before then leaves the run it would replace or
        continue as it was."""
        self.repair()
        self.started = True
        if self.out is None or self.run_file_text is None:
            return
        path = run_file_path(self.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        # The summary of the records as they were: a new run replaces them, a resume changes
        # them (records moved aside, pairs played); the run's end writes it again.
        summary_path(self.out).unlink(missing_ok=True)
        if self.replaces:  # the records the replaced run put aside went with it
            replaced_path(self.out).unlink(missing_ok=True)
        write_atomically(path, self.run_file_text)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--rollouts-per-example``, ``--resume``, ``--overwrite``, ``--config`` and ``--tokens`` to the
    ``rollout`` parser (and keep the parser for `resolve_run_options`)."""
    parser.add_argument(
        "--rollouts-per-example", type=int, default=1, metavar="R",
        help="play every example (seed or dataset row) R times and report pass@k for k <= R (default 1)",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="continue the run in --out: skip what has a record, replay what is missing or ended in an error",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace the records of an earlier run in --out (without it, or --resume, a non-empty --out is refused)",
    )
    parser.add_argument(
        "--config", default=None, metavar="RUN.toml",
        help="read options from a TOML file (command-line options win); every run writes its resolved "
        "options to <out stem>.run.toml",
    )
    parser.add_argument(
        "--tokens", action="store_true",
        help="record each turn's token ids and logprobs where the policy gives them (transformers always; "
        "an OpenAI-compatible server that returns them, as vLLM does)",
    )
    parser.set_defaults(rollout_parser=parser)


def _argv(args: argparse.Namespace) -> list[str]:
    line = list(getattr(args, "command_line", None) or sys.argv[1:])
    return line[1:] if line and line[0] == "rollout" else line


def resolve_run_options(args: argparse.Namespace) -> argparse.Namespace:
    """The options of this run: the resumed run's ``.run.toml`` (with ``--resume``), then
    ``--config``'s file, then the command line, each winning over the one before.

    Raises `EvalError` when a resumed run would play something else (a different seed, policy,
    group size…) than the run it continues."""
    parser: argparse.ArgumentParser | None = getattr(args, "rollout_parser", None)
    if parser is None or (not args.config and not args.resume):
        return args
    base: dict[str, Any] = {}
    stored: dict[str, Any] | None = None
    argv = _argv(args)
    try:
        if args.resume:
            out = args.out
            if args.config and out == parser.get_default("out"):
                # --out given only in the config file: read it from there first.
                out = options_from(read_run_file(args.config), parser, args.config).get("out", out)
            run_file = run_file_path(out) if out else None
            if run_file is not None and run_file.is_file():
                stored = options_from(read_run_file(run_file), parser, str(run_file))
                base.update(stored)
        if args.config:
            base.update(options_from(read_run_file(args.config), parser, args.config))
    except RunFileError as exc:
        raise EvalError(str(exc)) from None
    resolved = parse_with(parser, argv, base)
    resolved.command_line = getattr(args, "command_line", None)
    if args.resume and "--overwrite" not in argv:
        # A run file's `overwrite` is for starting the run it describes, not for continuing it.
        resolved.overwrite = False
    if args.resume and resolved.out and stored is None and resolved.env is None and resolved.dataset is None:
        raise EvalError(
            f"--resume: there is no run to resume at {resolved.out} (no {run_file_path(resolved.out)}); "
            "start one with --env NAME or --dataset ROWS.jsonl"
        )
    if stored is not None and stored.get("out") and resolved.out:
        # Records files with the same stem (c.jsonl, c.json) share their run files.
        if Path(str(stored["out"])).name != Path(resolved.out).name:
            raise EvalError(
                f"--resume: {run_file_path(resolved.out)} is the run file of {stored['out']}, not of {resolved.out} "
                "(records files with one stem share their run files); resume that one, or write to another --out"
            )
    if stored is not None:
        changed = []
        # Every option, not only those the run file holds: one it lacks was not set by the run
        # (a written file holds every option that was), so giving it now changes what is played.
        for dest in written_options(parser):
            value = getattr(resolved, dest, None)
            if dest in _CHANGEABLE_ON_RESUME:
                continue
            if dest in stored:
                if value != stored[dest]:
                    changed.append(f"--{dest.replace('_', '-')} {value!r} (the run has {stored[dest]!r})")
            elif value is not None and value != parser.get_default(dest):
                changed.append(f"--{dest.replace('_', '-')} {value!r} (not set in the run)")
        if changed:
            what = ", ".join(changed)
            raise EvalError(
                f"--resume continues the run in {resolved.out}, which was started with other options: {what}; "
                "drop those options, or write to a new --out"
            )
    return resolved


def _example_id(request: RolloutRequest, from_dataset: bool) -> str:
    """A dataset row's example is its uuid; a seed's is the name its request carries in
    ``data_dict["eval"]["example"]`` (the problem it plays, e.g. ``HumanEval/7``), else ``seed-N``."""
    if from_dataset:
        return request.uuid
    tag = request.data_dict.get(EVAL_KEY)
    named = tag.get("example") if isinstance(tag, dict) else None
    return named if isinstance(named, str) else f"seed-{request.env_config.get('seed')}"


def _holds_records(out: Path) -> bool:
    return out.is_file() and out.stat().st_size > 0


def _other_records(out: Path) -> Path | None:
    """Another records file whose run file is `out`'s (the same stem: c.jsonl and c.json), when
    it holds records."""
    run_file = run_file_path(out)
    try:
        named = read_run_file(run_file).get("out") if run_file.is_file() else None
    except RunFileError:
        return None
    if not isinstance(named, str) or Path(named).name == out.name:
        return None
    other = out.with_name(Path(named).name)
    return other if _holds_records(other) else None


#: The run table's key for the SHA-256 of the ``--dataset`` file the run began with.
_DATASET_DIGEST = "dataset_sha256"
# The run table's digest of the options that say what the run plays (`options_digest`).
_OPTIONS_DIGEST = "options_sha256"
# The run table's key for what one rollout is as a pass@k sample (`plan_run`'s `sample`).
_SAMPLE = "sample"


def _file_digest(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(1 << 20):  # a dataset may be large: never read whole
            digest.update(chunk)
    return digest.hexdigest()


def check_rollouts(examples_are: str, examples: int, rollouts: int) -> None:
    """Raise `EvalError` when `examples` x `rollouts` is more than `MAX_ROLLOUTS`: a run plans
    a request per rollout before the first plays, so a billion filled the memory instead."""
    if rollouts < 1:
        raise EvalError(f"--rollouts-per-example must be >= 1, got {rollouts}")
    planned = examples * rollouts
    if planned > MAX_ROLLOUTS:
        raise EvalError(
            f"{examples_are} x --rollouts-per-example {rollouts} = {planned} rollouts; one run plays at most "
            f"{MAX_ROLLOUTS} (each is planned before the first plays): split it into several runs, each its own --out"
        )


def plan_run(args: argparse.Namespace, batches: Sequence[_Batch], sample: str | None = None) -> RunPlan:
    """Expand each batch's requests into groups of ``--rollouts-per-example`` tagged rollouts and,
    with ``--resume``, drop those that already have a record; write the run file. Mutates the
    batches' ``requests``. `sample`: what one rollout is as a pass@k sample (``"1 attempt per
    sample, no test feedback"``), kept in the run file for the summary to state with pass@k.

    Raises `EvalError` when a resumed run's records name examples this run does not plan
    (written by an envsdk that named them otherwise): they would be counted beside new ones."""
    rollouts = int(getattr(args, "rollouts_per_example", 1))
    examples = sum(len(b.requests) for b in batches)
    check_rollouts(f"{examples} examples", examples, rollouts)
    if args.resume and getattr(args, "overwrite", False):
        raise EvalError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    out = Path(args.out) if args.out else None
    if out is None and args.resume:
        raise EvalError("--resume continues the run in --out FILE; give --out")
    if out is not None and not args.resume:
        other = _other_records(out)
        if other is not None:
            raise EvalError(
                f"--out {out}: {run_file_path(out)} is the run file of {other}, an earlier run's records with the "
                "same stem (their run files would be replaced); write to another --out"
            )
    if out is not None and not args.resume and not getattr(args, "overwrite", False) and _holds_records(out):
        raise EvalError(
            f"--out {out} holds an earlier run's records: give --resume to continue that run, or --overwrite "
            "to replace it (or write to a new --out)"
        )
    done: set[tuple[str, int]] = set()
    moved = 0
    run_id, attempt = secrets.token_hex(8), 1
    notes: list[str] = []
    repair_notes: list[str] = []
    repairs: Callable[[], None] | None = None
    resuming = bool(args.resume and out is not None and out.is_file())
    dataset = getattr(args, "dataset", None)
    # Read once: a resume checks it against the run file's, and the run file keeps it.
    dataset_digest = _file_digest(dataset) if dataset is not None and out is not None else None
    if out is not None:
        stale = remove_stale_temporaries(out, [out.name, replaced_path(out).name, summary_path(out).name,
                                               run_file_path(out).name])
        if stale:
            notes.append(f"removed {stale} temporary file(s) beside {out} left by a run killed while it wrote")
    parser = getattr(args, "rollout_parser", None)
    if resuming and out is not None:
        run_file = run_file_path(out)
        document = read_run_file(run_file) if run_file.is_file() else {}
        previous = document.get(RUN_TABLE, {})
        named = previous.get("id") if isinstance(previous.get("id"), str) else None
        if named is None and _holds_records(out):
            raise EvalError(
                f"--resume: {out} holds records but {run_file} names no run (it is missing, or has no [run] id): the "
                "options the records were played with cannot be checked; put the run file back, or start a new --out"
            )
        # Before the records are repaired or compacted: a refused resume leaves them as they were.
        began = previous.get(_DATASET_DIGEST)
        if dataset_digest is not None and isinstance(began, str) and dataset_digest != began:
            raise EvalError(
                f"--resume: the dataset {dataset} is not the file the run began with (its SHA-256 differs: edited "
                "since, or another file by that name; relative paths are read from the folder you run in); resume "
                "with the rows as they were, or start a new --out"
            )
        began_with = previous.get(_OPTIONS_DIGEST)
        if named is not None and not isinstance(began_with, str) and parser is not None and _holds_records(out):
            raise EvalError(
                f"--resume: {run_file} holds no {_OPTIONS_DIGEST} in its [run] table (deleted by hand, or written by an "
                "earlier envsdk), so an edit of what the run plays cannot be told apart: put the line back, or start a "
                "new --out"
            )
        if isinstance(began_with, str) and parser is not None:
            try:
                now = options_digest(options_from(document, parser, str(run_file)), parser, _CHANGEABLE_ON_RESUME)
            except RunFileError as exc:
                raise EvalError(str(exc)) from None
            if now != began_with:
                raise EvalError(
                    f"--resume: {run_file} was edited since the run began: the options that say what it plays are not "
                    "those its records were played with (only how it runs may change: "
                    f"{', '.join('--' + o.replace('_', '-') for o in sorted(_CHANGEABLE_ON_RESUME))}); put them back, "
                    "or start a new --out"
                )
        compacted = _compact(out, named, run_file)
        repairs = compacted.repair
        if compacted.cut:
            repair_notes.append(f"cut a torn last line ({compacted.cut} bytes) off {out}")
        done, moved = compacted.done, compacted.moved
        if moved:
            repair_notes.append(f"{moved} record(s) that ended in an error (or repeated a pair) moved to "
                                f"{replaced_path(out)}; they are played again")
        run_id = named or compacted.run or run_id
        stated = previous.get("attempt")
        attempt = max(stated if isinstance(stated, int) else 0, compacted.attempt) + 1
    planned = 0
    to_play = 0
    from_dataset = getattr(args, "dataset", None) is not None
    examples_planned: set[str] = set()
    for batch in batches:
        expanded: list[RolloutRequest] = []
        for request in batch.requests:
            example = _example_id(request, from_dataset)
            examples_planned.add(example)
            for index in range(rollouts):
                planned += 1
                if (example, index) in done:
                    continue
                data = copy.deepcopy(request.data_dict)
                data[EVAL_KEY] = {"example": example, "index": index, "run": run_id, "attempt": attempt}
                uuid = example if rollouts == 1 else f"{example}/{index}"
                expanded.append(RolloutRequest(messages=copy.deepcopy(request.messages), data_dict=data, uuid=uuid))
        batch.requests[:] = expanded
        to_play += len(expanded)
    unplanned = sorted({example for example, _ in done} - examples_planned, key=natural_key)
    if unplanned:
        raise EvalError(
            f"--resume: {out} holds records of example(s) this run does not plan ({', '.join(unplanned[:3])}"
            f"{', ...' if len(unplanned) > 3 else ''}): written by an envsdk that named its examples otherwise; "
            "start a new --out"
        )
    if getattr(args, "tokens", False):
        for policy in {id(b.policy): b.policy for b in batches}.values():
            if hasattr(policy, "token_exact"):
                policy.token_exact = True
            else:
                notes.append(f"--tokens: the {type(policy).__name__} policy gives no token ids; its records have none")
    for note in notes:
        print(f"envsdk rollout: {note}", file=sys.stderr)
    text = None
    if out is not None and parser is not None:
        # Made here, so that a value a run file cannot hold is refused before anything plays;
        # written by `RunPlan.start`.
        run: dict[str, Any] = {"id": run_id, "attempt": attempt, "examples": examples, "rollouts": rollouts}
        if dataset_digest is not None:
            run[_DATASET_DIGEST] = dataset_digest
        run[_OPTIONS_DIGEST] = options_digest(vars(args), parser, _CHANGEABLE_ON_RESUME)
        if sample is not None:
            run[_SAMPLE] = sample
        text = run_file_text(args, parser, run)
    return RunPlan(
        run_id, attempt, planned, len(done), moved, to_play, append=resuming, notes=notes, out=out, run_file_text=text,
        repairs=repairs, repair_notes=repair_notes,
        replaces=out is not None and not resuming and out.is_file() and _holds_records(out),
    )


def summary_text(summary: dict[str, Any]) -> str:
    """`summary` (`GroupSummary.to_dict`) as the text of ``<stem>.eval.json``: a JSON object
    with a line per field and per example. Encoded in C: an indented dump is encoded in Python,
    and a run of 64 episodes spent as much on it as on a step of each."""
    fields = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in summary.items() if key != "groups"]
    groups = ",\n".join(f"  {json.dumps(group)}" for group in summary.get("groups", []))
    fields.append(f' "groups": [\n{groups}\n ]' if groups else ' "groups": []')
    return "{\n" + ",\n".join(fields) + "\n}\n"


def summary_path(out: str | Path) -> Path:
    """Where the pass@k summary of the records in `out` is written: ``<stem>.eval.json`` beside it."""
    path = Path(out)
    return path.with_name(f"{path.stem}.eval.json")


def finish_run(out: str | Path | None, written: RecordsWritten | None = None) -> EvalSummary | None:
    """Summarize every record in `out` (all attempts of the run): write ``<stem>.eval.json``
    and return the summary (its `EvalSummary.render` is the printed table); None without records.

    `written` (what this process's writer wrote, `TrajectoryWriter.written`) spares reading its
    records back: only the bytes before them are read, when the file ends where the writer left
    it (nothing else wrote to it since) and every record it wrote was valid."""
    if not out or not Path(out).is_file():
        return None
    path = Path(out)
    if written is not None and written.facts is not None and written.path == path and path.stat().st_size == written.end:
        records = [summary_facts(record) for _, record in iter_records(path, stop=written.start)] if written.start else []
        records += written.facts
    else:
        records = [summary_facts(record) for _, record in iter_records(path)]
    if not records:
        return None
    summary = summarize_groups(records, planned_run(path))
    write_atomically(summary_path(out), summary_text(summary.to_dict()))
    return summary


# ---------------------------------------------------------------- re-scoring


Score = Callable[[dict[str, Any]], Any]
# The most characters of a failed score's message shown (on one line).
_SCORE_ERROR_CHARS = 300


def _parse_weights(text: str) -> dict[str, float]:
    weights: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected name=number[,name=number...], got {part!r}") from None
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"expected name=number[,name=number...], got {part!r}")
        if not math.isfinite(weight):
            raise argparse.ArgumentTypeError(f"{part!r}: a weight is a finite number")
        if name in weights:  # the last would win without a word
            raise argparse.ArgumentTypeError(f"{name!r} is weighted twice; give each component once")
        weights[name] = weight
    return weights


def _as_float(value: float) -> float:
    """`value` as a float; an int beyond any float is the infinity of its sign (then refused as
    a score that is not a finite number, as a NaN or infinite value is)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def format_penalty_of(record: Mapping[str, Any]) -> float:
    """The format penalty `record`'s reward holds: its ``format_penalty`` reward component where
    it has one, else ``infos["format_penalty"]`` (a reply cut under ``--cut-replies penalty``,
    Sudoku's reply with no move); 0.0 for none."""
    parts = record.get("reward_components")
    part = parts.get(FORMAT_PENALTY_INFO) if isinstance(parts, dict) else None
    if isinstance(part, dict):
        value = part.get("value")
    else:
        infos = record.get("infos")
        value = infos.get(FORMAT_PENALTY_INFO) if isinstance(infos, dict) else None
    return finite_number(value) or 0.0


def weighted_score(weights: Mapping[str, float]) -> Score:
    """A score: the weighted sum of a record's reward components (a component the record does not
    have counts 0), plus its format penalty (`format_penalty_of`) at the weight ``format_penalty``
    is given, 1 when it is not named: the penalty is part of the reward, and a weighing that left
    it out would rank a reply cut by the length limit above a move the game rejected. It is a
    reward only: each record's success stays what the record stated."""
    penalty_weight = weights.get(FORMAT_PENALTY_INFO, 1.0)

    def score(record: dict[str, Any]) -> float:
        parts = record.get("reward_components") or {}
        total = 0.0
        for name, weight in weights.items():
            if name == FORMAT_PENALTY_INFO:
                continue
            value = parts.get(name, {}).get("value") if isinstance(parts.get(name), dict) else None
            total += weight * (_as_float(value) if isinstance(value, (int, float)) else 0.0)
        return total + penalty_weight * format_penalty_of(record)

    return score


def _check_weight_names(weights: Mapping[str, float], records: Iterable[Mapping[str, Any]], source: Path) -> None:
    """Raise `EvalError` for a weight whose component no record has: it would count 0 everywhere
    (``format_penalty`` excepted: a record without one has none to weigh); one that names a timing
    the records keep (a latency, such as the coding server's ``time_s``: no part of a reward); and
    for a file of no records, which has nothing to re-score."""
    names: set[str] = set()
    timings: set[str] = set()
    count = 0
    for record in records:
        count += 1
        if isinstance(record.get("reward_components"), dict):
            names.update(map(str, record["reward_components"]))
        if isinstance(record.get("timings"), dict):
            timings.update(map(str, record["timings"]))
    if not count:
        raise EvalError(f"{source}: no records to re-score")
    present = sorted(names)
    missing = [name for name in weights if name not in present and name != FORMAT_PENALTY_INFO]
    latencies = [name for name in missing if name in timings]
    if latencies:
        raise EvalError(
            f"--weights {', '.join(latencies)}: a timing the records keep (seconds), not a reward component; "
            f"weigh the records' components: {', '.join(present) or 'none'}"
        )
    if missing:
        raise EvalError(
            f"--weights {', '.join(missing)}: no record has such a reward component; the records have: "
            f"{', '.join(present) or 'none'}"
        )


def _stated(record: Mapping[str, Any]) -> bool | None:
    success = record.get("success")
    return success if isinstance(success, bool) else None


def rescore_records(records: Iterable[dict[str, Any]], score: Score) -> list[dict[str, Any]]:
    """`rescore_record` of each record."""
    return [rescore_record(record, score) for record in records]


def rescore_record(record: dict[str, Any], score: Score) -> dict[str, Any]:
    """The record with ``total_reward`` and ``success`` from `score(record)`: a number (the
    reward), a bool (success; reward 1 or 0) or a mapping with ``reward`` and optionally
    ``success``. Success is only what the score states (a bool, or the mapping's ``success``);
    otherwise it stays what the record stated: a reward is not a verdict (a lost game with a
    positive shaped reward is still lost). The previous values go into ``rescored_from``."""
    try:
        # What the user's function prints goes to stderr: stdout is the pass@k table's.
        with contextlib.redirect_stdout(sys.stderr):
            result = score(copy.deepcopy(record))
    except (Exception, SystemExit) as exc:  # the user's function: any failure is reported, in one line
        name = getattr(score, "__qualname__", repr(score))
        if isinstance(exc, SystemExit):
            what = f"called sys.exit({exc.code!r})"
        else:
            # One line, and a bounded one: a score that runs tests may raise with all their output.
            text = " ".join(str(exc).split())
            text = text if len(text) <= _SCORE_ERROR_CHARS else f"{text[:_SCORE_ERROR_CHARS]}… ({len(text)} characters)"
            what = f"raised {type(exc).__name__}: {text}"
        # Named as called (a score function is often called `score`: "the score score" said nothing).
        raise ScoreFailedError(f"{name}() on record {record.get('uuid')} {what}") from exc
    try:
        reward, success = _reward_of(record, result)
    except OverflowError:  # an int beyond any float
        raise EvalError(
            f"the score for record {record.get('uuid')} is not a finite number: an int too large for a float"
        ) from None
    if not math.isfinite(reward):
        raise EvalError(f"the score for record {record.get('uuid')} is not a finite number: {reward}")
    new = dict(record)
    new["rescored_from"] = {"total_reward": record["total_reward"], "success": record.get("success")}
    new["total_reward"], new["success"] = reward, success
    return new


def _truth(value: Any) -> bool | None:
    """`value` as a bool when it is one (Python's, or numpy's: a score built on ``np.all``)."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"):
        return bool(value)
    return None


def _reward_of(record: dict[str, Any], result: Any) -> tuple[float, bool | None]:
    """(reward, success) of what a score returned for `record` (see `rescore_record`)."""
    success: bool | None
    said = _truth(result)
    if said is not None:
        reward, success = float(said), said
    elif isinstance(result, numbers.Real):  # numpy's numbers too
        reward, success = float(result), _stated(record)
    elif isinstance(result, Mapping) and isinstance(result.get("reward"), numbers.Real):
        unknown = sorted(map(str, set(result) - {"reward", "success"}))
        if unknown:  # a misspelt "sucess" would be dropped without a word
            raise EvalError(
                f"the score for record {record.get('uuid')} returned the key(s) {', '.join(map(repr, unknown))}; "
                "a mapping holds 'reward' and optionally 'success'"
            )
        reward = float(result["reward"])
        success = _stated(record)
        if "success" in result and result["success"] is None:
            success = None
        elif "success" in result:
            success = _truth(result["success"])
            if success is None:
                raise EvalError(
                    f"the score for record {record.get('uuid')} returned success {result['success']!r}; expected true, "
                    "false or None"
                )
    else:
        raise EvalError(
            f"the score for record {record.get('uuid')} returned {result!r}; expected a number, a bool "
            "or {'reward': number, 'success': bool}"
        )
    return reward, success


def add_rescore_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``rescore`` command (``func``: `rescore_command`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rescore",
        help="recompute rewards and pass@k of saved records with another score, without playing again",
        description="Re-score a completions.jsonl file: each record's reward from --score (a function "
        "of the record) or --weights (over its reward components); write the re-scored records and "
        "print pass@k. Success stays what each record stated, unless --score returns it (a bool, or "
        "{'success': ...}): a positive weighted sum is a reward, not a win.",
    )
    parser.add_argument("completions", help="a completions.jsonl file (envsdk rollout --out)")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--score", metavar="MODULE:FUNC",
        help="'module:func' or 'file.py:func': func(record) -> reward, bool, or {'reward', 'success'}",
    )
    how.add_argument(
        "--weights", type=_parse_weights, metavar="NAME=W,...",
        help="total reward = sum of weight x the record's reward component value, e.g. correct=1,progress=0.2, "
        "plus the record's format penalty (a cut reply's, Sudoku's reply with no move) at weight 1 unless "
        "format_penalty=W weighs it; a name that no record has is refused",
    )
    parser.add_argument("--out", default=None, help="where to write the re-scored records (default: <stem>.rescored.jsonl)")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace --out even when it holds records that are not a re-scoring (a run's own records)",
    )
    parser.set_defaults(func=rescore_command)
    return parser


def _is_rescoring(path: Path) -> bool:
    """Whether `path` holds what `envsdk rescore` writes (its first record says what it was
    re-scored from): the next re-scoring may replace it, a run's own records it may not."""
    try:
        first = next(iter_records(path), None)
    except EvalError:  # not records at all: not ours to replace either
        return False
    return first is not None and isinstance(first[1].get("rescored_from"), dict)


def rescore_command(args: argparse.Namespace) -> int:
    """Run ``envsdk rescore``: 0 when written, 2 (one line on stderr) on unusable input or score,
    1 (one line) when the score function raises."""
    from envsdk.registry import PluginLoadError, import_spec

    source = Path(args.completions)
    try:
        if not source.is_file():  # said first: a folder such as "." or "/" has no name to make --out of
            raise EvalError(f"{source}: {'not a file' if source.exists() else 'no such file'}")
        target = Path(args.out) if args.out else source.with_name(f"{source.stem}.rescored.jsonl")
        if target.resolve() == source.resolve():
            raise EvalError(f"--out {target} is the input file; write the re-scored records elsewhere")
        score: Score = weighted_score(args.weights) if args.weights is not None else import_spec(args.score)
        if not callable(score):
            raise EvalError(f"--score {args.score} is not a function")
        # Every record is read first (a line that is not one is refused before anything is
        # written), then re-scored and written one at a time: the file is never held whole.
        # Both reads stop at the size it had (a run still appending to it adds nothing).
        size = source.stat().st_size
        _check_weight_names(args.weights or {}, (record for _, record in iter_records(source, stop=size)), source)
    except (EvalError, PluginLoadError, ImportError) as exc:
        print_err(f"envsdk rescore: error: {exc}")
        return 2
    facts: list[dict[str, Any]] = []
    penalised = 0

    def rescored() -> Iterator[str]:
        nonlocal penalised
        for _, record in iter_records(source, stop=size):
            new = rescore_record(record, score)
            facts.append(summary_facts(new))
            penalised += format_penalty_of(record) != 0.0
            yield record_line(new)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # A `kill` while it writes ends as Ctrl-C does: the temporary file goes, `target` stays.
        with hold_records(target), sigterm_interrupts(getattr(args, "own_process", False)):
            remove_stale_temporaries(target, [target.name])
            if not getattr(args, "overwrite", False) and _holds_records(target) and not _is_rescoring(target):
                raise EvalError(
                    f"--out {target} holds records that are not a re-scoring (a run's own records would be lost): "
                    "write to another --out, or give --overwrite to replace them"
                )
            write_atomically(target, rescored())  # on a failed score, `target` is left as it was
    except EvalError as exc:  # a score that raised (1), or one that gave no number (2)
        print_err(f"envsdk rescore: error: {exc}")
        return 1 if isinstance(exc, ScoreFailedError) else 2
    except (RecordsBusy, LockFileError) as exc:
        print_err(f"envsdk rescore: error: --out {exc}")
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print_err(f"envsdk rescore: error: cannot write --out {target} there: {exc.strerror}{where}")
        return 2
    print_out(summarize_groups(facts).render())
    said = _penalty_line(args.weights, penalised, len(facts))
    if said:
        print_out(said)
    print_out(f"\nre-scored records written to {target}")
    return 0


def _penalty_line(weights: Mapping[str, float] | None, penalised: int, records: int) -> str | None:
    """What a re-scoring did with the format penalty of the `penalised` records (of `records`)
    whose reward holds one; None where none does and --weights does not name it."""
    named = weights is not None and FORMAT_PENALTY_INFO in weights
    if not penalised and not named:
        return None
    carry = f"{penalised} of {records} records carry one (a reply cut by the length limit, or one with no move)"
    if weights is None:
        how = (f"{carry}, in infos.{FORMAT_PENALTY_INFO}; --score's reward is what the function returns, "
               "with the penalty only if it adds it")
    elif named:
        how = f"weight {weights[FORMAT_PENALTY_INFO]:g} (--weights): {carry}"
    else:
        how = f"kept at weight 1: {carry}; --weights {FORMAT_PENALTY_INFO}=W weighs it (0 drops it)"
    return f"{FORMAT_PENALTY_INFO:<16}{how}"
