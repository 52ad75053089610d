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

What the model sends back is read in one place, `MultiTurnScheduler.take_reply`, which the run
loop and the ms-swift bridge both call: a reasoning block is split off and kept in the
assistant message's ``reasoning_content`` (the environment gets only the reply after it), and a
completion cut by the length limit is flagged (``trajectory.truncated``) and dealt with by the
scheduler's `CutRule` (``cut_replies``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Protocol, TypedDict, get_args, runtime_checkable

from envsdk.env import RolloutRequest
from envsdk.errors import mask_secrets
from envsdk.policies.base import Policy as BasePolicy
from envsdk.reasoning import split_reasoning
from envsdk.records import (
    FORMAT_PENALTY_INFO,
    TEMPORARY_SUFFIX,
    RecordError,
    RecordForm,
    RecordsWritten,
    Status,
    StepRecord,
    Trajectory,
    check_record,
    done_reason,
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
    "CutRule",
    "CUT_RULES",
    "DEFAULT_CUT_RULE",
    "CUT_RULE_TEXT",
    "FORMAT_PENALTY",
    "Reply",
    "check_cut_rule",
]

logger = logging.getLogger(__name__)

#: What happens to a completion cut by the length limit (``finish_reason == "length"``, or
#: longer than ``max_completion_chars``); the episode ends with it under every rule:
#:
#: * ``env``: sent to the environment like any reply (its reasoning split off first, so a cut
#:   inside the reasoning is an empty reply), and scored as the environment scores it;
#: * ``penalty``: not sent; the episode's reward gets the format penalty (``cut_penalty``, by
#:   default the scheduler's `MultiTurnScheduler.format_penalty`: Sudoku's reply with no move);
#: * ``mask``: not sent, nothing added; a trainer leaves the episode out of the loss (TRL's
#:   ``mask_truncated_completions``; `envsdk.integrations.trl.make_rollout_func` zeroes its
#:   ``env_mask``).
CutRule = Literal["env", "penalty", "mask"]
CUT_RULES: tuple[CutRule, ...] = get_args(CutRule)
#: Ranks a cut reply with a reply the scheduler cannot read, never above it: rambling past
#: the limit then earns nothing a reply naming no move does not.
DEFAULT_CUT_RULE: CutRule = "penalty"
#: Each rule in a few words, as run summaries state it.
CUT_RULE_TEXT: dict[CutRule, str] = {
    "env": "sent to the environment like any reply, reasoning split off; the episode then ends",
    "penalty": "not sent; the episode ends with the format penalty",
    "mask": "not sent; the episode ends, left out of training",
}
#: The default format penalty: what a reply the scheduler cannot read costs (below any reward of
#: an environment that scores 0 to 1).
FORMAT_PENALTY = -1.0
#: The ``rollout_infos`` key of a cut reply's rule (the penalty the episode got is under
#: `FORMAT_PENALTY_INFO`).
CUT_REPLIES_INFO = "cut_replies"


def check_cut_rule(rule: object) -> CutRule:
    """`rule` when it is a `CutRule`, else `ValueError` naming the three."""
    if rule not in CUT_RULES:
        raise ValueError(f"cut_replies must be one of {', '.join(CUT_RULES)}, got {rule!r}")
    return rule


