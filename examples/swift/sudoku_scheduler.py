"""ms-swift plugin: envsdk's Sudoku scheduler as an ms-swift multi-turn scheduler.

Load it with ``--external_plugins examples/swift/sudoku_scheduler.py`` (``swift rollout`` and
``swift rlhf``); it registers ``envsdk_sudoku`` in ms-swift's ``swift.rollout.multi_turns``
(and ``envsdk_tools``, for any tool environment: see `EnvsdkToolScheduler`)::

    swift rollout ... --external_plugins examples/swift/sudoku_scheduler.py \\
        --multi_turn_scheduler envsdk_sudoku --use_gym_env true --max_turns 100

Each dataset row's ``env_config`` says where the envsdk Sudoku server is and which game to play
(``base_url``, ``seed``, ``reset_kwargs``, ``system_message``, ``hints``; see
`envsdk.schedulers.openenv` and `envsdk.schedulers.sudoku`).
Rows without ``base_url`` use ``$ENVSDK_BASE_URL``, else ``http://localhost:8000``;
``$ENVSDK_MAX_CONCURRENT_ENVS`` (default 4) bounds the resets and steps in flight across every
batch, and ``$ENVSDK_SUDOKU_HINTS`` (``none``, ``rejected``, the default, or ``all``: ms-swift's own
Sudoku hints, moves of the solution among them) says what the messages show beside the board,
since ms-swift's command line has no way to pass scheduler arguments.

The game logic is envsdk's `SudokuScheduler` (move parsing, hints, the five-part reward), driven
through ms-swift's hooks by `EnvsdkSchedulerBridge`:

* ``on_trajectory_start`` opens one session per row and resets it;
* ``on_turn_end`` steps it with the reply and returns ``{"done", "rollout_infos"}``; the reply
  is read as envsdk's own run loop reads it (`MultiTurnScheduler.take_reply`): a reasoning
  model's ``<think>…</think>`` block (or the engine's ``reasoning_content``) is kept in the
  trajectory and never played, and a reply cut by the length limit (``finish_reason ==
  "length"``) ends the episode by ``$ENVSDK_CUT_REPLIES``: ``penalty`` (the default: not played,
  the format penalty, Sudoku's reply with no move, −1; ``$ENVSDK_CUT_PENALTY`` sets another),
  ``env`` (played like any reply) or ``mask`` (not played, nothing added; ``truncated`` in
  ``rollout_infos`` says to leave it out of the loss); ``rollout_infos["total_reward"]`` is the episode's
  shaped total, the column ms-swift's GRPO trainer appends as ``gym_reward`` under
  ``use_gym_env``; the five components, step rewards, status and reason ride along;
* ``step`` (synchronous in ms-swift) appends the observation ``on_turn_end`` already formatted.

Unlike ms-swift's own GYM/OpenEnv schedulers, the session is closed on *every* end: done,
``max_turns``, a cut reply, an environment error (which ends that trajectory only, recorded in
``rollout_infos["env_error"]``) and, in server mode, an inference error or cancellation.

All environment I/O runs on envsdk's background client loop (`envsdk.client.sync.
background_loop`) and is awaited from the caller's loop through `asyncio.wrap_future`: no hook
blocks ms-swift's event loop, and sessions survive ms-swift's colocate mode, which runs
``on_trajectory_start`` and the later turns on two different, short-lived event loops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from swift.infer_engine.protocol import ChatCompletionResponseChoice, RequestConfig, RolloutInferRequest, RolloutOutput
from swift.rollout import MultiTurnScheduler, multi_turns

from envsdk.client.sync import background_loop
from envsdk.env import RolloutRequest
from envsdk.schedulers import MultiTurnScheduler as EnvsdkMultiTurnScheduler
from envsdk.schedulers import SudokuScheduler, Trajectory
from envsdk.schedulers.sudoku import DEFAULT_HINTS
from envsdk.schedulers.tools import ToolScheduler

__all__ = ["EnvsdkSchedulerBridge", "EnvsdkSudokuScheduler", "EnvsdkToolScheduler", "row_env_config"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ms-swift's ``max_turns`` may be None (no limit); envsdk's schedulers need a number. The bridge
#: enforces ms-swift's own value, so this only has to be at least as large.
_UNBOUNDED_TURNS = 10**6


def row_env_config(data_dict: dict[str, Any] | None) -> dict[str, Any]:
    """The row's ``env_config`` without None values.

    A `datasets` column of dicts is stored as one struct type: every row gets every key seen in
    any row, None where it had none. Dropping the Nones gives back what the row said, so a key
    missing from a row means "use the default" again.
    """
    config = (data_dict or {}).get("env_config")
    return {k: v for k, v in config.items() if v is not None} if isinstance(config, dict) else {}


async def _on_envsdk_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on envsdk's background client loop; await it without blocking this loop."""
    loop = background_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


