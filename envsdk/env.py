"""The two environment shapes envsdk serves: `Environment` (server side, OpenEnv style) and
`Env` (local, ms-swift style). Both run behind the same wire protocol.
"""

from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, ClassVar, Generic, TypeVar, Union

from envsdk.rewards.parts import REWARD_COMPONENTS, ascore, score
from envsdk.types import Action, Observation, State

__all__ = ["Environment", "Env", "RolloutRequest", "ActT", "ObsT", "StateT", "step_types",
           "is_openenv_environment", "overrides_async"]

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)

_MaybeAwaitable = Union[Any, Awaitable[Any]]


class Environment(abc.ABC, Generic[ActT, ObsT, StateT]):
    """A server-side environment: one instance per session.

    Contract:

    * ``reset(seed=None, episode_id=None, **kwargs) -> Observation`` starts a new episode;
      the same seed must give the same first observation.
    * ``step(action) -> Observation`` applies one action; the observation's ``done`` says the
      episode ended (the server then refuses further steps until the next reset).
    * ``state`` (a property) returns the current `State`.
    * ``close()`` releases whatever the instance holds; it may be called more than once.

    Any of ``reset``, ``step`` and ``close`` may be ``async def``: coroutines run on the server's
    event loop (they must not block it). Plain methods (and the constructor, and ``state``) run
    on the session's lane, one at a time, in order, on a thread that the lane lets go once the
    session has had no call for the server's ``lane_idle_s`` (5 s by default): an idle session
    holds no thread, and its next call may run on a new one. An env whose instances hold
    thread-bound resources (sqlite connections, browsers, CUDA contexts, greenlets,
    thread-local state) sets ``THREAD_BOUND = True``: each session then keeps one thread for
    its whole life. ``REQUIRES_SINGLE_THREAD_EXECUTOR = True`` puts every session of the class
    on one thread.
    Keyword arguments of ``reset`` other than ``seed`` and ``episode_id`` must be declared in
    its signature (or accepted by ``**kwargs``): unknown ones are refused.

    ``step_timeout_s``, ``reset_timeout_s``, ``state_timeout_s``, ``close_timeout_s`` (and
    ``factory_timeout_s`` on the class used as factory) are the environment's deadlines; the
    server's settings override them; ``None`` means the server's default (60 s for building,
    reset and step, 10 s for state, 5 s for close). Every call has a deadline.

    ``rubric`` (optional) computes rewards, as in OpenEnv: pass it with
    ``super().__init__(rubric=R)`` (an envsdk or OpenEnv rubric), call ``self._reset_rubric()``
    in ``reset`` and ``obs.reward = self._apply_rubric(action, obs)`` in ``step`` (the
    ``_async`` forms in coroutines or for async rubrics). `_apply_rubric` also puts every named
    part of the score into ``obs.metadata["reward_components"]``, so the parts reach the client.

    ``INLINE_SYNC = True`` declares that the sync methods are fast (well under a millisecond)
    and may run directly on the event loop instead of hopping to the lane thread, which costs
    more than such a call itself; the default deadlines then do not apply. A call under an
    explicitly set deadline still goes to the lane so the deadline holds. Leave it False for
    anything that can block.
    """

    SUPPORTS_CONCURRENT_SESSIONS: ClassVar[bool] = True
    REQUIRES_SINGLE_THREAD_EXECUTOR: ClassVar[bool] = False
    THREAD_BOUND: ClassVar[bool] = False
    INLINE_SYNC: ClassVar[bool] = False
    factory_timeout_s: ClassVar[float | None] = None
    step_timeout_s: ClassVar[float | None] = None
    reset_timeout_s: ClassVar[float | None] = None
    state_timeout_s: ClassVar[float | None] = None
    close_timeout_s: ClassVar[float | None] = None
    # A class-level default, so subclasses whose __init__ does not call ours have no rubric.
    rubric: Any = None

    def __init__(self, rubric: Any = None) -> None:
        self.rubric = rubric

    @abc.abstractmethod
    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ObsT | Awaitable[ObsT]:
        """Start a new episode and return its first observation."""

    @abc.abstractmethod
    def step(self, action: ActT) -> ObsT | Awaitable[ObsT]:
        """Apply one action and return the next observation."""

    @property
    @abc.abstractmethod
    def state(self) -> StateT:
        """The episode's current state."""

    def close(self) -> None | Awaitable[None]:
        """Release resources. Idempotent."""
        return None

    def _apply_rubric(self, action: ActT, observation: ObsT) -> float:
        """The rubric's score for this step (0.0 without a rubric); its named parts go into
        ``observation.metadata["reward_components"]``. `TypeError` for an async rubric."""
        if self.rubric is None:
            return 0.0
        scored = score(self.rubric, action, observation)
        observation.metadata[REWARD_COMPONENTS] = scored.parts
        return scored.reward

    async def _apply_rubric_async(self, action: ActT, observation: ObsT) -> float:
        """`_apply_rubric` for sync and async rubrics alike."""
        if self.rubric is None:
            return 0.0
        scored = await ascore(self.rubric, action, observation)
        observation.metadata[REWARD_COMPONENTS] = scored.parts
        return scored.reward

    def _reset_rubric(self) -> None:
        """Forget the rubric's episode state (call it in ``reset``)."""
        if self.rubric is not None:
            self.rubric.reset()

    async def _reset_rubric_async(self) -> None:
        """`_reset_rubric`, awaiting a rubric's ``reset_async`` when it has one (as OpenEnv)."""
        if self.rubric is None:
            return
        reset_async = getattr(self.rubric, "reset_async", None)
        if callable(reset_async):
            await reset_async()
        else:
            self.rubric.reset()


