"""MCP on envsdk's server, on OpenEnv 0.10's wire: tool environments served to any MCP client.

Routes and frames (all answer the JSON-RPC 2.0 methods ``tools/list``, ``tools/call``,
``openenv/session/create`` and ``openenv/session/close``; any other method: -32601):

* ``POST /mcp`` — one JSON-RPC request per HTTP request. With ``params.session_id`` it runs
  on that session; without, on a throw-away env (built, called, closed), as OpenEnv does.
* ``WS /mcp`` — a session per socket (capacity applies), JSON-RPC requests as text frames.
* ``{"type": "mcp", "data": <request>}`` on ``/ws`` — on the socket's session; the reply is
  ``{"type": "mcp", "data": <response>}``, and an envsdk request ``id`` makes it exactly-once.
* step actions ``{"type": "list_tools"}`` and ``{"type": "call_tool", "tool_name": …,
  "arguments": {…}}`` on a tool env (see "Tool step actions" below).

Layering
--------
MCP sits above the sessions: `mount_mcp` gives the `SessionTable` the ``mcp`` request type, the
tool step actions and a hook run before an env is closed; the sessions know nothing of MCP. A
tool call is an env call like any other: it goes through `Session.call_env` (the session's lane
for a plain function, the loop for a coroutine function; a deadline; a hung call written off
and counted), inside one of the session's requests (its turn held, its reply recorded).

Tool step actions
-----------------
On an OpenEnv ``MCPEnvironment`` a step action is a step, as under OpenEnv's server: the action
(OpenEnv's ``CallToolAction`` / ``ListToolsAction``) goes to the env's ``step_async`` (every
``MCPEnvironment`` has one; OpenEnv's server calls it too), under the step deadline, and the
observation it returns is the reply, with its reward and done: an env that counts steps or ends
the episode on a submit tool (as OpenEnv's FinQA env does) works. Only ``tools/call`` (``POST
/mcp``, ``WS /mcp``, the ``mcp`` frame) calls the tool directly. An envsdk ``@tool`` env has no
step that takes a tool action (its ``step`` takes its own action type): there, every route,
step actions included, calls the tool method itself, and the reply is a tool observation with
``reward: null`` and ``done: false`` that leaves the episode's phase alone; such an env scores
through its own ``step``. Tool step actions need no reset (as in OpenEnv), but an env written
off by a deadline answers NOT_RESET until the next reset.

How tools run
-------------
An envsdk ``@tool`` method runs like ``step`` (a plain method on the session's lane, a
coroutine on the loop) under the ``tool`` deadline (``tool_timeout_s`` of the env class, else
the step's). An OpenEnv ``MCPEnvironment``'s tools are reached through its FastMCP client
session (``env.mcp_session()``), held open for the env's life as OpenEnv holds it, so FastMCP's
middleware and per-session state behave as under OpenEnv; but each of its function tools runs
as an env call of the session: the first time envsdk serves an env of a FastMCP server, it
swaps each function tool's function for a coroutine that hands the original to
`Session.call_env` (a plain function goes to the session's lane, never to anyio's shared
worker threads, where a hung call would keep its thread uncounted and starve static files and
other sessions' tools). The direct call, and a tool step, are bounded as a whole by their
deadline plus `_GRACE_S` (FastMCP's own work); the tool call inside has its own deadline.

Limits, as on the step path
---------------------------
A tool's arguments are checked against a model of its signature before anything runs: at most
20 errors then ``errors_omitted`` (`envsdk.protocol.validate_model`), unknown keys counted rather
than listed one by one. Client input echoed in an error (a method, a tool name, a session id) is
cut at 256 characters; an error message of the env's or FastMCP's is cut at
`MAX_ERROR_MESSAGE_CHARS`. Request bodies and frames are parsed by pydantic-core's parser: a lone
surrogate or nesting past 200 levels is a parse error (-32700); an ``id`` that is not a string
of at most 256 characters, a number or null is an invalid request (-32600). JSON-RPC errors are
never HTTP errors, and a ``WS /mcp`` socket always ends with a close frame.

Sessions created over MCP, and OpenEnv's ``/ws?session_id=`` attach
---------------------------------------------------------------------
``openenv/session/create`` opens a session with no socket and answers a ``session_id`` handle:
the session's id and a 256-bit token of its own, joined by a dot. OpenEnv's ``MCPToolClient``
passes that handle back in ``params.session_id`` and in ``/ws?session_id=``; the server checks
its token in constant time. It is the creator's credential for the session's life, as OpenEnv's
session id is, and it is separate from envsdk's resume token, which still rotates on every
resume: a resume with ``session_id`` and ``resume_token`` works on such a session as on any
other, and neither credential opens the other's door wider. Such a session is resumable from
birth: while no socket is attached it lives for ``resume_window_s`` after its last MCP call, and
when every slot is taken it gives its slot up to a newcomer like any session with no socket
(the one unused longest goes first); one with a socket attached keeps it.
``openenv/session/close`` on a session with a socket attached answers ``closing: true`` and the
session ends when that socket goes; a ``close`` frame on such a socket only detaches it (the
session is the creator's to close), as in OpenEnv. ``openenv/session/create`` sent on a
session's own socket answers that session's handle and makes it resumable, like the session
handshake.

Needs the ``fastmcp`` package (``pip install -e '.[mcp]'`` in the envsdk clone, or ``pip install fastmcp``) for tool environments only.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import secrets
import typing
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, WebSocket
from pydantic import BaseModel, ConfigDict, create_model
from pydantic_core import from_json

from envsdk.protocol import (
    MAX_ECHOED_CHARS,
    ErrorCode,
    FrameError,
    McpRequest,
    dumps,
    encode_mcp,
    encode_observation,
    frame_size,
    shorten_input,
    validate_model,
)
from envsdk.tools import tool_methods, tool_signature

if TYPE_CHECKING:
    from envsdk.server.sessions import Session, SessionTable

__all__ = [
    "MCP_PATH",
    "MAX_ERROR_MESSAGE_CHARS",
    "answer",
    "created_over_mcp",
    "describe_tools",
    "env_call",
    "is_tool_action",
    "mount_mcp",
    "release",
    "attach_target",
    "step_tool_action",
    "tools_of",
]

logger = logging.getLogger("envsdk.server")

MCP_PATH = "/mcp"

MAX_ERROR_MESSAGE_CHARS = 1024
"""Longest error message of an env's or FastMCP's passed on to a client (the rest is counted)."""

# JSON-RPC 2.0 error codes (the values of `mcp.types`' constants; a test pins them). The
# envelope is built here, not with the `mcp` package, so that every envsdk server answers /mcp
# (OpenEnv's validator requires it) without that optional dependency; tool envs need it.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603,
)
SERVER_ERROR = -32000

_HANDLE_SEPARATOR = "."
_TOOL_ACTIONS = frozenset({"list_tools", "call_tool"})
# What a direct tool call or a tool step through an MCPEnvironment's FastMCP session may take
# beyond its deadline: the tool inside has the deadline itself, this bounds FastMCP's own work.
_GRACE_S = 2.0

# The session a native tool method is being called for (set around each call, read by the
# method's FastMCP wrapper, so one FastMCP server per env class serves every instance).
_CALLER: contextvars.ContextVar[Session | None] = contextvars.ContextVar("envsdk_tool_caller", default=None)
# The tools of the env whose FastMCP client session is serving a call: set in the task that holds
# that client session open (`_hold`), so every task of FastMCP's in-memory server for it inherits
# it; read by the function tools envsdk routed (`_routed_tool`).
_HOLDER: contextvars.ContextVar[_McpEnvTools | None] = contextvars.ContextVar("envsdk_mcp_holder", default=None)


async def env_call(session: Session, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` as one ``tool`` call of `session`'s env, by the execution core's
    `Session.call_env`: on the session's lane (a coroutine function on the loop), under the
    deadline of ``tool`` calls (``tool_timeout_s``, else the step's), a timed-out call ending the
    episode as a timed-out step does. Every tool call runs inside one of the session's requests
    (a ``/ws`` frame or ``/mcp`` call taken through `Session.handle`), which holds its turn and
    records its reply. Raises `FrameError` (TIMEOUT, EXECUTION_ERROR, CAPACITY_REACHED,
    SHUTTING_DOWN)."""
    return await session.call_env("tool", fn, args, kwargs)