@dataclass(frozen=True)
class Reply:
    """A turn's completion as the scheduler read it (`MultiTurnScheduler.take_reply`).

    ``text`` is what the environment gets: the reply with any reasoning split off (the part of
    it within ``max_completion_chars``); ``reasoning`` the reasoning kept in the record;
    ``cut`` why the length limit cut the completion, or None; ``sent`` whether the reply goes
    to the environment (False: a cut reply the rule keeps from it; the episode has ended)."""

    text: str
    reasoning: str | None = None
    cut: str | None = None
    sent: bool = True


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

    ``max_turns`` bounds the policy replies per trajectory. A completion is cut when the policy
    reports ``finish_reason == "length"`` or it is longer than ``max_completion_chars``
    (reasoning included; the rest is cut off): the trajectory is flagged ``truncated`` and ends
    by ``cut_replies``, a `CutRule` (default ``penalty``, with ``cut_penalty`` or, when that is
    None, `format_penalty`). Its status is ``length`` unless the environment ended the episode
    on the reply (``env``).
    """

    #: What a reply the scheduler cannot read costs: the penalty of a cut reply under the
    #: ``penalty`` rule unless ``cut_penalty`` says otherwise. A subclass sets its own (Sudoku:
    #: its reply with no move, −1.0; coding: 0.0, what code that fails its tests gets).
    format_penalty: float = FORMAT_PENALTY
    #: Set on the instance by the constructor; the class values serve a subclass that does not
    #: call it.
    _cut_replies: CutRule = DEFAULT_CUT_RULE
    _cut_penalty: float | None = None

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

    def __init__(
        self,
        *,
        max_turns: int = 10,
        max_completion_chars: int | None = None,
        cut_replies: CutRule = DEFAULT_CUT_RULE,
        cut_penalty: float | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_completion_chars is not None and max_completion_chars < 1:
            raise ValueError(f"max_completion_chars must be >= 1, got {max_completion_chars}")
        self.max_turns = max_turns
        self.max_completion_chars = max_completion_chars
        self.cut_replies = cut_replies
        self.cut_penalty = cut_penalty

    @property
    def cut_replies(self) -> CutRule:
        """What a completion cut by the length limit gets (a `CutRule`)."""
        return self._cut_replies

    @cut_replies.setter
    def cut_replies(self, rule: CutRule) -> None:
        self._cut_replies = check_cut_rule(rule)

    @property
    def cut_penalty(self) -> float | None:
        """What the ``penalty`` rule adds to a cut episode's reward; None: `format_penalty`."""
        return self._cut_penalty

    @cut_penalty.setter
    def cut_penalty(self, penalty: float | None) -> None:
        if penalty is not None and (
            isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty)
        ):
            raise ValueError(f"cut_penalty must be a finite number, got {penalty!r}")
        self._cut_penalty = None if penalty is None else float(penalty)

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

    def tools_for(self, trajectory: Trajectory) -> list[dict[str, Any]] | None:
        """The OpenAI tool definitions a tool-calling policy is given for this trajectory
        (asked once, after `on_trajectory_start`); None (the default): the env takes text
        replies. A policy given them may answer with native tool calls, which the assistant
        message then carries as ``tool_calls``."""
        return None

    def take_reply(
        self,
        trajectory: Trajectory,
        text: str,
        turn: int,
        *,
        reasoning: str | None = None,
        finish_reason: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> Reply:
        """Read a turn's completion: append it to the conversation as the assistant message
        and say what the environment gets. `reasoning` is the reasoning a backend returned
        apart from `text`; when None, a ``<think>…</think>`` block is split off `text`
        (`envsdk.reasoning.split_reasoning`). The message holds the reply as ``content``,
        the reasoning as ``reasoning_content`` and `tool_calls` (OpenAI's form) when given.

        A completion cut by the length limit (`finish_reason` ``"length"``, or longer than
        ``max_completion_chars``, which then cuts it there) flags the trajectory
        ``truncated`` and records the rule in ``rollout_infos["cut_replies"]``; under
        ``penalty`` and ``mask`` the trajectory is finished here (status ``length``) and the
        reply is not sent (`Reply.sent` False)."""
        cut: str | None = None
        limit = self.max_completion_chars
        if limit is not None and len(text) + len(reasoning or "") > limit:
            cut = f"completion of {len(text) + len(reasoning or '')} chars exceeds max_completion_chars={limit}"
            if reasoning is not None:
                reasoning, text = reasoning[:limit], text[: max(0, limit - len(reasoning))]
            else:
                text = text[:limit]
        elif finish_reason == "length":
            cut = "completion cut by the policy's length limit"
        if reasoning is None:
            reasoning, text = split_reasoning(text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        trajectory.messages.append(message)
        trajectory.turns = turn
        if cut is None:
            return Reply(text, reasoning)
        rule = self.cut_replies
        trajectory.truncated = True
        trajectory.rollout_infos[CUT_REPLIES_INFO] = rule
        if rule == "env":
            return Reply(text, reasoning, cut)
        trajectory.finish("length", f"{cut}; not sent to the environment (cut_replies={rule}: {CUT_RULE_TEXT[rule]})")
        return Reply(text, reasoning, cut, sent=False)

    def settle_cut_reply(self, trajectory: Trajectory) -> None:
        """What the trajectory's cut reply still owes once its environment is released (after
        `on_trajectory_end`, so that a total the scheduler sets as the episode ends is not
        written over): under ``penalty``, `apply_format_penalty`. Nothing for any other."""
        if trajectory.truncated and trajectory.rollout_infos.get(CUT_REPLIES_INFO) == "penalty":
            penalty = self.format_penalty if self.cut_penalty is None else self.cut_penalty
            self.apply_format_penalty(trajectory, penalty)

    def apply_format_penalty(self, trajectory: Trajectory, penalty: float) -> None:
        """Add `penalty` to the episode's reward: a reply cut under the ``penalty`` rule.
        Default: ``total_reward`` grows by it, ``rollout_infos`` says so (``format_penalty``,
        ``total_reward``, and how the total was made in ``total_reward_is``). A scheduler that
        shapes its reward from parts overrides it (Sudoku: its ``format_penalty`` part)."""
        trajectory.total_reward += penalty
        infos = trajectory.rollout_infos
        infos[FORMAT_PENALTY_INFO] = penalty
        infos["total_reward"] = trajectory.total_reward
        infos.setdefault("total_reward_is", "the sum of step_rewards + format_penalty (a reply cut by the length limit)")

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
            act: Callable[..., Any] = act_ex if callable(act_ex) and not wraps_act else policy.act
            await self.on_trajectory_start(trajectory)
            # Native tool definitions go to a policy that takes them; any other plays the text form.
            tools = self.tools_for(trajectory) if getattr(policy, "supports_tools", False) else None
            conversation: list[dict[str, Any]] = []
            for turn in range(1, self.max_turns + 1):
                asked = time.perf_counter()
                conversation = _conversation(conversation, trajectory.messages)
                # A list of its own too: a policy may keep or extend the one it was given.
                output = await (act(list(conversation)) if tools is None else act(list(conversation), tools=tools))
                policy_s += time.perf_counter() - asked
                if type(output) is str:  # a plain reply: no finish reason or token ids to look for
                    reply = self.take_reply(trajectory, output, turn)
                else:
                    text, finish_reason = completion_of(output)
                    _record_tokens(trajectory, output, turn)
                    reply = self.take_reply(
                        trajectory, text, turn, reasoning=getattr(output, "reasoning", None),
                        finish_reason=finish_reason, tool_calls=getattr(output, "tool_calls", None),
                    )
                if not reply.sent:
                    break
                result = await self.on_turn_end(trajectory, reply.text, turn)
                if not keep_observations:
                    forgotten = _forget_observations(trajectory.steps, forgotten)
                infos = result.get("rollout_infos")
                if infos:
                    trajectory.rollout_infos.update(infos)
                if result.get("done"):
                    trajectory.finish("done", trajectory.reason or done_reason(trajectory))
                    break
                if reply.cut is not None:
                    trajectory.finish("length", f"{reply.cut}; sent to the environment (cut_replies=env), which played it")
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
            try:
                self.settle_cut_reply(trajectory)
            except Exception as exc:  # an override's failure is this trajectory's, never the batch's
                trajectory.rollout_infos["cut_reply_error"] = f"{type(exc).__name__}: {exc}"
                logger.warning("settling the cut reply of trajectory %s failed: %r", trajectory.uuid, exc)
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
