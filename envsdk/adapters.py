"""Adapters between the two environment shapes and the wire protocol.

* `EnvEnvironment` serves any local `Env` (ms-swift style) as a server-side `Environment`:
  the action is the conversation (`ChatAction`), the observation is the env's text with its
  info and system message (`ChatObservation`). `env_app` builds the FastAPI app for it.
* `RemoteEnv` presents any remote server — envsdk or OpenEnv — as a local `Env`, through
  `EnvClient`. Against a server built by `env_app` it passes the conversation through
  unchanged, so the remote Env behaves exactly as it would in-process.
* `local_client` drives a local `Env` through the same client API with no socket (the
  in-process transport), like httpx's ``ASGITransport``.

So one scheduler code path covers local and remote environments of either shape.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import urllib.request
import uuid as uuid_module
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI
from pydantic import Field, field_validator

from envsdk.client import EnvClient, InProcessTransport
from envsdk.env import Env, Environment, RolloutRequest
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.formats import ObservationFormatter, formatter_for, observation_json
from envsdk.protocol import ErrorCode, FrameError, shorten_input
from envsdk.registry import envs
from envsdk.rewards.parts import REWARD_COMPONENTS, components_from
from envsdk.server import ServerConfig, create_app
from envsdk.server.executors import OwnLoop
from envsdk.types import Action, Observation, State, StepResult

__all__ = [
    "parse_action_text",
    "observation_json",
    "ChatAction",
    "ChatObservation",
    "EnvEnvironment",
    "env_app",
    "RemoteEnv",
    "serves_chat",
    "local_client",
    "LocalEnvClient",
]

T = TypeVar("T")


class ChatAction(Action):
    """The conversation so far; its last message is the model's latest reply."""

    messages: list[dict[str, Any]] = Field(description="The whole conversation, latest reply last")


class ChatObservation(Observation):
    """What a local `Env` answered: its text, its info dict and (after reset) its system message."""

    text: str = Field(default="", description="The observation text the model sees next")
    info: dict[str, Any] = Field(default_factory=dict, description="The env's info dict")
    system_message: str | None = Field(default=None, description="The env's system message (reset only)")

    @field_validator("info", mode="before")
    @classmethod
    def _json_safe(cls, value: Any) -> Any:
        # An env's info may hold tuples, numpy scalars, paths…: keep it rather than fail the
        # frame, in the form it will have on the wire anyway.
        return json.loads(json.dumps(value, default=str)) if isinstance(value, dict) else value


def _resolve_env_class(env: type[Env] | str) -> tuple[type[Env], str]:
    if isinstance(env, str):
        return envs[env], env
    if not (isinstance(env, type) and issubclass(env, Env)):
        raise TypeError(f"expected an Env subclass or a registered env name, got {env!r}")
    return env, env.__name__