def _cut(message: str) -> str:
    """`message` (an env's or FastMCP's words) cut at `MAX_ERROR_MESSAGE_CHARS`."""
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_ERROR_MESSAGE_CHARS]}... ({len(message) - MAX_ERROR_MESSAGE_CHARS} more characters)"


def _shown(value: Any) -> str:
    """Client input as an error names it: at most `MAX_ECHOED_CHARS` characters of it."""
    return str(shorten_input(value if isinstance(value, str) else repr(shorten_input(value))))


# ---------------------------------------------------------------- the MCP side of an env


class _ToolCallFailed(Exception):
    """A tool call that failed for a reason the caller should read (JSON-RPC code + message)."""

    def __init__(self, code: int, message: str, error_type: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.error_type, self.data = code, message, error_type, data


def _not_found(name: str) -> _ToolCallFailed:
    return _ToolCallFailed(INTERNAL_ERROR, f"Unknown tool: {_shown(name)!r}", "tool_not_found")


def _check_arguments(name: str, model: type[BaseModel] | None, arguments: dict[str, Any]) -> None:
    """Refuse `arguments` that `model` (of the tool's signature) refuses, with the step path's
    bounded error list; nothing when the tool's signature could not be modelled."""
    if model is None:
        return
    try:
        validate_model(model, arguments)
    except FrameError as exc:
        errors = exc.details.get("errors") or []
        omitted = exc.details.get("errors_omitted", 0)
        what = exc.message.partition(": ")[2].replace("unknown field(s)", "unknown argument(s)")
        data: dict[str, Any] = {"code": ErrorCode.VALIDATION_ERROR.value, "errors": errors}
        if omitted:
            data["errors_omitted"] = omitted
        raise _ToolCallFailed(
            INTERNAL_ERROR, f"Invalid arguments for tool {_shown(name)!r}: {_cut(what)}", "invalid_args", data
        ) from None


def _arguments_model(name: str, signature: inspect.Signature) -> type[BaseModel] | None:
    """A model of a tool's keyword arguments (`signature`: annotations resolved, without the
    parameters FastMCP injects), unknown keys refused; None when it cannot be modelled (a
    ``*args``/``**kwargs`` or positional-only parameter, a name pydantic reserves): FastMCP's
    own check then stands alone."""
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            return None
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        fields[param.name] = (annotation, ... if param.default is inspect.Parameter.empty else param.default)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a parameter named like a BaseModel attribute
            return create_model(
                f"{name}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
                **fields,
            )
    except Exception as exc:
        logger.debug("the arguments of tool %r cannot be modelled (%r); FastMCP checks them alone", name, exc)
        return None


class _Tools:
    """How one env's tools are listed and called (see `_NativeTools`, `_McpEnvTools`)."""

    async def list(self) -> list[dict[str, Any]]:
        """``tools/list``'s tools, as MCP ``Tool`` objects in JSON."""
        raise NotImplementedError

    async def check(self, name: str, arguments: dict[str, Any]) -> None:
        """Raise `_ToolCallFailed` for an unknown tool or arguments its signature refuses."""
        raise NotImplementedError

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def release(self) -> None:
        """Let go of whatever the tools hold open (called before the env is closed)."""

    async def call(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's MCP result as OpenEnv sends it; raises `_ToolCallFailed` (messages and
        echoes bounded)."""
        from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
        from pydantic import ValidationError as ArgumentsError

        session.table.metrics.tool_calls += 1
        await self.check(name, arguments)
        try:
            return await self._invoke(session, name, arguments)
        except FrameError as exc:
            raise _failed_frame(name, exc) from None
        except NotFoundError:
            raise _not_found(name) from None
        except (ValidationError, ArgumentsError) as exc:
            raise _ToolCallFailed(
                INTERNAL_ERROR, f"Invalid arguments for tool {_shown(name)!r}: {_cut(str(exc))}", "invalid_args"
            ) from None
        except ToolError as exc:
            if isinstance(exc.__cause__, FrameError):
                raise _failed_frame(name, exc.__cause__) from None
            message = str(exc)
            kind = "tool_not_found" if message.startswith("Unknown tool") else "execution_error"
            raise _ToolCallFailed(INTERNAL_ERROR, _cut(message), kind) from None
        except Exception as exc:
            raise _ToolCallFailed(
                INTERNAL_ERROR, f"Error calling tool {_shown(name)!r}: {_cut(str(exc))}", "execution_error"
            ) from None


class _NativeTools(_Tools):
    """envsdk ``@tool`` methods of one env class: a FastMCP server built once for the class
    gives the schemas and checks the arguments (with the pydantic adapter FastMCP builds for
    the tool); the method runs through `env_call` on the calling session's env. A plain value
    (str, int, float, bool) is shaped into the result FastMCP's conversion gives (anything else
    goes through that conversion), so a tool call costs about what a step costs."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._tools: dict[str, Any] | None = None
        self._listed: list[dict[str, Any]] | None = None
        self._models: dict[str, type[BaseModel] | None] = {}

    async def tools(self) -> dict[str, Any]:
        if self._tools is None:
            self._tools = {t.name: t for t in await self.server.list_tools()}
        return self._tools

    async def list(self) -> list[dict[str, Any]]:
        if self._listed is None:
            self._listed = [t.to_mcp_tool().model_dump(mode="json") for t in (await self.tools()).values()]
        return self._listed

    async def check(self, name: str, arguments: dict[str, Any]) -> None:
        found = (await self.tools()).get(name)
        if found is None:
            raise _not_found(name)
        if name not in self._models:
            self._models[name] = _arguments_model(name, inspect.signature(found.fn))
        _check_arguments(name, self._models[name], arguments)

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from fastmcp.utilities.types import get_cached_typeadapter

        found = (await self.tools())[name]
        adapter = get_cached_typeadapter(found.fn)  # cached per function by FastMCP
        token = _CALLER.set(session)
        try:
            value = await adapter.validate_python(arguments)
        finally:
            _CALLER.reset(token)
        schema = found.output_schema
        plain = type(value) in _PLAIN and not (isinstance(value, float) and not math.isfinite(value))
        if plain and isinstance(schema, dict) and schema.get("x-fastmcp-wrap-result"):
            text = value if isinstance(value, str) else dumps(value)
            return {
                "content": [{"type": "text", "text": text, "annotations": None, "meta": None}],
                "structured_content": {"result": value},
                "meta": {"fastmcp": {"wrap_result": True}},
                "data": value,
                "is_error": False,
            }
        return _result_payload(found.convert_result(value))


