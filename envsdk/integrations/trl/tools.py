"""TRL's ``environment_factory`` for any tool environment: the tools the server lists over MCP
become the environment class's methods, with no adapter written by hand.

`tool_environment_factory(base_url)` asks the server for its tools once (MCP ``tools/list``),
then builds a class whose public methods are those tools: each has the tool's parameters (typed
from the JSON schema) and a Google-style docstring (from the descriptions), which is what TRL
renders into the prompt. A method call is an MCP ``tools/call`` on the instance's own session.
Works against envsdk and OpenEnv 0.10 servers alike (envsdk tool envs and OpenEnv
``MCPEnvironment``s).

TRL renders the calls and results as native tool turns (an assistant message's ``tool_calls``,
then one ``tool`` message per call): the conversation `envsdk.schedulers.ToolScheduler` records
for a policy that calls tools natively, with the same result text. A tool that fails reaches the
model as TRL words it (``{'error': …}``), where envsdk's records say ``error: …``.

Rewards: ``get_reward()`` reads the episode's ``reward`` from the env's state (the tool env's
contract: put the episode reward in the state), NaN when the state has none, and releases the
session; TRL calls it once per rollout after generation. TRL ends a rollout when the model stops
calling tools, which is the agent saying it is done: so when the env offers a ``submit`` tool
that takes no argument (it judges the work when called, as a Harbor task does) and its state
does not say the episode is over (``done``), ``get_reward()`` calls ``submit`` first, as
`envsdk.schedulers.ToolScheduler` does, and the reward is the env's verdict.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
from collections.abc import Callable
from typing import Any

from envsdk.client.sync import OpenEnvWrapper
from envsdk.errors import CapacityError, ToolCallError
from envsdk.integrations.trl._common import (
    EnvironmentCapacityError,
    EpisodeError,
)
from envsdk.integrations.trl.environment_factory import PooledFactory
from envsdk.schedulers.tools import SUBMIT_TOOL
from envsdk.tools import RESERVED_TOOL_NAMES, ToolSpec

__all__ = ["ToolEnvironment", "ToolEnvironmentFactory", "tool_environment_factory"]

_JSON_TYPES: dict[str, type] = {
    "integer": int, "number": float, "string": str, "boolean": bool, "array": list, "object": dict,
}
# Method names TRL treats specially, or that the class itself uses.
_TAKEN = frozenset({"reset", "get_reward", "close"}) | RESERVED_TOOL_NAMES


class ToolEnvironment:
    """One TRL environment instance: a session on the server, reset per dataset row; its tool
    methods are added by `tool_environment_factory`."""

    def __init__(self, factory: ToolEnvironmentFactory) -> None:
        self._factory = factory
        self._client: OpenEnvWrapper | None = None
        self.calls = 0

    def reset(self, **row: Any) -> str | None:
        """Open a fresh session and reset it with the row's ``seed`` (if any) and the factory's
        ``reset_kwargs``; return the first observation as text (its ``prompt`` field if it has
        one, else its ``text`` field, else the observation as JSON)."""
        self._release()
        client = OpenEnvWrapper(self._factory.base_url, call_timeout=self._factory.call_timeout, **self._factory.client_kwargs)
        kwargs = dict(self._factory.reset_kwargs)
        if row.get("seed") is not None:
            kwargs.setdefault("seed", row["seed"])
        try:
            result = client.reset(**kwargs)
        except CapacityError as exc:
            client.close()
            raise EnvironmentCapacityError(
                f"{exc.message}: TRL resets all {self._factory.instances} pooled environment instances of a "
                f"generation batch at once; raise MAX_CONCURRENT_ENVS on {self._factory.base_url} to at least "
                f"{self._factory.sessions_needed}",
                needed=self._factory.sessions_needed,
                base_url=self._factory.base_url,
            ) from None
        self._client = client
        observation = result.observation
        if isinstance(observation, dict):
            for name in ("prompt", "text"):
                if isinstance(observation.get(name), str):
                    return str(observation[name])
        return json.dumps(observation, default=str)

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        client = self._client
        if client is None:
            raise EpisodeError("reset() must be called before the first tool call")
        self.calls += 1
        value = client.call_tool(name, **arguments)
        # The text `envsdk rollout` gives the model for the same value (`envsdk.formats.tool_result_text`).
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)

    def get_reward(self) -> float:
        """The episode's ``reward`` from the env's state (NaN when absent); releases the session.
        Calls the env's argument-free ``submit`` first when the state does not say the episode
        is over (see the module docstring)."""
        client = self._client
        if client is None:
            return math.nan
        try:
            state = client.state()
            if self._factory.submits and state.get("done") is not True:
                # The env refused or failed to judge: its state says what it has.
                with contextlib.suppress(ToolCallError):
                    self._call(SUBMIT_TOOL, {})
                state = client.state()
            reward = state.get("reward")
        finally:
            self._release()
        return float(reward) if isinstance(reward, (int, float)) else math.nan

    def _release(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def _tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method with the tool's signature and a docstring TRL can render."""
    properties: dict[str, Any] = dict(spec.input_schema.get("properties") or {})
    required = set(spec.input_schema.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    # Required parameters first: a Python signature cannot put them after defaulted ones.
    for name in sorted(properties, key=lambda n: n not in required):
        schema = properties[name] if isinstance(properties[name], dict) else {}
        annotation = _JSON_TYPES.get(str(schema.get("type")), str)
        annotations[name] = annotation
        default = inspect.Parameter.empty if name in required else schema.get("default")
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation))
        lines.append(f"    {name}: {schema.get('description') or schema.get('title') or name}")
    annotations["return"] = str
    summary = (spec.description or spec.name).strip()
    doc = summary if not lines else f"{summary}\n\nArgs:\n" + "\n".join(lines)
    tool_name = spec.name

    def method(self: ToolEnvironment, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self._call(tool_name, arguments)

    signature = inspect.Signature(params, return_annotation=str)
    method.__name__ = method.__qualname__ = tool_name
    method.__doc__ = doc
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    return method


class ToolEnvironmentFactory(PooledFactory[ToolEnvironment]):
    """A `PooledFactory` of `ToolEnvironment` instances (of `environment_class`, with the
    server's tools as methods), each holding one session of the server at `base_url`."""

    def __init__(
        self,
        base_url: str,
        environment_class: type[ToolEnvironment],
        *,
        reset_kwargs: dict[str, Any] | None = None,
        call_timeout: float | None = None,
        num_processes: int | None = None,
        client_kwargs: dict[str, Any] | None = None,
        submits: bool = False,
    ) -> None:
        super().__init__(environment_class, call_timeout=call_timeout, num_processes=num_processes)
        self.base_url = base_url
        self.reset_kwargs = dict(reset_kwargs or {})
        self.client_kwargs = dict(client_kwargs or {})
        #: Whether the env offers an argument-free ``submit`` (`ToolEnvironment.get_reward` calls it).
        self.submits = submits

    @property
    def tool_calls(self) -> int:
        """Tool calls made by every instance so far."""
        return sum(instance.calls for instance in self._instances)


def tool_environment_factory(
    base_url: str,
    *,
    reset_kwargs: dict[str, Any] | None = None,
    call_timeout: float | None = None,
    class_name: str | None = None,
    **client_kwargs: Any,
) -> ToolEnvironmentFactory:
    """An ``environment_factory`` for the tool environment served at `base_url`: lists its
    tools over MCP now and makes them the methods of a new `ToolEnvironment` subclass (named
    `class_name`, default ``"ToolEnvironment"``; TRL names the reward column after it). `client_kwargs` go to each instance's `OpenEnvWrapper`."""
    with OpenEnvWrapper(base_url, call_timeout=call_timeout, **client_kwargs) as probe:
        tools = probe.list_tools()
    if not tools:
        raise ValueError(f"{base_url} lists no tools: it is not a tool environment")
    clashes = sorted(t.name for t in tools if t.name in _TAKEN or t.name.startswith("_"))
    if clashes:
        raise ValueError(f"tools {clashes} cannot become TRL environment methods (names reserved or private)")
    name = class_name or "ToolEnvironment"
    environment_class = type(name, (ToolEnvironment,), {t.name: _tool_method(t) for t in tools})
    submits = any(t.name == SUBMIT_TOOL and not t.input_schema.get("required") for t in tools)
    return ToolEnvironmentFactory(
        base_url, environment_class, reset_kwargs=reset_kwargs, call_timeout=call_timeout, client_kwargs=client_kwargs,
        submits=submits,
    )