class EnvEnvironment(Environment[ChatAction, ChatObservation, State]):
    """One session of a local `Env` served as an `Environment`.

    ``reset`` carries the dataset row: ``messages``, ``data_dict`` (whose ``env_config`` the
    env is built with), ``env_config`` (merged over ``data_dict["env_config"]``), ``uuid``;
    ``seed``, when given, overrides ``env_config["seed"]``. Each reset builds a fresh env
    instance (closing the previous one), as ms-swift does per trajectory. ``step`` passes the
    conversation to ``env.step``. A step after ``done`` raises `EpisodeDoneError` here, whatever
    the env would do (the `Env` contract), and on any transport.

    Where the Env's code runs: an `Env`'s methods are ``async def`` by contract, but nothing
    stops one from doing sync work in them, so they are not trusted with the server's event
    loop. ``reset``, ``step`` and ``close`` are plain methods, which the server runs on the
    session's lane thread under their deadlines (`envsdk.server.executors`); each runs the Env's
    coroutine to completion on an event loop of this instance's own, made on first use. Every
    call of a session runs on its lane, hence on one thread and one loop, so whatever an Env
    keeps between calls that belongs to its loop (queues, locks, open connections) stays valid.
    ``close`` closes the Env on that loop, then the loop. Called inside a running event loop
    (the server's ``inline_sync`` mode, or a coroutine calling it directly), they return the
    coroutine for that loop to await instead. A ``close`` from another thread while a call is
    still running (one written off by its deadline) does not wait: the Env and the loop are
    closed on the call's thread once it returns; the server cancels such a call's coroutine
    (`own_loop`), so one that awaits past its deadline returns at once.
    """

    def __init__(self, env_cls: type[Env]) -> None:
        self.env_cls = env_cls
        self._env: Env | None = None
        self._done = False
        self._state = State()
        #: This instance's event loop; the server cancels the call running on it when the
        #: call's deadline writes it off (`OwnLoop.cancel`), so the lane's thread is freed.
        self.own_loop = OwnLoop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T | Coroutine[Any, Any, T]:
        """`coro` run to completion on this instance's loop; `coro` itself inside a running loop."""
        return self.own_loop.run(coro)

    def _last_close(self) -> Coroutine[Any, Any, None] | None:
        """The Env's close, run on the loop as it shuts down; None when there is no Env."""
        return self._close_env() if self._env is not None else None

    # The row's keys are named, not swallowed by **kwargs: the server refuses unknown reset
    # arguments by this signature, so a misspelt key is an error rather than silently lost.
    def reset(  # type: ignore[override]
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        data_dict: dict[str, Any] | None = None,
        env_config: dict[str, Any] | None = None,
        uuid: str | None = None,
    ) -> ChatObservation | Coroutine[Any, Any, ChatObservation]:
        return self._run(self._reset(seed, episode_id, messages, data_dict, env_config, uuid))

    async def _reset(
        self,
        seed: int | None,
        episode_id: str | None,
        messages: list[dict[str, Any]] | None,
        data_dict: dict[str, Any] | None,
        env_config: dict[str, Any] | None,
        uuid: str | None,
    ) -> ChatObservation:
        row = dict(data_dict or {})
        config = dict(row.get("env_config") or {})
        config.update(env_config or {})
        if seed is not None:
            config["seed"] = seed
        row["env_config"] = config
        request = RolloutRequest(
            messages=list(messages or []),
            data_dict=row,
            uuid=uuid or episode_id or uuid_module.uuid4().hex,
        )
        await self._close_env()
        self._done = False
        self._state = State(episode_id=episode_id or request.uuid, step_count=0)
        try:
            self._env = self.env_cls(config)
            observation, info, system_message = await self._env.reset(request)
        except (ValueError, TypeError) as exc:
            # An Env refuses a config it cannot play ({"size": 100000}, {"size": "big"}) with a
            # ValueError or TypeError, as `envsdk rollout`'s pre-flight reads it too: the client
            # is told its request was invalid, not that the env broke.
            raise FrameError(
                ErrorCode.VALIDATION_ERROR, f"{self.env_cls.__name__} refuses its reset: {shorten_input(str(exc))}"
            ) from exc
        return ChatObservation(text=observation, info=info, system_message=system_message, reward=0.0)

    def step(self, action: ChatAction) -> ChatObservation | Coroutine[Any, Any, ChatObservation]:
        env = self._env
        if env is None:
            raise NotResetError("EnvEnvironment.step called before reset", ErrorCode.NOT_RESET.value)
        if self._done:
            raise EpisodeDoneError(
                f"the {self.env_cls.__name__} episode is over; reset before stepping again", ErrorCode.EPISODE_DONE.value
            )
        return self._run(self._step(env, action))

    async def _step(self, env: Env, action: ChatAction) -> ChatObservation:
        observation, reward, done, info = await env.step(action.messages)
        self._done = bool(done)
        self._state.step_count += 1
        # The env's rubric parts go where every client looks for them: the observation metadata.
        parts = components_from(info)
        metadata = {REWARD_COMPONENTS: parts} if parts is not None else {}
        return ChatObservation(text=observation, info=info, reward=float(reward), done=bool(done), metadata=metadata)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> Coroutine[Any, Any, None] | None:
        if self.own_loop.close_later(self._last_close):  # a call still runs on another thread
            return None
        if _running_loop() is not None:
            return self._close_env()
        self.own_loop.shut_down(self._last_close)
        return None

    async def _close_env(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await env.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def env_app(env: type[Env] | str, *, config: ServerConfig | None = None, **server_options: Any) -> FastAPI:
    """The FastAPI app serving `env` (an `Env` subclass or a registered name) over ``/ws``.

    `config` and `server_options` are those of `envsdk.server.create_app` (for example
    ``max_concurrent_envs=64``); the app is named after the env unless ``env_name`` is given.
    """
    env_cls, name = _resolve_env_class(env)
    if "env_name" not in server_options and (config is None or config.env_name is None):
        server_options["env_name"] = name

    def factory() -> EnvEnvironment:
        return EnvEnvironment(env_cls)

    return create_app(factory, ChatAction, ChatObservation, config=config, **server_options)


class LocalEnvClient(EnvClient):
    """An `EnvClient` that owns its in-process transport: ``close`` also shuts the app down."""

    async def close(self) -> None:
        await super().close()
        if isinstance(self.transport, InProcessTransport):
            await self.transport.aclose()


def local_client(env: type[Env] | str, **server_options: Any) -> LocalEnvClient:
    """A client of `env` served in this process with no socket; the same API as a remote one.

    `server_options` go to `env_app`. Close the client to close the env and the app.
    """
    app = env_app(env, **server_options)
    return LocalEnvClient("http://in-process", transport=InProcessTransport(app))


_CODE_FENCE = re.compile(r"^\s*```[\w+-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def parse_action_text(text: str) -> dict[str, Any]:
    """ms-swift's default action parsing: strip a code fence; a JSON object is the action,
    anything else becomes ``{"message": text}``."""
    fenced = _CODE_FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        parsed = json.loads(body)
    except ValueError:
        return {"message": text}
    return parsed if isinstance(parsed, dict) else {"message": text}


def _http_url(base_url: str, path: str) -> str:
    parts = urlsplit(base_url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/ws"):
        prefix = prefix[: -len("/ws")]
    return urlunsplit((scheme, parts.netloc, prefix + path, "", ""))


#: Most bytes of a ``/schema`` answer read: a schema is a few KiB; a peer decides the size.
_SCHEMA_MAX_BYTES = 4 << 20


def _serves_chat(schema: dict[str, Any]) -> bool:
    action = set((schema.get("action") or {}).get("properties") or {})
    observation = set((schema.get("observation") or {}).get("properties") or {})
    return "messages" in action and {"text", "info", "system_message"} <= observation


def serves_chat(base_url: str, timeout_s: float = 10.0) -> bool:
    """Whether the server at `base_url` serves a local `Env` through `env_app` (its ``/schema``
    has the conversation action and text observation), so that `RemoteEnv` plays it in chat
    mode; False when it is another server or does not answer."""
    import os

    token = os.environ.get("ENVSDK_TOKEN")
    request = urllib.request.Request(
        _http_url(base_url, "/schema"), headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return _serves_chat(dict(json.loads(response.read(_SCHEMA_MAX_BYTES))))
    except (OSError, ValueError, TypeError):
        return False


class RemoteEnv(Env):
    """Any remote environment server as a local `Env`.

    ``env_config``: ``base_url`` (default ``http://localhost:8000``), ``reset_kwargs`` (sent
    with every reset; ``seed`` from ``env_config`` is added unless given), ``system_message``
    (returned by ``reset`` for action-style servers), ``mode``: ``"chat"`` when the server is
    an `env_app` (the conversation is passed through and the remote Env's own text, info and
    system message come back), ``"action"`` for any other server (the latest reply becomes an
    action through `parse_action`, observations become text through `format_observation`),
    or ``"auto"`` (default: read the server's ``/schema`` once); ``formatter``: how an
    action-style server's observations become text, as in the schedulers: a name registered
    in `envsdk.formats.formatters` (``"text"``, the default, `envsdk.formats.render_observation`
    with the episode's previous observation; ``"json"``, ms-swift's JSON dump) or a
    ``"module:function"`` spec. The ``formatter`` keyword (a name, spec or function
    ``(observation, previous) -> str``) is the default a row's ``env_config["formatter"]``
    overrides.

    Each `RemoteEnv` holds one session; ``close`` ends it. Steps after ``done`` raise
    `EpisodeDoneError` whatever the server does.
    """

    CONFIG_KEYS = frozenset({"base_url", "reset_kwargs", "system_message", "mode", "formatter"})

    def __init__(
        self, env_config: dict[str, Any] | None = None, *, formatter: str | ObservationFormatter | None = None
    ) -> None:
        super().__init__(env_config)
        self.formatter: ObservationFormatter = formatter_for(self.env_config.get("formatter", formatter))
        # An override written to the one-argument signature, format_observation(observation),
        # gets no `previous`.
        self._format_takes_previous = "previous" in inspect.signature(self.format_observation).parameters
        #: The observation the model read last in this episode (None before the first).
        self._previous: dict[str, Any] | None = None
        self.base_url: str = str(self.env_config.get("base_url", "http://localhost:8000"))
        self.mode: str = str(self.env_config.get("mode", "auto"))
        if self.mode not in ("auto", "chat", "action"):
            raise ValueError(f"RemoteEnv mode must be 'auto', 'chat' or 'action', got {self.mode!r}")
        self.client: EnvClient | None = None
        self._done = False

    def parse_action(self, text: str) -> dict[str, Any]:
        """The action for a reply (see `parse_action_text`); override to adapt."""
        return parse_action_text(text)

    def format_observation(self, observation: Any, previous: dict[str, Any] | None = None) -> str:
        """The text the model sees for an observation body; `previous` is the one it read
        before in this episode (None at reset). Default: the ``formatter``."""
        return self.formatter(observation, previous)

    def _observation_text(self, observation: Any) -> str:
        text = (
            self.format_observation(observation, self._previous)
            if self._format_takes_previous
            else self.format_observation(observation)
        )
        self._previous = observation if isinstance(observation, dict) else None
        return text

    async def _detect_mode(self) -> str:
        if self.mode != "auto":
            return self.mode

        # No /schema (or not JSON): not an env_app, so speak plain actions.
        self.mode = "chat" if await asyncio.to_thread(serves_chat, self.base_url) else "action"
        return self.mode

    async def reset(self, config: RolloutRequest) -> tuple[str, dict[str, Any], str | None]:
        mode = await self._detect_mode()
        if self.client is None:
            self.client = EnvClient(self.base_url)
        kwargs = dict(self.env_config.get("reset_kwargs") or {})
        if "seed" in self.env_config:
            kwargs.setdefault("seed", self.env_config["seed"])
        self._done = False
        if mode == "chat":
            result = await self.client.reset(
                messages=config.messages, data_dict=config.data_dict, uuid=config.uuid, **kwargs
            )
            body = result.observation
            return str(body.get("text", "")), dict(body.get("info") or {}), body.get("system_message")
        result = await self.client.reset(**kwargs)
        info = {"observation": result.observation, "metadata": result.metadata}
        self._previous = None
        return self._observation_text(result.observation), info, self.env_config.get("system_message")

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        if self.client is None:
            raise NotResetError("RemoteEnv.step called before reset", ErrorCode.NOT_RESET.value)
        if self._done:
            raise EpisodeDoneError(
                "the remote episode is over; reset before stepping again", ErrorCode.EPISODE_DONE.value
            )
        result: StepResult[Any]
        if self.mode == "chat":
            result = await self.client.step({"messages": messages})
            body = result.observation
            text, info = str(body.get("text", "")), dict(body.get("info") or {})
        else:
            reply = str(messages[-1].get("content", "")) if messages else ""
            result = await self.client.step(self.parse_action(reply))
            text = self._observation_text(result.observation)
            info = {"observation": result.observation, "metadata": result.metadata}
            parts = components_from(result.metadata)
            if parts is not None:
                info[REWARD_COMPONENTS] = parts
        self._done = result.done
        return text, float(result.reward or 0.0), result.done, info

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()
