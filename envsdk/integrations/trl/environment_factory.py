"""TRL's ``environment_factory``: tool-calling environment instances whose episodes a scheduler runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from typing import Any, Generic, Protocol, TypeVar

from envsdk.client.sync import background_loop
from envsdk.env import Env, RolloutRequest
from envsdk.registry import Registry, envs
from envsdk.rewards.parts import REWARD_PARTS
from envsdk.schedulers.base import MultiTurnScheduler, Trajectory
from envsdk.schedulers.gym import GYMScheduler
from envsdk.schedulers.openenv import OpenEnvScheduler
from envsdk.schedulers.sudoku import SudokuScheduler

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("envsdk.integrations.trl needs TRL: pip install 'trl>=1.16' (or pip install -e '.[train]' in the envsdk clone)") from exc

from envsdk.integrations.trl._common import (
    EpisodeError,
    Message,
    _capacity_error,
    _data_dict,
    _world_size,
    logger,
)

EnvT = TypeVar("EnvT", bound="EpisodeEnvironment")


class _Episode:
    """One trajectory run by `MultiTurnScheduler.run_trajectory` on the shared client loop,
    advanced one turn at a time from TRL's (blocking) thread.

    The episode is the trajectory's policy: when the scheduler asks it for a reply, the
    conversation is handed to the waiting TRL thread (``asked``), and the scheduler waits until
    a tool call delivers the reply. `stop` cancels a waiting trajectory, so the scheduler's
    ``on_trajectory_end`` still closes the session.
    """

    def __init__(self, scheduler: MultiTurnScheduler, request: RolloutRequest, call_timeout: float | None) -> None:
        self.loop = background_loop()
        self.trajectory = Trajectory(request=request)
        self.call_timeout = call_timeout
        self._asked: concurrent.futures.Future[list[Message] | None] = concurrent.futures.Future()
        self._reply: asyncio.Future[str] | None = None
        self._task = asyncio.run_coroutine_threadsafe(self._run(scheduler), self.loop)

    async def _run(self, scheduler: MultiTurnScheduler) -> None:
        try:
            await scheduler.run_trajectory(self.trajectory, self)
        finally:
            if not self._asked.done():
                self._asked.set_result(None)

    async def act(self, messages: list[Message]) -> str:
        """The `Policy` side: publish the conversation, wait for the tool call's reply."""
        self._reply = self.loop.create_future()
        self._asked.set_result(messages)
        return await self._reply

    @property
    def finished(self) -> bool:
        return self._task.done()

    def wait(self) -> list[Message] | None:
        """The conversation when the scheduler next wants a reply; None once the episode ended."""
        try:
            return self._asked.result(self.call_timeout)
        except concurrent.futures.TimeoutError:
            raise EpisodeError(
                f"episode {self.trajectory.uuid}: the environment did not answer within call_timeout={self.call_timeout} s"
            ) from None

    def send(self, reply: str) -> list[Message] | None:
        """Deliver the model's reply; return the next conversation, or None if the episode ended."""
        pending = self._reply
        if pending is None or self.finished:
            return None
        # Replace the hand-off before the reply is delivered: the scheduler fills the new one.
        self._asked = concurrent.futures.Future()
        self._reply = None
        self.loop.call_soon_threadsafe(pending.set_result, reply)
        return self.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """End the episode now (status ``cancelled`` unless it already ended) and wait until the
        scheduler has released its session."""
        if self.finished:
            return
        pending = self._reply
        if pending is not None:
            self.loop.call_soon_threadsafe(pending.cancel)
        done, _ = concurrent.futures.wait([self._task], timeout)
        if not done:
            logger.warning("episode %s did not end within %.0f s of being stopped", self.trajectory.uuid, timeout)