_PLAIN = (str, int, float, bool)


class _McpEnvTools(_Tools):
    """An OpenEnv ``MCPEnvironment`` instance's tools, reached as OpenEnv reaches them: through
    the env's FastMCP client session (``env.mcp_session()``), held open for the env's life, so
    FastMCP's per-session state (``ctx.set_state``) and middleware behave as under OpenEnv. Its
    function tools run as env calls of the session (`_route_to_lanes`).

    The session is entered and left in one task of its own (`_hold`): never in a request's task,
    which the server may cancel."""

    def __init__(self, env: Any) -> None:
        self.server = env.mcp_server
        self._env = weakref.ref(env)
        self._client: asyncio.Future[Any] | None = None
        self._holder: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._models: dict[str, type[BaseModel] | None] = {}
        self._names: frozenset[str] | None = None
        # The session this env belongs to (an env has one for its life), for the routed tools.
        self._session: weakref.ref[Session] | None = None
        # The FrameError of the last routed tool call that failed (one call at a time per session),
        # and an event set when that error ends the call (a deadline, no lane): the caller stops
        # waiting for FastMCP then, which would tear the written-off env's session down first.
        self.failure: FrameError | None = None
        self.ended = asyncio.Event()

    @property
    def session(self) -> Session | None:
        return self._session() if self._session is not None else None

    def serve(self, session: Session) -> None:
        """The calls that follow are `session`'s (its env is this one)."""
        self._session = weakref.ref(session)
        self.failure = None
        self.ended.clear()

    def fail(self, exc: FrameError) -> None:
        """A routed tool call met `exc` (see `raise_failure`)."""
        self.failure = exc
        if exc.code is not ErrorCode.EXECUTION_ERROR:
            self.ended.set()

    async def watching(self, call: Any) -> Any:
        """Await `call` (a coroutine that reaches a routed tool), or raise the error that ended
        the routed call as soon as it does (kept for `raise_failure`)."""
        task = asyncio.ensure_future(call)
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            ended.cancel()
        if not task.done():
            task.cancel()
            assert self.failure is not None
            raise self.failure
        return task.result()

    def raise_failure(self, *, tool_errors: bool = True) -> None:
        """Raise the FrameError a routed tool call met, if any, and forget it (EXECUTION_ERROR
        too only with `tool_errors`: a tool step reports a failing tool in its observation, as
        OpenEnv does). The caller of the env call calls this: whether the execution core passed
        the error on or made an EXECUTION_ERROR of it, the client reads the routed call's."""
        failure, self.failure = self.failure, None
        if failure is not None and (tool_errors or failure.code is not ErrorCode.EXECUTION_ERROR):
            raise failure

    async def client(self) -> Any:
        if self._client is None:
            env = self._env()
            if env is None:
                raise RuntimeError("the environment is gone")
            self._models = await _route_to_lanes(self.server)
            self._client = asyncio.get_running_loop().create_future()
            self._holder = asyncio.ensure_future(_hold(self, env, self._client, self._done))
        return await asyncio.shield(self._client)

    async def list(self) -> list[dict[str, Any]]:
        client = await self.client()
        return [t.model_dump(mode="json") for t in await client.list_tools()]

    async def check(self, name: str, arguments: dict[str, Any]) -> None:
        client = await self.client()
        if self._names is None or name not in self._names:  # listed again once: tools may come later
            self._names = frozenset(t.name for t in await client.list_tools())
            if name not in self._names:
                raise _not_found(name)
        _check_arguments(name, self._models.get(name), arguments)

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        client = await self.client()
        self.serve(session)
        seconds, _ = session.table.deadline("tool", type(session.env))
        try:
            result = await session.call_env(
                "tool", self.watching, (client.call_tool(name, arguments),), deadline_s=seconds + _GRACE_S
            )
        except FrameError:
            self.raise_failure()
            raise
        self.raise_failure()
        return {
            "content": [block.model_dump(mode="json") for block in result.content],
            "structured_content": result.structured_content,
            "meta": result.meta,
            "data": _jsonable(result.data),
            "is_error": bool(result.is_error),
        }

    async def step(self, session: Session, data: dict[str, Any], rid: str | None) -> str:
        """A tool step action as OpenEnv's server runs it: the env's ``step_async`` with
        OpenEnv's action, the observation it returns the reply (see the module doc)."""
        from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

        env = session.env
        own: type[BaseModel] = CallToolAction if data["type"] == "call_tool" else ListToolsAction
        action_type = session.table.spec.action_type
        model = action_type if issubclass(action_type, own) else own
        action: Any = validate_model(model, data)
        if isinstance(action, CallToolAction):
            try:
                await self.check(action.tool_name, action.arguments)
            except _ToolCallFailed as exc:  # refused before the env sees it, as an invalid action is
                body = {"tool_name": _shown(action.tool_name), "result": None, "metadata": {},
                        "error": {"error_type": exc.error_type, "message": exc.message}}
                return encode_observation(body, None, False, request_id=rid)
        await self.client()  # held first: the env's own entries into its client session reuse it
        self.serve(session)
        seconds, _ = session.table.deadline("step", type(env))
        stepped = functools.partial(_tool_step, self, env.step_async)
        try:
            return await session.step_by(stepped, action, rid, deadline_s=seconds + _GRACE_S)
        except FrameError:
            self.raise_failure(tool_errors=False)
            raise

    async def release(self) -> None:
        self._done.set()
        if self._holder is not None:
            await asyncio.wait({self._holder}, timeout=_RELEASE_TIMEOUT_S)


