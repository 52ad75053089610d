"""The multi-turn scheduler core: hook protocol, trajectory records and their JSON-lines writer.

The hook protocol follows ms-swift's ``MultiTurnScheduler``; each hook gets the `Trajectory`
it works on (which carries the dataset row as ``trajectory.request``):

* ``on_trajectory_start(trajectory)`` — reset the environment, set the first messages;
* ``on_turn_end(trajectory, response_text, turn) -> {"done": bool, "rollout_infos": dict}`` —
  the environment step happens here;
* ``step(trajectory, turn_result, turn)`` — append the next observation as a user message;
* ``on_trajectory_end(trajectory)`` — release the environment; called exactly once per
  trajectory whatever ended it (done, max_turns, a cut completion, an error, cancellation).

`MultiTurnScheduler.run` drives a batch; one trajectory's failure is recorded on that
trajectory (status ``error``) and never escapes `run`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, TypedDict, runtime_checkable

from envsdk.env import RolloutRequest
from envsdk.errors import mask_secrets
from envsdk.policies.base import Policy as BasePolicy
from envsdk.records import (
    TEMPORARY_SUFFIX,
    RecordError,
    RecordForm,
    RecordsWritten,
    Status,
    StepRecord,
    Trajectory,
    check_record,
    hold_records,
    record_bytes,
    rehold,
    stated_success,
    summary_facts,
)
from envsdk.tokens import TOKENS, token_turn

__all__ = [
    "Status",
    "StepRecord",
    "Trajectory",
    "TurnResult",
    "Policy",
    "MultiTurnScheduler",
    "TrajectoryWriter",
    "RecordsWritten",
    "completion_of",
]

logger = logging.getLogger(__name__)

class TurnResult(TypedDict, total=False):
    """What `MultiTurnScheduler.on_turn_end` returns (ms-swift's shape)."""

    done: bool
    rollout_infos: dict[str, Any]


@runtime_checkable
class Policy(Protocol):
    """Produces the next assistant reply from the conversation so far.

    ``act`` returns the reply text, or an object with ``text`` and ``finish_reason``
    attributes; ``finish_reason == "length"`` marks a completion cut by the length limit.
    A policy that also has ``act_ex`` (`envsdk.policies.Policy`) is called through it, so its
    `PolicyOutput.finish_reason` is seen.
    """

    async def act(self, messages: list[dict[str, Any]]) -> Any: ...


def completion_of(output: Any) -> tuple[str, str | None]:
    """``(text, finish_reason)`` of whatever a policy returned (a str or a PolicyOutput-like)."""
    finish_reason = getattr(output, "finish_reason", None)
    if isinstance(output, str):
        return str(output), finish_reason
    text = getattr(output, "text", None)
    if text is None:
        raise TypeError(
            f"a policy must return a str or an object with a `text` attribute, got {type(output).__name__}"
        )
    return str(text), finish_reason


class MultiTurnScheduler(abc.ABC):
    """Drives trajectories: policy reply → `on_turn_end` (env step) → `step` (next observation).

    ``max_turns`` bounds the policy replies per trajectory. A completion is cut (status
    ``length``, not sent to the environment) when the policy reports ``finish_reason ==
    "length"`` or the reply is longer than ``max_completion_chars``.
    """

    #: False: a step record keeps its observation only while it is its trajectory's last step
    #: (`is_success` may read that one), for a caller whose records hold no per-step
    #: observation (the lean form) and which lets each trajectory go once its record is
    #: written: every episode in flight otherwise keeps each of its observations whole until
    #: then. `envsdk rollout` sets it so on the schedulers it makes from envsdk's own classes.
    keep_observations: bool = True
    #: False: a turn that does not end the episode need not give the episode's rollout infos
    #: whole; a scheduler may then give them once, as the episode ends (the Sudoku scheduler
    #: does: its infos are drawn from the whole episode, so each turn's cost grew with the
    #: turns before it). For a caller that reads a trajectory only once it has ended; a trainer
    #: that merges each turn's infos as it plays (ms-swift) keeps it True. `envsdk rollout`
    #: sets it so on the schedulers it makes from envsdk's own classes.
    infos_each_turn: bool = True

    def __init__(self, *, max_turns: int = 10, max_completion_chars: int | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.max_completion_chars = max_completion_chars

    @abc.abstractmethod
    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        """Reset the environment and set ``trajectory.messages`` to the first prompt."""

    @abc.abstractmethod
    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        """Apply the reply to the environment; say whether the episode is done."""

    @abc.abstractmethod
    async def step(self, trajectory: Trajectory, turn_result: TurnResult, turn: int) -> None:
        """Append the next observation to ``trajectory.messages`` as a user message."""

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        """Release the trajectory's environment. Called exactly once per trajectory."""
        return None

    def is_success(self, trajectory: Trajectory) -> bool | None:
        """Whether the episode succeeded, or None when that is not stated. Default: what the
        environment states (`envsdk.records.stated_success`: a boolean ``success`` in the last
        step's info); a reward alone says nothing (a random 2048 game scores on most moves).
        Override it for a game whose scheduler knows (Sudoku: solved)."""
        return stated_success(trajectory)

    async def run(
        self,
        requests: list[RolloutRequest],
        policy: Policy,
        *,
        max_concurrency: int | None = None,
        on_done: Any = None,
    ) -> list[Trajectory]:
        """Run every request to its end; return their trajectories in request order.

        At most ``max_concurrency`` trajectories run at once (all when None). ``on_done``, if
        given, is called with each trajectory as it finishes (progress bars, writers). No
        exception of a single trajectory escapes; cancelling `run` itself cancels every
        trajectory (each still gets its `on_trajectory_end`) and re-raises.
        """
        trajectories = [Trajectory(request=r) for r in requests]
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def one(traj: Trajectory) -> None:
            if gate is None:
                await self.run_trajectory(traj, policy)
            else:
                async with gate:
                    await self.run_trajectory(traj, policy)
            if on_done is not None:
                on_done(traj)

        results = await asyncio.gather(*(one(t) for t in trajectories), return_exceptions=True)
        for traj, result in zip(trajectories, results):
            if isinstance(result, asyncio.CancelledError):
                traj.finish("cancelled", "cancelled")
            elif isinstance(result, BaseException):
                # Only an `on_done` callback can get here; the trajectory itself is complete.
                logger.error("on_done callback failed for trajectory %s: %r", traj.uuid, result)
        return trajectories

    async def run_trajectory(self, trajectory: Trajectory, policy: Policy) -> Trajectory:
        """Drive one trajectory to its end, recording status, reason and timings.

        Exceptions other than cancellation end this trajectory with status ``error``;
        cancellation is recorded (``cancelled``) and re-raised after cleanup.
        """
        started = time.perf_counter()
        policy_s = 0.0
        keep_observations = self.keep_observations
        forgotten = 0  # the steps before this one hold no observation
        try:
            # A policy with per-episode state (a seeded random one) gets its own for this episode,
            # so its replies do not depend on which episodes ran before or beside it.
            for_episode = getattr(policy, "for_episode", None)
            if callable(for_episode):
                policy = for_episode(trajectory.request)
            act_ex = getattr(policy, "act_ex", None)
            # The base class's act_ex only wraps act's text: act is called itself (one coroutine
            # and one PolicyOutput a turn fewer), and its reply reads the same.
            wraps_act = getattr(type(policy), "act_ex", None) is BasePolicy.act_ex
            act = act_ex if callable(act_ex) and not wraps_act else policy.act
            await self.on_trajectory_start(trajectory)
            conversation: list[dict[str, Any]] = []
            for turn in range(1, self.max_turns + 1):
                asked = time.perf_counter()
                conversation = _conversation(conversation, trajectory.messages)
                # A list of its own too: a policy may keep or extend the one it was given.
                output = await act(list(conversation))
                policy_s += time.perf_counter() - asked
                if type(output) is str:  # a plain reply: no finish reason or token ids to look for
                    text, finish_reason = output, None
                else:
                    text, finish_reason = completion_of(output)
                    _record_tokens(trajectory, output, turn)
                trajectory.messages.append({"role": "assistant", "content": text})
                trajectory.turns = turn
                if finish_reason == "length":
                    trajectory.finish("length", "completion cut by the policy's length limit")
                    break
                if self.max_completion_chars is not None and len(text) > self.max_completion_chars:
                    trajectory.finish(
                        "length", f"completion of {len(text)} chars exceeds max_completion_chars={self.max_completion_chars}"
                    )
                    break
                result = await self.on_turn_end(trajectory, text, turn)
                if not keep_observations:
                    forgotten = _forget_observations(trajectory.steps, forgotten)
                infos = result.get("rollout_infos")
                if infos:
                    trajectory.rollout_infos.update(infos)
                if result.get("done"):
                    trajectory.finish("done", trajectory.reason or "environment signalled done")
                    break
                await self.step(trajectory, result, turn)
            else:
                trajectory.finish("max_turns", f"reached max_turns={self.max_turns}")
        except asyncio.CancelledError:
            trajectory.finish("cancelled", "cancelled")
            raise
        except Exception as exc:  # isolation: one environment's failure ends only its trajectory
            trajectory.error_kind = type(exc).__name__
            # Masked again here: an env's or a transport's own error may quote a resume URL.
            trajectory.finish("error", mask_secrets(f"{type(exc).__name__}: {exc}"))
            logger.warning("trajectory %s ended with an error: %s", trajectory.uuid, mask_secrets(repr(exc)))
        finally:
            try:
                await self.on_trajectory_end(trajectory)
            except Exception as exc:  # a failed close must not hide how the episode ended
                trajectory.rollout_infos["close_error"] = f"{type(exc).__name__}: {exc}"
                logger.warning("closing trajectory %s failed: %r", trajectory.uuid, exc)
            # A record states true, false or null: an `is_success` override's 1 or numpy bool is one.
            stated = self.is_success(trajectory)
            trajectory.success = None if stated is None else bool(stated)
            trajectory.timings["total_s"] = time.perf_counter() - started
            trajectory.timings["policy_s"] = policy_s
            trajectory.timings["env_s"] = sum(s.duration_s for s in trajectory.steps)
        return trajectory


def _conversation(given: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the policy gets this turn: its own copy of every message, so nothing it does to them
    reaches the trajectory's. Last turn's copies are kept while they still equal the messages
    (compared in C); only the new messages are copied, not the whole conversation every turn."""
    if given != messages[: len(given)]:  # the policy changed its copies, or a hook the messages
        given = []
    given.extend([dict(m) for m in messages[len(given) :]])
    return given


def _forget_observations(steps: list[StepRecord], start: int) -> int:
    """Drop the observation of every step from `start` on but the last; where the next call
    starts (the last step, whose observation goes once a later step follows it)."""
    last = len(steps) - 1
    for index in range(start, last):
        steps[index].observation = None
    return max(start, last)


def _record_tokens(trajectory: Trajectory, output: Any, turn: int) -> None:
    """Keep the turn's token ids when the policy gave them (`envsdk.tokens`); the record
    writes them as ``tokens``."""
    prompt_ids = getattr(output, "prompt_ids", None)
    completion_ids = getattr(output, "completion_ids", None)
    if prompt_ids is None or completion_ids is None:
        return
    turns = trajectory.rollout_infos.setdefault(TOKENS, [])
    turns.append(token_turn(turns, turn, prompt_ids, completion_ids, getattr(output, "logprobs", None)))


class TrajectoryWriter:
    """Appends one JSON object per trajectory to a ``.jsonl`` file (``completions.jsonl``).

    Use as a context manager; each record is flushed as it is written so a crash keeps every
    finished trajectory. The file is rewritten, or with `append` continued (a resumed run).
    ``written`` says where this writer's records lie and keeps the fields a run's summary reads
    of each, so the summary need not read them back from the file. While open it holds the file
    (`envsdk.records.hold_records`): a writer in another process gets `RecordsBusy`.

    With `on_replace` (a run that replaces an earlier run's records) the file is kept as it is
    until a trajectory ends without an error: the records go to a temporary file beside it
    until then, which then replaces it, and `on_replace` is called (the run writes its own run
    file). Closed before that, the writer removes the temporary file and the earlier records
    stay as they were: a run whose every episode fails (a reset option the server refuses) or
    that is stopped before one ends loses nothing.
    """

    def __init__(
        self, path: str | Path, form: RecordForm = "lean", *, append: bool = False,
        on_replace: Callable[[], None] | None = None,
    ) -> None:
        if append and on_replace is not None:
            raise ValueError("a writer that appends to its file replaces nothing: give append or on_replace")
        self.path = Path(path)
        self.form: RecordForm = form
        self.append = append
        self._on_replace = on_replace
        self._temporary: Path | None = None
        self._file: IO[bytes] | None = None
        self._hold = contextlib.ExitStack()
        self.count = 0
        self.written = RecordsWritten(self.path, 0, 0)
        self._failed = False

    def __enter__(self) -> TrajectoryWriter:
        # The folder of the file itself: an --out that is a link may point into one not made yet.
        real = Path(os.path.realpath(self.path))
        real.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as hold:
            # Opened without cutting it, held (its lock file, and the file itself now that it
            # exists), and only then cut: another process's records are not ours to cut.
            file = self.path.open("ab")
            hold.callback(file.close)
            hold.enter_context(hold_records(self.path))
            hold.callback(file.close)  # closed before the hold ends
            if self._on_replace is not None:
                # Named as `write_atomically` names its own: a run killed meanwhile leaves one
                # that the next run holding the file removes.
                fd, name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=TEMPORARY_SUFFIX, dir=real.parent)
                temporary = Path(name)
                hold.callback(temporary.unlink, missing_ok=True)
                os.fchmod(fd, stat.S_IMODE(os.fstat(file.fileno()).st_mode))
                file.close()
                file = os.fdopen(fd, "wb")
                hold.callback(file.close)
                self._temporary = temporary
            elif not self.append:
                file.truncate(0)
            self._file = file
            self._hold = hold.pop_all()
        start = self._file.seek(0, 2)
        self.written = RecordsWritten(self.path, start, start)
        return self

    def write(self, trajectory: Trajectory) -> None:
        if self._file is None:
            raise RuntimeError("TrajectoryWriter.write called outside its `with` block")
        record = trajectory.to_dict(self.form)
        line = record_bytes(record)
        try:
            self._file.write(line)
            self._file.flush()
        except OSError:
            self._failed = True  # its closing flushes what is left of the line, and fails again
            raise
        self.count += 1
        written = self.written
        written.end += len(line)
        if written.facts is not None:
            try:
                written.facts.append(summary_facts(check_record(record, f"{self.path}: record {self.count}")))
            except RecordError:  # the summary reads the file, and names the record
                written.facts = None
        if self._on_replace is not None and trajectory.status != "error":
            self._replace(self._file, self._on_replace)

    def _replace(self, file: IO[bytes], on_replace: Callable[[], None]) -> None:
        """The temporary file, synced, takes the file's place (its earlier records go), held as
        the file was; then `on_replace`."""
        assert self._temporary is not None
        os.fsync(file.fileno())
        os.replace(self._temporary, os.path.realpath(self.path))
        self._temporary, self._on_replace = None, None
        rehold(self.path)
        on_replace()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._file is not None:
            self._file = None
            # After a failed write (a full disk) the caller has its error: closing still lets go
            # of the file and its hold, and does not raise that error a second time.
            with contextlib.suppress(*((OSError,) if self._failed else ())):
                self._hold.close()
