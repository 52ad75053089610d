"""`OpenEnvScheduler`: remote environments over the OpenEnv wire protocol (ms-swift's, fixed).

Per-row ``env_config`` keys, as in ms-swift: ``base_url`` (default ``http://localhost:8000``),
``reset_kwargs``, ``system_message``; a row ``seed`` is passed to reset unless ``reset_kwargs``
already has one; ``formatter`` names the formatter of this row's observations (`envsdk.formats`).

What the model reads: each observation becomes a user message through `format_observation`,
by default `envsdk.formats.render_observation` (the observation's text; of a transcript only
what is new this turn); ``formatter="json"`` gives ms-swift's JSON dump. Replies become actions
through `envsdk.formats.parse_reply`, with the server's action schema (``GET /schema``, read
once per server when a reply is not a JSON object). Compared with ms-swift: one concurrency semaphore per scheduler (not per
batch), the async client (no blocking calls on the event loop; the blocking `OpenEnvWrapper`
runs in a worker thread when asked for), every session closed on every end, and a lost
session ends its trajectory with an error instead of continuing in a new episode.

``base_url`` (the scheduler's or a row's) may also name several servers — a list of base URLs,
a registered pool name or a replicas file (`envsdk.client.pool.PoolSpec`), or an `EnvPool`:
each episode then goes to the least-loaded server of that pool and stays there.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from envsdk.formats import ObservationFormatter, formatter_for, parse_reply
from envsdk.reasoning import split_reasoning
from envsdk.rewards.parts import REWARD_PARTS, components_from, episode_parts, evaluated
from envsdk.schedulers.base import DEFAULT_CUT_RULE, CutRule, MultiTurnScheduler, StepRecord, Trajectory, TurnResult
from envsdk.types import StepResult

if TYPE_CHECKING:
    from envsdk.client.pool import PoolSpec

__all__ = ["OpenEnvScheduler", "EnvSession", "DEFAULT_BASE_URL", "server_json"]

DEFAULT_BASE_URL = "http://localhost:8000"
#: How long one HTTP question to a server (its ``/schema``, its tool list) may take.
_HTTP_TIMEOUT_S = 10.0
_HTTP_MAX_BYTES = 4 << 20


def server_json(base_url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The JSON a server answers at `path` (GET, or POST of `body`), with ``$ENVSDK_TOKEN`` as
    bearer token when set. Blocking (call it in a thread); raises `OSError` when nothing usable
    answers and `ValueError` for a reply that is not JSON."""
    from envsdk.client.pool import health_url

    url = health_url(base_url).removesuffix("/health") + path
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("ENVSDK_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as reply:
        return json.loads(reply.read(_HTTP_MAX_BYTES))



class EnvSession(Protocol):
    """What the scheduler needs of a client: `EnvClient`'s async methods."""

    async def connect(self) -> None: ...

    async def reset(self, **kwargs: Any) -> StepResult[Any]: ...

    async def step(self, action: dict[str, Any]) -> StepResult[Any]: ...

    async def close(self) -> None: ...


class _ThreadedSession:
    """Runs a blocking client (`OpenEnvWrapper`) in worker threads, off the event loop."""

    def __init__(self, blocking_client: Any) -> None:
        self._client = blocking_client

    @property
    def server_kind(self) -> str | None:
        """``"envsdk"`` or ``"openenv"`` once connected (see `EnvClient.server_kind`)."""
        kind = getattr(self._client, "server_kind", None)
        return str(kind) if kind is not None else None

    async def connect(self) -> None:
        await asyncio.to_thread(self._client.connect)

    async def reset(self, **kwargs: Any) -> StepResult[Any]:
        result: StepResult[Any] = await asyncio.to_thread(self._client.reset, **kwargs)
        return result

    async def step(self, action: dict[str, Any]) -> StepResult[Any]:
        result: StepResult[Any] = await asyncio.to_thread(self._client.step, action)
        return result

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)


def _async_client(base_url: str) -> EnvSession:
    from envsdk.client import EnvClient

    return EnvClient(base_url)


def _threaded_client(base_url: str) -> EnvSession:
    from envsdk.client import OpenEnvWrapper

    return _ThreadedSession(OpenEnvWrapper(base_url))