_RELEASE_TIMEOUT_S = 10.0


async def _tool_step(tools: _McpEnvTools, step_async: Callable[[Any], Any], action: Any) -> Any:
    """``step_async(action)``; a routed tool call inside that timed out (or found no lane) fails
    the step with that error (the env is already written off), not with the observation the env
    made of it."""
    obs = await tools.watching(step_async(action))
    failure = tools.failure
    if failure is not None and failure.code is not ErrorCode.EXECUTION_ERROR:
        raise failure
    return obs


async def _hold(tools: _McpEnvTools, env: Any, ready: asyncio.Future[Any], done: asyncio.Event) -> None:
    _HOLDER.set(tools)  # inherited by the tasks of the in-memory server this session starts
    try:
        factory = getattr(env, "mcp_session", None)
        if callable(factory):
            context = factory()
        else:
            from fastmcp import Client

            context = Client(tools.server)
        async with context as client:
            ready.set_result(client)
            await done.wait()
    except Exception as exc:
        if not ready.done():
            ready.set_exception(exc)
        else:
            logger.warning("closing the MCP session of %s raised %r", type(env).__name__, exc)


_ROUTED: weakref.WeakKeyDictionary[Any, dict[str, type[BaseModel] | None]] = weakref.WeakKeyDictionary()


async def _route_to_lanes(server: Any) -> dict[str, type[BaseModel] | None]:
    """Make each function tool of FastMCP `server` run as an env call of the calling session
    (`_routed_tool`), once per server; return a model of each one's arguments by name. Tools
    of other kinds (mounted servers, proxies) and sync functions FastMCP was told to run on
    its loop (``run_in_thread=False``) are left as they are."""
    found = _ROUTED.get(server)
    if found is not None:
        return found
    from fastmcp.server.dependencies import without_injected_parameters
    from fastmcp.tools.function_tool import FunctionTool

    models: dict[str, type[BaseModel] | None] = {}
    provider = server.local_provider
    for tool in list(await provider.list_tools()):
        if not isinstance(tool, FunctionTool) or (not tool.run_in_thread and not inspect.iscoroutinefunction(tool.fn)):
            continue
        try:
            signature = inspect.signature(tool.fn, eval_str=True)
            visible = inspect.signature(without_injected_parameters(tool.fn)).parameters
        except Exception as exc:  # annotations naming what the tool's module cannot resolve
            logger.warning("tool %r of %s stays on FastMCP's threads: %r", tool.name, server.name, exc)
            continue
        models[tool.name] = _arguments_model(
            tool.name, signature.replace(parameters=[p for p in signature.parameters.values() if p.name in visible])
        )
        provider.remove_tool(tool.name, tool.version)
        server.add_tool(tool.model_copy(update={"fn": _routed_tool(tool.fn, signature)}))
    _ROUTED[server] = models
    return models