@dataclass
class RolloutRequest:
    """What a local `Env` is reset with: one dataset row of one trajectory.

    Attribute names follow ms-swift's ``RolloutInferRequest`` so that ms-swift-style envs
    (``config.data_dict["env_config"]``) run unchanged.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    data_dict: dict[str, Any] = field(default_factory=dict)
    uuid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def env_config(self) -> dict[str, Any]:
        cfg = self.data_dict.get("env_config")
        return dict(cfg) if isinstance(cfg, dict) else {}


class Env(abc.ABC):
    """A local, in-process environment in ms-swift's shape.

    Contract:

    * ``__init__(env_config)`` gets the row's ``env_config`` dict.
    * ``async reset(config: RolloutRequest) -> (observation, info, system_message)``.
    * ``async step(messages) -> (next_observation, reward, done, info)`` where ``messages`` is
      the whole conversation so far and its last entry is the model's latest reply.
    * ``async close()`` releases resources; idempotent.

    * Once ``step`` has returned ``done=True`` the episode is over: a further ``step`` must raise
      (`envsdk.errors.EpisodeDoneError`) until the next ``reset``. Served through
      `envsdk.adapters.EnvEnvironment` (``envsdk serve module:MyEnv``), the server enforces it.

    Served, the coroutines run on the session's lane thread, on an event loop of the session's
    own, under the server's deadlines (`envsdk.adapters.EnvEnvironment`); in-process (``envsdk
    rollout``, ms-swift) they are awaited on the caller's loop, so slow sync work in them still
    belongs in a thread or `envsdk.server.run_in_process` there.

    Register a class by name with ``envsdk.registry.envs["name"] = MyEnv``.

    ``CONFIG_KEYS`` (optional): the ``env_config`` keys the env reads besides ``name`` and
    ``seed``. When it is set, ``envsdk rollout`` refuses a row or ``--env-config`` holding any
    other key, naming the accepted ones, instead of running as if a misspelt key were absent.

    ``rubric`` (optional, any envsdk or OpenEnv rubric): ``await self._apply_rubric(action,
    observation, info)`` scores a step and puts its named parts into
    ``info["reward_components"]``, which schedulers and the served form pass on.
    """

    rubric: Any = None
    CONFIG_KEYS: ClassVar[frozenset[str] | None] = None

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        self.env_config: dict[str, Any] = dict(env_config or {})

    async def _apply_rubric(self, action: Any, observation: Any, info: dict[str, Any]) -> float:
        """The rubric's score for this step (0.0 without a rubric); its named parts go into
        ``info["reward_components"]``."""
        if self.rubric is None:
            return 0.0
        scored = await ascore(self.rubric, action, observation)
        info[REWARD_COMPONENTS] = scored.parts
        return scored.reward

    @abc.abstractmethod
    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        """Start an episode: return (observation, info, system_message)."""

    @abc.abstractmethod
    async def step(
        self, messages: list[dict[str, Any]]
    ) -> tuple[str, float, bool, dict[str, Any]]:
        """React to the latest reply: return (next_observation, reward, done, info)."""

    async def close(self) -> None:
        """Release resources. Idempotent."""
        return None


def step_types(env_class: type) -> tuple[Any, Any]:
    """(action type, observation type) of an `Environment` class, read from its ``step``
    annotations (``action`` parameter and return type); None for one that cannot be read."""
    import typing

    try:
        hints = typing.get_type_hints(getattr(env_class, "step"))
    except Exception:  # unresolvable annotations: the caller asks for the types instead
        return None, None
    return hints.get("action"), hints.get("return")


def _is_openenv_base(klass: type, names: tuple[str, ...]) -> bool:
    return klass.__name__ in names and (klass.__module__ or "").startswith("openenv.")


def is_openenv_environment(cls: Any) -> bool:
    """Whether `cls` is a subclass of OpenEnv's ``Environment`` (read from its bases by name, so
    that envsdk need not import openenv)."""
    return isinstance(cls, type) and any(_is_openenv_base(k, ("Environment",)) for k in cls.__mro__)


def overrides_async(cls: type, name: str) -> bool:
    """Whether an OpenEnv environment class overrides ``<name>_async`` (`name`: ``"reset"`` or
    ``"step"``), so that OpenEnv 0.10's server calls that coroutine instead of the sync `name`
    (its rule: the bound method's function is not ``Environment.<name>_async``). The one of
    OpenEnv's ``MCPEnvironment`` does not count: for an action that is not a tool call it runs
    the sync step's ``_step_impl``, and the tool calls are served by `envsdk.server.mcp`. False
    for any other class (an envsdk `Environment` has no such pair)."""
    if not is_openenv_environment(cls):
        return False
    attribute = f"{name}_async"
    for klass in cls.__mro__:
        if attribute in vars(klass):
            return not _is_openenv_base(klass, ("Environment", "MCPEnvironment"))
    return False