@dataclass
class RemoteEpisode:
    """The per-trajectory handle: its session, the latest observation, and whatever a
    subclass keeps about the game (``game``)."""

    session: EnvSession
    base_url: str
    observation: dict[str, Any]
    last_result: StepResult[Any] | None = None
    game: Any = None
    #: The observation the model read before the current one (None until one was read).
    previous: dict[str, Any] | None = None
    #: A turn held its rollout infos back (`MultiTurnScheduler.infos_each_turn` False): the
    #: trajectory's end gives them (`OpenEnvScheduler.episode_infos`).
    infos_due: bool = False


class OpenEnvScheduler(MultiTurnScheduler):
    """Runs each trajectory in its own session of a remote (OpenEnv-compatible) server.

    ``max_concurrent_envs`` bounds how many resets and steps are in flight at once across
    every batch this scheduler runs. ``client_factory(base_url)`` makes one session client
    per trajectory (default: `envsdk.client.EnvClient`; ``use_threads=True``: the blocking
    `OpenEnvWrapper` called through `asyncio.to_thread`). A pool spec as base URL (see the
    module docstring) takes its clients from the process-wide `shared_pool` of that spec
    instead: ``client_factory`` and ``use_threads`` apply to single base URLs.

    ``formatter`` is how observations become user messages: a name registered in
    `envsdk.formats.formatters` (``"text"``, the default, or ``"json"``, ms-swift's), a
    ``"module:function"`` spec, or a function ``(observation, previous) -> str``; a row's
    ``env_config["formatter"]`` wins for that row. Override `parse_action` and
    `format_observation` to adapt it to an environment further.
    """

    def __init__(
        self,
        *,
        base_url: PoolSpec | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        system_message: str | None = None,
        max_concurrent_envs: int = 4,
        max_turns: int = 10,
        max_completion_chars: int | None = None,
        use_threads: bool = False,
        client_factory: Callable[[str], EnvSession] | None = None,
        formatter: str | ObservationFormatter | None = None,
        cut_replies: CutRule = DEFAULT_CUT_RULE,
        cut_penalty: float | None = None,
    ) -> None:
        super().__init__(
            max_turns=max_turns, max_completion_chars=max_completion_chars, cut_replies=cut_replies,
            cut_penalty=cut_penalty,
        )
        if max_concurrent_envs < 1:
            raise ValueError(f"max_concurrent_envs must be >= 1, got {max_concurrent_envs}")
        self.base_url = base_url
        self.reset_kwargs = dict(reset_kwargs or {})
        self.system_message = system_message
        self.max_concurrent_envs = max_concurrent_envs
        self.client_factory = client_factory or (_threaded_client if use_threads else _async_client)
        self.formatter: ObservationFormatter = formatter_for(formatter)
        # An override written to ms-swift's signature, format_observation(obs), gets no `previous`.
        self._format_takes_previous = _accepts(self.format_observation, "previous")
        self._custom_parse_action = type(self).parse_action is not OpenEnvScheduler.parse_action
        self._action_schemas: dict[str, dict[str, Any] | None] = {}
        # A semaphore binds to the loop that first waits on it; one per loop keeps a scheduler
        # usable across `asyncio.run` calls while every batch on a loop shares one limit.
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None

    #: False: whoever runs this scheduler keeps at most ``max_concurrent_envs`` trajectories in
    #: flight, each making one call at a time, so the limit on steps in flight cannot bind and a
    #: step does not take the semaphore (six Python calls a step). `envsdk.rollout.run_batches`
    #: sets it on the schedulers it makes and runs once each, with that many at a time.
    limit_steps: bool = True

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """The scheduler-wide limit on resets and steps in flight (shared by every batch)."""
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore = asyncio.Semaphore(self.max_concurrent_envs)
            self._semaphore_loop = loop
        return self._semaphore

    # ------------------------------------------------------------ overridable

    def parse_action(self, text: str) -> dict[str, Any]:
        """The action dict for a reply, when the action's schema is not at hand: a JSON object
        (code fence stripped) is the action, anything else ``{"message": text}``. Unless this is
        overridden, the scheduler uses `envsdk.formats.parse_reply` with the server's action
        schema instead (a text reply then fills the action's single field, whatever its name).
        Either reads the reply after any reasoning block (`envsdk.reasoning.split_reasoning`):
        a completion given whole sends its answer, not its thinking."""
        return parse_reply(split_reasoning(text)[1])

    def format_observation(self, obs: dict[str, Any], *, previous: dict[str, Any] | None = None) -> str:
        """The user message for an observation; `previous` is the observation the model read
        before it in the same episode (None at reset). Default: the scheduler's ``formatter``
        (`envsdk.formats.render_observation` unless another was chosen)."""
        return self.formatter(obs, previous)

    def observation_text(self, trajectory: Trajectory, obs: dict[str, Any]) -> str:
        """The user message for the trajectory's next observation, through the row's
        ``formatter`` or `format_observation`; remembers it as the one the model read last."""
        episode = self.episode(trajectory)
        row_formatter = trajectory.env_config.get("formatter")
        if row_formatter is not None:
            text = formatter_for(row_formatter)(obs, episode.previous)
        elif self._format_takes_previous:
            text = self.format_observation(obs, previous=episode.previous)
        else:
            text = self.format_observation(obs)
        episode.previous = obs
        return text

    async def action_for(self, trajectory: Trajectory, text: str) -> dict[str, Any]:
        """The action for a reply: `parse_action` when a subclass overrides it, else
        `envsdk.formats.parse_reply` with the server's action schema (read when first needed)."""
        if self._custom_parse_action:
            return self.parse_action(text)
        text = split_reasoning(text)[1]
        action = parse_reply(text)
        if action != {"message": text}:  # a JSON object: the action as the reply wrote it
            return action
        schema = await self.action_schema(self.episode(trajectory).base_url)
        return parse_reply(text, schema)

    async def action_schema(self, base_url: str) -> dict[str, Any] | None:
        """The action's JSON schema from the server's ``/schema``, read once per server; None
        when the server does not say (the reply's text is then sent as ``message``)."""
        if base_url not in self._action_schemas:
            try:
                schema = await asyncio.to_thread(server_json, base_url, "/schema")
            except (OSError, ValueError):
                schema = None
            action = schema.get("action") if isinstance(schema, dict) else None
            self._action_schemas[base_url] = action if isinstance(action, dict) else None
        return self._action_schemas[base_url]

    def reset_arguments(self, trajectory: Trajectory) -> dict[str, Any]:
        """Keyword arguments of the remote ``reset``: scheduler defaults, then the row's
        ``reset_kwargs``, then the row's ``seed`` unless a seed is already set."""
        config = trajectory.env_config
        kwargs = dict(self.reset_kwargs)
        row_kwargs = config.get("reset_kwargs")
        if isinstance(row_kwargs, dict):
            kwargs.update(row_kwargs)
        if "seed" in config and "seed" not in kwargs:
            kwargs["seed"] = config["seed"]
        return kwargs

    def step_info(self, result: StepResult[Any]) -> dict[str, Any]:
        """What a step record keeps as the environment's info: the observation's ``info``
        (TextArena) and the frame's metadata."""
        info: dict[str, Any] = {}
        obs = result.observation
        if isinstance(obs, dict):
            if isinstance(obs.get("info"), dict):
                info.update(obs["info"])
            if isinstance(obs.get("metadata"), dict) and obs["metadata"]:
                info["metadata"] = obs["metadata"]
        if result.metadata:
            info["frame_metadata"] = result.metadata
        return info

    # ------------------------------------------------------------ hooks

    def episode(self, trajectory: Trajectory) -> RemoteEpisode:
        episode = trajectory.runtime
        if not isinstance(episode, RemoteEpisode):
            raise RuntimeError(f"trajectory {trajectory.uuid} has no session (not started)")
        return episode

    async def open_session(self, trajectory: Trajectory) -> RemoteEpisode:
        """Connect a new session for the trajectory (under the semaphore); reset not yet sent."""
        from envsdk.client.pool import is_pool_spec, shared_pool

        spec = trajectory.env_config.get("base_url") or self.base_url or DEFAULT_BASE_URL
        if is_pool_spec(spec):
            async with self.semaphore:
                pooled = await shared_pool(spec).acquire()
            episode = RemoteEpisode(session=pooled, base_url=pooled.base_url, observation={})
            trajectory.runtime = episode
            return episode
        base_url = str(spec)
        session = self.client_factory(base_url)
        episode = RemoteEpisode(session=session, base_url=base_url, observation={})
        trajectory.runtime = episode
        async with self.semaphore:
            await session.connect()
        return episode

    async def reset_session(self, trajectory: Trajectory, **kwargs: Any) -> StepResult[Any]:
        episode = self.episode(trajectory)
        async with self.semaphore:
            result = await episode.session.reset(**kwargs)
        episode.observation = _as_dict(result.observation)
        episode.last_result = result
        trajectory.reset_info = {"observation_metadata": episode.observation.get("metadata", {}), **result.metadata}
        return result

    def first_messages(self, trajectory: Trajectory, first_user_message: str) -> list[dict[str, Any]]:
        system = trajectory.env_config.get("system_message", self.system_message)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": first_user_message})
        return messages

    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        await self.open_session(trajectory)
        await self.reset_session(trajectory, **self.reset_arguments(trajectory))
        episode = self.episode(trajectory)
        trajectory.messages = self.first_messages(trajectory, self.observation_text(trajectory, episode.observation))

    async def env_step(self, trajectory: Trajectory, action: dict[str, Any]) -> tuple[StepResult[Any], float]:
        """Send one step under the semaphore; return the result and its duration."""
        episode = self.episode(trajectory)
        started = time.perf_counter()
        if self.limit_steps:
            async with self.semaphore:
                result = await episode.session.step(action)
        else:
            result = await episode.session.step(action)
        episode.observation = _as_dict(result.observation)
        episode.last_result = result
        return result, time.perf_counter() - started

    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        action = await self.action_for(trajectory, response_text)
        result, duration = await self.env_step(trajectory, action)
        reward = float(result.reward or 0.0)
        trajectory.steps.append(
            StepRecord(
                turn=turn,
                action=action,
                observation=_as_dict(result.observation),
                reward=reward,
                done=bool(result.done),
                info=self.step_info(result),
                components=evaluated(components_from(result.metadata)),
                duration_s=duration,
            )
        )
        return self.turn_result(trajectory, bool(result.done))

    def turn_result(self, trajectory: Trajectory, done: bool, extra: dict[str, Any] | None = None) -> TurnResult:
        """A turn's result: with the episode's rollout infos (`episode_infos`, and `extra`), or,
        for a turn that does not end it while `infos_each_turn` is False, without them: the
        trajectory's end gives them then."""
        episode = self.episode(trajectory)
        episode.infos_due = not done and not self.infos_each_turn
        if episode.infos_due:
            return {"done": False}
        infos = self.episode_infos(trajectory)
        if extra:
            infos.update(extra)
        return {"done": done, "rollout_infos": infos}

    def episode_infos(self, trajectory: Trajectory) -> dict[str, Any]:
        """The episode's rollout infos as of its last step; sets its ``total_reward``. Drawn from
        the whole episode: a turn's cost grows with the turns before it."""
        trajectory.total_reward = sum(trajectory.step_rewards)
        infos: dict[str, Any] = {"total_reward": trajectory.total_reward, "step_rewards": trajectory.step_rewards}
        if any(s.components for s in trajectory.steps):
            infos[REWARD_PARTS] = episode_parts(s.components for s in trajectory.steps)
        return infos

    async def step(self, trajectory: Trajectory, turn_result: TurnResult, turn: int) -> None:
        episode = self.episode(trajectory)
        trajectory.messages.append({"role": "user", "content": self.observation_text(trajectory, episode.observation)})

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        episode = trajectory.runtime
        if isinstance(episode, RemoteEpisode):
            if episode.infos_due:
                # What the last turn held back: the episode ended by max_turns, a cut reply or an error.
                episode.infos_due = False
                trajectory.rollout_infos.update(self.episode_infos(trajectory))
            await episode.session.close()


def _accepts(method: Callable[..., Any], name: str) -> bool:
    params = inspect.signature(method).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _as_dict(observation: Any) -> dict[str, Any]:
    if isinstance(observation, dict):
        return observation
    dump = getattr(observation, "model_dump", None)
    if callable(dump):
        value = dump()
        if isinstance(value, dict):
            return value
    return {"observation": observation}