def _routed_tool(fn: Callable[..., Any], signature: inspect.Signature) -> Callable[..., Any]:
    """`fn` as the coroutine function FastMCP awaits instead: a call made through a client
    session envsdk holds (`_HOLDER`) is an env call of its session (`Session.call_env`: a plain
    function on the session's lane, under the tool deadline); any other call (env code calling
    its own server) runs as FastMCP runs it. A FrameError is also left with the tools, so that
    the caller reads its code (FastMCP passes on only its text)."""
    is_async = inspect.iscoroutinefunction(fn)

    async def routed(**kwargs: Any) -> Any:
        holder = _HOLDER.get()
        session = holder.session if holder is not None else None
        if holder is None or session is None or session.closed:
            if is_async:
                return await fn(**kwargs)
            import anyio.to_thread

            return await anyio.to_thread.run_sync(functools.partial(fn, **kwargs))
        from fastmcp.exceptions import ToolError

        try:
            return await env_call(session, fn, (), kwargs)
        except FrameError as exc:
            holder.fail(exc)
            # FastMCP logs a ToolError in one line; anything else with a rendered traceback, on the loop.
            raise ToolError(exc.message) from None

    routed.__name__ = getattr(fn, "__name__", "tool")
    routed.__qualname__ = getattr(fn, "__qualname__", routed.__name__)
    routed.__doc__ = fn.__doc__
    routed.__signature__ = signature  # type: ignore[attr-defined]
    routed.__annotations__ = {
        p.name: p.annotation for p in signature.parameters.values() if p.annotation is not inspect.Parameter.empty
    }
    if signature.return_annotation is not inspect.Signature.empty:
        routed.__annotations__["return"] = signature.return_annotation
    return routed