class EpisodeEnvironment:
    """Base class of TRL environments whose episodes a `MultiTurnScheduler` runs.

    TRL's contract: ``reset(**row)`` starts an episode and returns the text appended to the
    prompt's last user message; every public method a subclass adds (typed, with a Google
    style docstring) is a tool; ``get_reward()`` scores the finished rollout. A tool method
    turns its arguments into the reply text the scheduler expects and returns
    ``self._play(text)``: the next observation (the scheduler's next user message), or how the
    episode ended. Instances are made by an `EnvironmentFactory` (TRL pools and reuses them:
    each ``reset`` releases the previous episode first).

    The episode's system message (``SUDOKU_SYSTEM_MESSAGE`` and the like) is not sent: the
    dataset's prompt carries the instructions for the tools.
    """

    def __init__(self, factory: EnvironmentFactory[Any]) -> None:
        self._factory = factory
        self._episode: _Episode | None = None

    def reset(self, **row: Any) -> str | None:
        """Start a new episode for a dataset row (``env_config`` or ``seed`` columns say which).

        Returns the first observation. Raises `EnvironmentCapacityError` when the server is
        full and `EpisodeError` when the episode cannot start.
        """
        self._release()
        prompt = row.get("prompt")
        request = RolloutRequest(messages=list(prompt) if isinstance(prompt, list) else [], data_dict=_data_dict(row))
        episode = _Episode(self._factory.scheduler, request, self._factory.call_timeout)
        self._episode = episode
        messages = episode.wait()
        if messages is None:
            trajectory = episode.trajectory
            if trajectory.error_kind == "CapacityError":
                needed = self._factory.sessions_needed
                raise _capacity_error(
                    trajectory,
                    self._factory.scheduler,
                    needed,
                    f"TRL resets all {self._factory.instances} pooled environment instances of a generation batch "
                    f"(per_device_train_batch_size × steps_per_generation) before generating, on each of "
                    f"{self._factory.num_processes} process(es)",
                )
            raise EpisodeError(f"episode {trajectory.uuid} could not start: {trajectory.reason}")
        return _last_user_text(messages)

    def _play(self, reply: str) -> str:
        """Send one reply to the episode; the next observation, or how the episode ended.

        Raises `EpisodeError` when the environment failed on this reply (TRL reports it to
        the model as a failed tool call).
        """
        episode = self._episode
        if episode is None:
            raise EpisodeError("reset() must be called before the first tool call")
        if episode.finished:
            return self._ended_text(episode.trajectory, again=True)
        messages = episode.send(reply)
        if messages is None:
            trajectory = episode.trajectory
            if trajectory.status == "error":
                raise EpisodeError(f"the environment failed: {trajectory.reason}")
            return self._ended_text(trajectory, again=False)
        return _last_user_text(messages)

    def _ended_text(self, trajectory: Trajectory, *, again: bool) -> str:
        """What a tool returns once the episode is over (override to change the wording)."""
        prefix = "The episode is already over" if again else "The episode is over"
        return f"{prefix} ({trajectory.reason or trajectory.status}); no further moves are taken."

    def get_reward(self) -> float:
        """The episode's total reward (the scheduler's ``total_reward``); NaN when the episode
        failed, so TRL leaves it out of the group's baseline. Ends the episode and releases its
        session: TRL calls this once per rollout, after generation."""
        episode = self._episode
        if episode is None:
            return math.nan
        self._release()
        trajectory = episode.trajectory
        return math.nan if trajectory.status == "error" else float(trajectory.total_reward)

    @property
    def trajectory(self) -> Trajectory | None:
        """The current (or last) episode's trajectory record."""
        return self._episode.trajectory if self._episode is not None else None

    @property
    def reward_components(self) -> dict[str, float]:
        """The numeric values of the episode's ``rollout_infos`` (Sudoku: its five components,
        ``format_penalty`` and ``total_reward``) and its named reward parts (``reward_parts``)."""
        trajectory = self.trajectory
        if trajectory is None:
            return {}
        infos = trajectory.rollout_infos
        parts = infos.get(REWARD_PARTS)
        merged = {**infos, **(parts if isinstance(parts, dict) else {})}
        return {k: float(v) for k, v in merged.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def _release(self) -> None:
        if self._episode is not None:
            self._episode.stop()


def _last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


class SudokuToolEnvironment(EpisodeEnvironment):
    """TextArena Sudoku for TRL: one tool, ``place``; rewards from `SudokuScheduler`."""

    def place(self, row: int, col: int, number: int) -> str:
        """Write a number into an empty cell of the Sudoku board.

        Args:
            row: Row of the cell, from 1 (top) to 9 (bottom).
            col: Column of the cell, from 1 (left) to 9 (right).
            number: The digit to write, from 1 to 9.

        Returns:
            The board after the move with hints, or how the game ended.
        """
        return self._play(f"[{row} {col} {number}]")


class MessageToolEnvironment(EpisodeEnvironment):
    """Any scheduler's environment for TRL through one text tool, ``act``."""

    def act(self, message: str) -> str:
        """Send one action to the environment.

        Args:
            message: The action: a JSON object of the action's fields, or plain text for an
                action with one field.

        Returns:
            The environment's next observation, or how the episode ended.
        """
        return self._play(message)


class _Releasable(Protocol):
    def _release(self) -> None: ...


InstT = TypeVar("InstT", bound=_Releasable)
FactoryT = TypeVar("FactoryT", bound="PooledFactory[Any]")


class PooledFactory(Generic[InstT]):
    """What every ``environment_factory`` shares: the zero-argument callable TRL takes, making
    one instance of `environment_class` per call (TRL pools them), and releasing every
    instance's session on `close`.

    ``call_timeout`` bounds each blocking wait for the environment (None: the client's own
    timeouts bound it). ``num_processes`` is the number of training processes sharing the
    server (default: ``WORLD_SIZE``), used to say how many sessions a run needs.

    Release: `close` ends every episode still open (idempotent); use the factory as a context
    manager around ``trainer.train()``, or pass ``callbacks=[factory.callback()]``.
    """

    def __init__(
        self, environment_class: type[InstT], *, call_timeout: float | None = None, num_processes: int | None = None
    ) -> None:
        self.environment_class = environment_class
        self.call_timeout = call_timeout
        self.num_processes = num_processes if num_processes is not None else _world_size()
        self._instances: list[InstT] = []

    def __call__(self) -> InstT:
        instance = self.environment_class(self)  # type: ignore[call-arg]
        self._instances.append(instance)
        return instance

    @property
    def instances(self) -> int:
        """How many environment instances TRL has made from this factory (its pool size)."""
        return len(self._instances)

    @property
    def sessions_needed(self) -> int:
        """Sessions this run holds at once: every pooled instance, on every process."""
        return max(1, self.instances) * self.num_processes

    def close(self) -> None:
        """End every open episode and release its session."""
        for instance in self._instances:
            instance._release()

    def callback(self) -> TrainerCallback:
        """A ``TrainerCallback`` that calls `close` when training ends."""
        return _CloseAtTrainEnd(self)

    def __enter__(self: FactoryT) -> FactoryT:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _CloseAtTrainEnd(TrainerCallback):
    def __init__(self, factory: PooledFactory[Any]) -> None:
        self.factory = factory

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.factory.close()


class EnvironmentFactory(PooledFactory[EnvT]):
    """A `PooledFactory` of `EpisodeEnvironment` instances (of `environment_class`) whose
    episodes `scheduler` runs."""

    def __init__(
        self,
        environment_class: type[EnvT],
        scheduler: MultiTurnScheduler,
        *,
        call_timeout: float | None = None,
        num_processes: int | None = None,
    ) -> None:
        super().__init__(environment_class, call_timeout=call_timeout, num_processes=num_processes)
        self.scheduler = scheduler


def sudoku_environment_factory(
    base_url: str,
    *,
    reset_kwargs: dict[str, Any] | None = None,
    max_turns: int = 100,
    call_timeout: float | None = None,
    **scheduler_kwargs: Any,
) -> EnvironmentFactory[SudokuToolEnvironment]:
    """An ``environment_factory`` for a TextArena Sudoku server (envsdk's or OpenEnv's).

    Each episode is a `SudokuScheduler` trajectory: `get_reward` is its total of the five
    components (`SudokuToolEnvironment.reward_components` has each). `scheduler_kwargs` go to
    `SudokuScheduler`.
    """
    scheduler = SudokuScheduler(base_url=base_url, reset_kwargs=reset_kwargs, max_turns=max_turns, **scheduler_kwargs)
    return EnvironmentFactory(SudokuToolEnvironment, scheduler, call_timeout=call_timeout)


def openenv_environment_factory(
    base_url: str,
    *,
    reset_kwargs: dict[str, Any] | None = None,
    max_turns: int = 10,
    call_timeout: float | None = None,
    environment_class: type[EpisodeEnvironment] = MessageToolEnvironment,
    **scheduler_kwargs: Any,
) -> EnvironmentFactory[Any]:
    """An ``environment_factory`` for any envsdk or OpenEnv server, through `OpenEnvScheduler`.

    The model calls one tool, ``act(message)``; its text becomes the action by
    `envsdk.formats.parse_reply` with the server's action schema (``GET /schema``): a JSON
    object (a code fence around it is dropped) is the action; otherwise, when the action has a
    single field, a string field gets the text and any other field the text read as JSON
    (``"42"`` → ``{"guess": 42}``); with no schema the text goes to ``message``. A reply that
    fits no field ends the episode with an error naming the action's fields, which TRL returns
    to the model as the failed tool call's message. Observations come
    back rendered by the scheduler's ``formatter`` (pass ``formatter="json"`` among
    `scheduler_kwargs` for ms-swift's JSON dump). The reward is the sum of the step rewards."""
    scheduler = OpenEnvScheduler(base_url=base_url, reset_kwargs=reset_kwargs, max_turns=max_turns, **scheduler_kwargs)
    return EnvironmentFactory(environment_class, scheduler, call_timeout=call_timeout)


def local_environment_factory(
    env: str | type[Env],
    *,
    max_turns: int = 10,
    environment_class: type[EpisodeEnvironment] = MessageToolEnvironment,
    call_timeout: float | None = None,
) -> EnvironmentFactory[Any]:
    """An ``environment_factory`` for a local ms-swift-style `Env`, by registered name or class,
    through `GYMScheduler` (a row's ``env_config["name"]`` overrides the name)."""
    if isinstance(env, str):
        scheduler = GYMScheduler(env, registry=envs, max_turns=max_turns)
    else:
        registry: Registry[Any] = Registry("env")
        registry[env.__name__] = env
        scheduler = GYMScheduler(env.__name__, registry=registry, max_turns=max_turns)
    return EnvironmentFactory(environment_class, scheduler, call_timeout=call_timeout)