class EnvsdkSchedulerBridge(MultiTurnScheduler):
    """Runs an envsdk `MultiTurnScheduler` (the *core*) under ms-swift's multi-turn protocol.

    Subclasses implement `make_core`. ms-swift builds schedulers as ``cls(infer_engine=…,
    max_turns=…, **kwargs)`` (kwargs: ``tokenizer``, ``template``, ``gym_env``, ``use_gym_env``);
    all are accepted. Per-trajectory state is keyed by ``RolloutInferRequest.uuid`` (assigned
    here when a request has none).
    """

    def __init__(self, infer_engine: Any = None, max_turns: int | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(infer_engine, max_turns, *args, **kwargs)
        self.core = self.make_core()
        _cut_rule_from_environment(self.core)
        self._trajectories: dict[str, Trajectory] = {}
        self._next_user_message: dict[str, str] = {}

    def make_core(self) -> EnvsdkMultiTurnScheduler:
        """The envsdk scheduler whose hooks do the environment work."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_core()")

    @property
    def open_trajectories(self) -> int:
        """Trajectories started and not yet ended (each holds a session until it ends)."""
        return len(self._trajectories)

    # ------------------------------------------------------------ ms-swift hooks

    async def on_trajectory_start(self, requests: list[RolloutInferRequest]) -> None:
        """Open and reset one session per request; replace its messages with the first prompt."""
        await asyncio.gather(*(self._start(request) for request in requests))

    async def on_turn_end(
        self, infer_request: RolloutInferRequest, response_choice: ChatCompletionResponseChoice, current_turn: int
    ) -> dict[str, Any]:
        """Step the environment with the reply; return ``{"done", "rollout_infos"}``.

        ``done`` is True on every end (the environment's, ``max_turns``, a cut reply, an error);
        the session is closed before this returns.
        """
        key = str(infer_request.uuid)
        trajectory = self._trajectories.get(key)
        if trajectory is None:
            return {"done": True, "rollout_infos": {"env_error": f"no envsdk trajectory for request {key}"}}
        if trajectory.status != "running":  # its reset failed: end it at its first turn
            return await self._end(key)
        reasoning = getattr(response_choice.message, "reasoning_content", None)
        reply = self.core.take_reply(
            trajectory, _reply_text(infer_request, response_choice), current_turn,
            reasoning=reasoning if isinstance(reasoning, str) else None, finish_reason=response_choice.finish_reason,
        )
        if not reply.sent:  # cut, and kept from the environment by the rule
            return await self._end(key)
        # A cut reply that is played ends the episode: no next observation is wanted.
        last_turn = reply.cut is not None or (bool(self.max_turns) and current_turn >= int(self.max_turns or 0))
        try:
            result, next_message = await _on_envsdk_loop(self._turn(trajectory, reply.text, current_turn, last_turn))
        except asyncio.CancelledError:
            trajectory.finish("cancelled", "cancelled")
            await self._end(key)
            raise
        except Exception as exc:  # isolation: one environment's failure ends only its trajectory
            self._record_error(trajectory, exc)
            return await self._end(key)
        if result.get("done"):
            trajectory.finish("done", trajectory.reason or "environment signalled done")
            return await self._end(key)
        if reply.cut is not None:
            trajectory.finish("length", f"{reply.cut}; sent to the environment (cut_replies=env), which played it")
            return await self._end(key)
        if next_message is None:
            trajectory.finish("max_turns", f"reached max_turns={self.max_turns}")
            return await self._end(key)
        self._next_user_message[key] = next_message
        return {"done": False, "rollout_infos": self._infos(trajectory)}

    def step(
        self, infer_request: RolloutInferRequest, response_choice: ChatCompletionResponseChoice, current_turn: int
    ) -> dict[str, Any]:
        """Append the next observation (formatted by ``on_turn_end``) as a user message."""
        message = self._next_user_message.pop(str(infer_request.uuid), None)
        if message is not None:
            infer_request.messages.append({"role": "user", "content": message})
        return {"infer_request": infer_request}

    async def run(
        self, infer_request: RolloutInferRequest, request_config: RequestConfig, **kwargs: Any
    ) -> RolloutOutput | list[RolloutOutput]:
        """ms-swift's server-mode loop, plus: a trajectory that an inference error or a
        cancellation interrupts still has its session closed."""
        try:
            return await super().run(infer_request, request_config, **kwargs)
        finally:
            key = str(infer_request.uuid)
            trajectory = self._trajectories.get(key)
            if trajectory is not None:
                trajectory.finish("error", "interrupted before the trajectory ended (inference error or cancellation)")
                await asyncio.shield(self._end(key))

    # ------------------------------------------------------------ internals

    async def _start(self, request: RolloutInferRequest) -> None:
        if request.uuid is None:
            request.uuid = uuid.uuid4().hex
        key = str(request.uuid)
        if key in self._trajectories:  # a reused uuid: the older trajectory is over
            await self._end(key)
        data_dict = {**(request.data_dict or {}), "env_config": row_env_config(request.data_dict)}
        trajectory = Trajectory(
            request=RolloutRequest(messages=[dict(m) for m in request.messages], data_dict=data_dict, uuid=key)
        )
        self._trajectories[key] = trajectory
        try:
            await _on_envsdk_loop(self.core.on_trajectory_start(trajectory))
        except asyncio.CancelledError:
            trajectory.finish("cancelled", "cancelled")
            await self._end(key)
            raise
        except Exception as exc:  # keep the row in the batch; its first turn ends it
            self._record_error(trajectory, exc)
            await _on_envsdk_loop(self._close(trajectory))
            return
        request.messages = [dict(m) for m in trajectory.messages]

    async def _turn(
        self, trajectory: Trajectory, text: str, turn: int, last_turn: bool
    ) -> tuple[dict[str, Any], str | None]:
        """On envsdk's loop: the core's step and, when another turn follows, its next message."""
        result = await self.core.on_turn_end(trajectory, text, turn)
        infos = result.get("rollout_infos")
        if infos:
            trajectory.rollout_infos.update(infos)
        if result.get("done") or last_turn:
            return dict(result), None
        await self.core.step(trajectory, result, turn)
        return dict(result), str(trajectory.messages[-1]["content"])

    async def _close(self, trajectory: Trajectory) -> None:
        """On envsdk's loop: release the trajectory's session, once."""
        if trajectory.runtime is None:
            return
        try:
            await self.core.on_trajectory_end(trajectory)
        except Exception as exc:  # a failed close must not hide how the episode ended
            trajectory.rollout_infos["close_error"] = f"{type(exc).__name__}: {exc}"
            logger.warning("closing trajectory %s failed: %r", trajectory.uuid, exc)
        finally:
            try:
                self.core.settle_cut_reply(trajectory)
            finally:
                trajectory.runtime = None

    async def _end(self, key: str) -> dict[str, Any]:
        """Close the trajectory's session, forget it, and return its final turn result."""
        trajectory = self._trajectories.pop(key)
        self._next_user_message.pop(key, None)
        await _on_envsdk_loop(self._close(trajectory))
        trajectory.success = self.core.is_success(trajectory)
        return {"done": True, "rollout_infos": self._infos(trajectory)}

    @staticmethod
    def _record_error(trajectory: Trajectory, exc: Exception) -> None:
        trajectory.error_kind = type(exc).__name__
        trajectory.finish("error", f"{type(exc).__name__}: {exc}")
        logger.warning("trajectory %s ended with an environment error: %r", trajectory.uuid, exc)

    @staticmethod
    def _infos(trajectory: Trajectory) -> dict[str, Any]:
        """ms-swift's rollout_infos: the core's infos plus ``total_reward``, ``step_rewards``,
        ``gym_done`` (ms-swift's GYM keys), ``status``, ``reason`` and ``env_error``."""
        infos: dict[str, Any] = {
            **trajectory.rollout_infos,
            "total_reward": float(trajectory.total_reward),
            "step_rewards": trajectory.step_rewards,
            "gym_done": trajectory.status == "done",
            "status": trajectory.status,
            "reason": trajectory.reason,
            "success": trajectory.success,
            "truncated": trajectory.truncated,
        }
        if trajectory.status == "error":
            infos["env_error"] = trajectory.reason
        return infos


def _cut_rule_from_environment(core: EnvsdkMultiTurnScheduler) -> None:
    """Set the core's rule for cut replies from ``$ENVSDK_CUT_REPLIES`` and ``$ENVSDK_CUT_PENALTY``
    (ms-swift's command line passes no scheduler arguments); unset, the core keeps its own.
    `ValueError` naming the variable for a value it cannot take."""
    rule = os.environ.get("ENVSDK_CUT_REPLIES")
    penalty = os.environ.get("ENVSDK_CUT_PENALTY")
    try:
        if rule:
            core.cut_replies = rule  # type: ignore[assignment]  # checked by the setter
        if penalty:
            core.cut_penalty = float(penalty)  # checked by the setter (finite)
    except ValueError as exc:
        raise ValueError(f"$ENVSDK_CUT_REPLIES / $ENVSDK_CUT_PENALTY: {exc}") from None


def _reply_text(infer_request: RolloutInferRequest, response_choice: ChatCompletionResponseChoice) -> str:
    """The whole assistant reply of this turn: the last assistant message, which ms-swift has
    already materialised as text (and which includes a continued turn's earlier part)."""
    messages = infer_request.messages
    if messages and messages[-1].get("role") == "assistant" and isinstance(messages[-1].get("content"), str):
        return str(messages[-1]["content"])
    content = response_choice.message.content
    return content if isinstance(content, str) else str(content)


class EnvsdkSudokuScheduler(EnvsdkSchedulerBridge):
    """TextArena Sudoku on an envsdk (or OpenEnv) Sudoku server, with envsdk's hints and
    five-part shaped reward (`envsdk.schedulers.SudokuScheduler`)."""

    def make_core(self) -> SudokuScheduler:
        return SudokuScheduler(
            base_url=os.environ.get("ENVSDK_BASE_URL") or None,
            max_concurrent_envs=int(os.environ.get("ENVSDK_MAX_CONCURRENT_ENVS", "4")),
            max_turns=int(self.max_turns or _UNBOUNDED_TURNS),
            hints=os.environ.get("ENVSDK_SUDOKU_HINTS") or DEFAULT_HINTS,
        )


class EnvsdkToolScheduler(EnvsdkSchedulerBridge):
    """Any tool environment (envsdk ``@tool`` methods or an OpenEnv ``MCPEnvironment``) on an
    envsdk or OpenEnv server, through `envsdk.schedulers.tools.ToolScheduler`: the tools are
    discovered over MCP and listed in the system message, each reply's ``<tool_call>`` is
    one tool call, a reply without one ends the episode, and the state's ``reward`` is the
    episode's ``total_reward`` (ms-swift's ``gym_reward`` column under ``use_gym_env``)::

        swift rollout ... --external_plugins examples/swift/sudoku_scheduler.py \\
            --multi_turn_scheduler envsdk_tools --use_gym_env true --max_turns 8
    """

    def make_core(self) -> ToolScheduler:
        return ToolScheduler(
            base_url=os.environ.get("ENVSDK_BASE_URL") or None,
            max_concurrent_envs=int(os.environ.get("ENVSDK_MAX_CONCURRENT_ENVS", "4")),
            max_turns=int(self.max_turns or _UNBOUNDED_TURNS),
        )


multi_turns["envsdk_sudoku"] = EnvsdkSudokuScheduler
multi_turns["envsdk_tools"] = EnvsdkToolScheduler