def _jsonable(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    try:
        return to_jsonable_python(value)
    except Exception:  # an object FastMCP built from the output schema that pydantic cannot dump
        return str(value)


def _failed_frame(name: str, exc: FrameError) -> _ToolCallFailed:
    if exc.code is ErrorCode.TIMEOUT:
        return _ToolCallFailed(SERVER_ERROR, exc.message, "timeout", {"code": exc.code.value, **exc.details})
    if exc.code in (ErrorCode.CAPACITY_REACHED, ErrorCode.SHUTTING_DOWN):
        return _ToolCallFailed(SERVER_ERROR, exc.message, "execution_error", {"code": exc.code.value, **exc.details})
    return _ToolCallFailed(
        INTERNAL_ERROR, f"Error calling tool {_shown(name)!r}: {_cut(exc.message)}", "execution_error"
    )


def _result_payload(result: Any) -> dict[str, Any]:
    """A FastMCP `ToolResult` in the shape OpenEnv's server sends (its client's `CallToolResult`):
    ``content``, ``structured_content``, ``meta``, ``data`` (the value itself) and ``is_error``."""
    structured = result.structured_content
    meta = result.meta
    wrapped = isinstance(meta, dict) and bool((meta.get("fastmcp") or {}).get("wrap_result"))
    data = structured.get("result") if wrapped and isinstance(structured, dict) else structured
    return {
        "content": [block.model_dump(mode="json") for block in result.content],
        "structured_content": structured,
        "meta": meta,
        "data": data,
        "is_error": False,
    }


_NATIVE_TOOLS: dict[type, _NativeTools | None] = {}
_INSTANCE_TOOLS: weakref.WeakKeyDictionary[Any, _McpEnvTools] = weakref.WeakKeyDictionary()


def tools_of(env: Any) -> _Tools | None:
    """The MCP side of `env`, or None when it has no tools (one per envsdk tool env class; one
    per OpenEnv ``MCPEnvironment`` instance, whose FastMCP server is its own)."""
    server = getattr(env, "mcp_server", None)
    if server is None:
        return tools_of_class(type(env))
    found = _INSTANCE_TOOLS.get(env)
    if found is None or found.server is not server:
        found = _INSTANCE_TOOLS[env] = _McpEnvTools(env)
    return found


async def describe_tools(table: SessionTable) -> list[dict[str, Any]] | None:
    """The tools the env `table` serves lists (``tools/list`` entries), or None for an env
    without tools. The class is read from the factory itself or from its return annotation;
    only an OpenEnv ``MCPEnvironment`` (or a factory whose class cannot be told) is built for it:
    as a throw-away session's env, so within ``max_concurrent_envs`` and under the factory's
    deadline. Raises `FrameError` (CAPACITY_REACHED, FACTORY_ERROR, TIMEOUT …)."""
    from envsdk.tools import is_tool_env

    factory = table.spec.factory
    env_class: Any = factory if isinstance(factory, type) else None
    if env_class is None:
        try:
            env_class = typing.get_type_hints(factory).get("return")
        except Exception:  # unresolvable annotations: build one below
            env_class = None
    if isinstance(env_class, type):
        if not is_tool_env(env_class):
            return None
        if getattr(env_class, "mcp_server", None) is None and tool_methods(env_class):
            native = tools_of_class(env_class)
            return await native.list() if native is not None else None
    async with table.throwaway() as session:
        tools = tools_of(session.env)
        return await tools.list() if tools is not None else None


def tools_of_class(env_class: type) -> _NativeTools | None:
    """The tools of an envsdk tool env class (None without ``@tool`` methods)."""
    if env_class not in _NATIVE_TOOLS:
        methods = tool_methods(env_class)
        _NATIVE_TOOLS[env_class] = _NativeTools(_native_server(env_class, methods)) if methods else None
    return _NATIVE_TOOLS[env_class]


async def release(env: Any) -> None:
    """Before `env` is closed: close the MCP client session its tools hold (if any)."""
    try:
        found = _INSTANCE_TOOLS.pop(env, None)
    except TypeError:  # not weak-referenceable, so never held
        return
    if found is not None:
        await found.release()


def _native_server(env_class: type, methods: dict[str, Callable[..., Any]]) -> Any:
    """One FastMCP server for every instance of `env_class`: each tool method becomes an async
    FastMCP tool with the method's signature (so FastMCP derives the schema and checks the
    arguments), whose body runs the method of the calling session's env through `env_call`."""
    from fastmcp import FastMCP

    server = FastMCP(env_class.__name__)
    for name, function in methods.items():
        server.tool(_routed(name, function), name=name)
    return server


def _routed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    full = tool_signature(function)
    params = list(full.parameters.values())[1:]  # without self
    returns = full.return_annotation
    # `-> None` read from source is NoneType to FastMCP; a bare None would mean "no schema".
    signature = full.replace(parameters=params, return_annotation=type(None) if returns is None else returns)

    async def call(**kwargs: Any) -> Any:
        session = _CALLER.get()
        if session is None or session.env is None:
            raise RuntimeError(f"tool {name!r} was called outside a session")
        return await env_call(session, getattr(session.env, name), (), kwargs)

    call.__name__ = name
    call.__doc__ = inspect.getdoc(function)
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
    if signature.return_annotation is not inspect.Signature.empty:
        call.__annotations__["return"] = signature.return_annotation
    return call


# ---------------------------------------------------------------- JSON-RPC


def _response(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


def _load(raw: str | bytes) -> Any:
    """A request's JSON, or the parse error to answer: pydantic-core's parser refuses what
    cannot be answered (a lone surrogate, nesting past 200 levels, a 4,300-digit number)."""
    try:
        return from_json(raw)
    except ValueError as exc:
        return _ParseError(_error(None, PARSE_ERROR, f"Parse error: {_cut(str(exc))}"))


class _ParseError(dict[str, Any]):
    """The error response to send for a body that is not JSON (told apart from a request)."""


def _valid_id(request_id: Any) -> bool:
    if request_id is None or isinstance(request_id, int) and not isinstance(request_id, bool):
        return True
    if isinstance(request_id, float):
        return math.isfinite(request_id)
    return isinstance(request_id, str) and len(request_id) <= MAX_ECHOED_CHARS


def _parse(payload: Any) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """(id, method, params) of a JSON-RPC request, or the error response to send instead."""
    if not isinstance(payload, dict):
        return _error(None, INVALID_REQUEST, "Invalid request: a JSON-RPC request is a JSON object")
    request_id = payload.get("id")
    if not _valid_id(request_id):
        return _error(None, INVALID_REQUEST, f"Invalid request: 'id' must be a string of at most {MAX_ECHOED_CHARS} "
                                             "characters, a number or null")
    method = payload.get("method")
    if payload.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return _error(request_id, INVALID_REQUEST, "Invalid request: 'jsonrpc' must be \"2.0\" and 'method' a string")
    params = payload.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return _error(request_id, INVALID_PARAMS, "Params must be an object")
    return request_id, method, params


def _method_not_found(request_id: Any, method: str) -> dict[str, Any]:
    return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {_shown(method)}")


def _unknown_session(request_id: Any, session_handle: Any) -> dict[str, Any]:
    return _error(request_id, INVALID_PARAMS, f"Unknown session_id: {_shown(session_handle)} (closed, expired, or "
                                              "given up for a newcomer when the server was full)")


async def answer(session: Session, payload: Any) -> dict[str, Any]:
    """The JSON-RPC response to `payload` run on `session` (the caller holds its call order)."""
    parsed = _parse(payload)
    if isinstance(parsed, dict):
        return parsed
    request_id, method, params = parsed
    if method == "openenv/session/create":
        # Asked on a session's own socket: its handle, usable to re-attach, so from now on the
        # session outlives its socket for the resume window (as after the session handshake).
        session.resumable = True
        return _response(request_id, {"session_id": handle(session)})
    if method == "openenv/session/close":
        return _close(session.table, request_id, params, current=session)
    return await _run_tool_method(session, request_id, method, params)


async def _run_tool_method(session: Session, request_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method not in ("tools/list", "tools/call"):
        return _method_not_found(request_id, method)
    env = session.env
    if env is None:
        return _error(request_id, SERVER_ERROR, "No environment: the previous call timed out; reset to start a new episode",
                      {"code": ErrorCode.NOT_RESET.value})
    try:
        tools = tools_of(env)
        if tools is None:
            return _error(request_id, INTERNAL_ERROR, "Environment does not support MCP")
        if method == "tools/list":
            return _response(request_id, {"tools": await tools.list()})
    except Exception as exc:  # a tool declaration FastMCP cannot take: the caller learns why
        logger.warning("listing the tools of %s failed: %r", type(env).__name__, exc)
        return _error(request_id, INTERNAL_ERROR, f"Cannot list the tools of {type(env).__name__}: {_cut(str(exc))}")
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if not isinstance(name, str) or not name:
        return _error(request_id, INVALID_PARAMS, "Missing 'name' in params")
    if not isinstance(arguments, dict):
        return _error(request_id, INVALID_PARAMS, "'arguments' must be an object")
    try:
        return _response(request_id, await tools.call(session, name, arguments))
    except _ToolCallFailed as exc:
        return _error(request_id, exc.code, exc.message, exc.data)


# ---------------------------------------------------------------- step actions


def is_tool_action(table: SessionTable, data: dict[str, Any]) -> bool:
    """Whether a step's `data` is OpenEnv's ``list_tools`` / ``call_tool`` action for this
    server's tool env: never when the env's own action has a ``type`` field of its own (one
    whose default is not an MCP action type, e.g. OpenEnv's ``CallToolAction``'s)."""
    if data.get("type") not in _TOOL_ACTIONS:
        return False
    own = table.spec.action_type.model_fields.get("type")
    return own is None or own.default in _TOOL_ACTIONS


async def step_tool_action(session: Session, data: dict[str, Any], request_id: str | None) -> str:
    """The observation frame answering a ``list_tools`` / ``call_tool`` step action (see the
    module doc: the env's step for an OpenEnv ``MCPEnvironment``, the tool itself for an
    envsdk ``@tool`` env)."""
    tools = tools_of(session.env)
    if tools is None:
        raise FrameError(ErrorCode.VALIDATION_ERROR, f"{data.get('type')}: this environment has no tools")
    if isinstance(tools, _McpEnvTools) and callable(getattr(session.env, "step_async", None)):
        return await tools.step(session, data, request_id)
    if data["type"] == "list_tools":
        body: dict[str, Any] = {"tools": [_openenv_tool(t) for t in await tools.list()], "metadata": {}}
        return encode_observation(body, None, False, request_id=request_id)
    name = data.get("tool_name")
    arguments = data.get("arguments", {})
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise FrameError(
            ErrorCode.VALIDATION_ERROR, "Invalid message",
            errors=[{"type": "call_tool", "loc": ["data"], "msg": "call_tool needs 'tool_name' (a string) and 'arguments' (an object)"}],
        )
    body = {"tool_name": _shown(name), "result": None, "error": None, "metadata": {}}
    try:
        body["result"] = await tools.call(session, name, arguments)
    except _ToolCallFailed as exc:
        if exc.error_type == "timeout":
            raise FrameError(ErrorCode.TIMEOUT, exc.message, **{k: v for k, v in (exc.data or {}).items() if k != "code"}) from None
        body["error"] = {"error_type": exc.error_type, "message": exc.message}
    return encode_observation(body, None, False, request_id=request_id)


def _openenv_tool(tool: dict[str, Any]) -> dict[str, Any]:
    # OpenEnv's `Tool` (name, description, input_schema), what its MCP client parses.
    return {"name": tool["name"], "description": tool.get("description") or "", "input_schema": tool.get("inputSchema") or {}}


class _ToolSteps:
    """The tool step actions, as the session table's step extension."""

    def __init__(self, table: SessionTable) -> None:
        self.table = table

    def claims(self, data: dict[str, Any]) -> bool:
        return is_tool_action(self.table, data)

    async def step(self, session: Session, data: dict[str, Any], rid: str | None) -> str:
        return await step_tool_action(session, data, rid)


async def _mcp_frame(session: Session, request: Any) -> str:
    """The reply to a ``{"type": "mcp"}`` request of `session` (the session's request type)."""
    return encode_mcp(await answer(session, request.data), request_id=request.id)


# ---------------------------------------------------------------- sessions over MCP


_HANDLE_TOKENS: weakref.WeakKeyDictionary[Session, str] = weakref.WeakKeyDictionary()


def handle(session: Session) -> str:
    """The ``session_id`` MCP clients get: the session's id and a token of its own (see the
    module doc), made on first use."""
    token = _HANDLE_TOKENS.get(session)
    if token is None:
        token = _HANDLE_TOKENS[session] = secrets.token_urlsafe(32)
    return f"{session.id}{_HANDLE_SEPARATOR}{token}"


_CREATED_OVER_MCP: weakref.WeakSet[Session] = weakref.WeakSet()


def created_over_mcp(session: Session) -> bool:
    """Whether `session` was made by ``openenv/session/create`` over ``POST /mcp``: a ``close``
    frame on a socket attached to it only detaches that socket (as in OpenEnv); the session
    ends by ``openenv/session/close``, when its resume window passes with no socket, or when it
    gives its slot up to a newcomer."""
    return session in _CREATED_OVER_MCP


def _find(table: SessionTable, session_handle: Any) -> Session | None:
    """The live session an MCP handle names, its token checked in constant time; else None."""
    if not isinstance(session_handle, str) or _HANDLE_SEPARATOR not in session_handle:
        return None
    session_id, _, token = session_handle.partition(_HANDLE_SEPARATOR)
    session = table.get(session_id)
    expected = _HANDLE_TOKENS.get(session) if session is not None else None
    if session is None or expected is None or session.closed:
        return None
    return session if secrets.compare_digest(expected.encode(), token.encode("utf-8", "surrogatepass")) else None


def attach_target(table: SessionTable, session_id: str | None, resume_token: str | None) -> Session | None:
    """The session a ``/ws?session_id=…`` connection attaches to: an envsdk resume (id and
    ``resume_token``), or OpenEnv's attach by an MCP handle alone; None when neither checks out."""
    if resume_token is None and session_id is not None and _HANDLE_SEPARATOR in session_id:
        return _find(table, session_id)
    return table.find(session_id, resume_token)


def _close(table: SessionTable, request_id: Any, params: dict[str, Any], current: Session | None) -> dict[str, Any]:
    target = params.get("session_id")
    if not target:
        return _error(request_id, INVALID_PARAMS, "Invalid params - 'session_id' is required")
    session = _find(table, target)
    if session is None:
        return _unknown_session(request_id, target)
    if session is current and session.connection is not None:
        return _error(request_id, INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
    if session.connection is not None:
        # Ends when its socket goes: detach destroys a session that is no longer resumable.
        session.resumable = False
        return _response(request_id, {"session_id": target, "closed": False, "closing": True})
    table.destroy(session)
    return _response(request_id, {"session_id": target, "closed": True})


async def _run_on(session: Session, payload: Any) -> dict[str, Any]:
    """`answer` under the session's call order (the same path as a ``/ws`` mcp frame)."""
    parsed = _parse(payload)
    if isinstance(parsed, dict):
        return parsed
    reply = await session.handle(McpRequest(data=payload))
    decoded: dict[str, Any] = from_json(reply)
    if decoded.get("type") == "mcp":
        return dict(decoded["data"])
    error = decoded.get("data") or {}
    return _error(parsed[0], SERVER_ERROR, str(error.get("message")), {"code": error.get("code")})


async def _post(table: SessionTable, payload: Any) -> dict[str, Any]:
    parsed = _parse(payload)
    if isinstance(parsed, dict):
        return parsed
    request_id, method, params = parsed
    if method == "openenv/session/create":
        try:
            session = await table.open(None)
        except FrameError as exc:
            table.metrics.errors[exc.code.value] += 1
            return _error(request_id, SERVER_ERROR, exc.message, {"code": exc.code.value, **exc.details})
        session.resumable = True
        _CREATED_OVER_MCP.add(session)
        session_id = handle(session)
        table.keep(session)
        return _response(request_id, {"session_id": session_id})
    if method == "openenv/session/close":
        return _close(table, request_id, params, current=None)
    if "session_id" in params:
        target = _find(table, params["session_id"])
        if target is None:
            return _unknown_session(request_id, params["session_id"])
        reply = await _run_on(target, payload)
        if target.connection is None and not target.closed:
            table.keep(target)
        return reply
    if method not in ("tools/list", "tools/call"):
        return _method_not_found(request_id, method)
    return await _stateless(table, request_id, method, params)


async def _stateless(table: SessionTable, request_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A tool method on a throw-away env, as OpenEnv answers ``/mcp`` without a session; it
    holds a slot while it runs, like the stateless HTTP routes."""
    try:
        async with table.throwaway() as session:
            return await _run_tool_method(session, request_id, method, params)
    except FrameError as exc:
        table.metrics.errors[exc.code.value] += 1
        return _error(request_id, SERVER_ERROR, exc.message, {"code": exc.code.value, **exc.details})


def mount_mcp(app: FastAPI, table: SessionTable) -> None:
    """Add ``POST /mcp`` and ``WS /mcp`` to `app`, and MCP's part of every session to `table`:
    the ``mcp`` request type, the tool step actions, and the release of an env's MCP client
    session before the env is closed.

    An envsdk tool env class gets its FastMCP server now: importing FastMCP takes seconds, which
    must not land on the event loop at the first tool call."""
    table.request_handlers["mcp"] = _mcp_frame
    table.step_extension = _ToolSteps(table)
    table.before_env_close.append(release)
    factory = table.spec.factory
    if isinstance(factory, type) and getattr(factory, "mcp_server", None) is None:
        tools_of_class(factory)

    @app.post(MCP_PATH)
    async def mcp_post(request: Request) -> Any:
        payload = _load(await request.body())
        if isinstance(payload, _ParseError):
            return dict(payload)
        return await _post(table, payload)

    @app.websocket(MCP_PATH)
    async def mcp_socket(ws: WebSocket) -> None:
        await ws.accept()
        try:
            session = await table.open(ws)
        except FrameError as exc:
            table.metrics.errors[exc.code.value] += 1
            await ws.send_text(dumps(_error(None, SERVER_ERROR, exc.message, {"code": exc.code.value, **exc.details})))
            await ws.close(code=1013 if exc.code is ErrorCode.CAPACITY_REACHED else 1000)
            return
        try:
            await _serve_mcp_socket(ws, session, table)
        except Exception as exc:  # a server bug: the peer still gets a close frame
            logger.error("WS %s of session %s failed", MCP_PATH, session.id, exc_info=exc)
            try:
                await ws.close(code=1011, reason="internal error")
            except Exception:  # already closed
                pass
        finally:
            table.detach(session, ws)


async def _serve_mcp_socket(ws: WebSocket, session: Session, table: SessionTable) -> None:
    """Answer JSON-RPC text frames on `ws` until the peer goes (or sends nothing at first)."""
    limit = table.config.max_frame_bytes
    waiting_s = table.config.first_frame_timeout_s  # a socket holds a slot: it must use it
    while True:
        try:
            message = await asyncio.wait_for(ws.receive(), waiting_s)
        except asyncio.TimeoutError:
            await ws.close(code=1008, reason="no request within first_frame_timeout_s")
            return
        waiting_s = None
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text") or message.get("bytes") or b""
        size = frame_size(raw, limit)
        if size > limit:  # the same bound as a /ws frame's
            reply = _error(None, INVALID_REQUEST, f"Frame of {size} bytes exceeds the limit of {limit} bytes",
                           {"code": ErrorCode.FRAME_TOO_LARGE.value, "limit": limit})
        else:
            payload = _load(raw)
            reply = dict(payload) if isinstance(payload, _ParseError) else await _run_on(session, payload)
        del raw, message
        try:
            await ws.send_text(dumps(reply))
        except Exception:  # the peer is gone
            return
