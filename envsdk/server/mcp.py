"""MCP on envsdk's server, on OpenEnv 0.10's wire: tool environments served to any MCP client.

Routes and frames (all answer the JSON-RPC 2.0 methods ``tools/list``, ``tools/call``,
``openenv/session/create`` and ``openenv/session/close``; any other method: -32601):

* ``POST /mcp`` — one JSON-RPC request per HTTP request. With ``params.session_id`` it runs
  on that session; without, on a throw-away env (built, called, closed), as OpenEnv does.
* ``WS /mcp`` — a session per socket (capacity applies), JSON-RPC requests as text frames.
* ``{"type": "mcp", "data": <request>}`` on ``/ws`` — on the socket's session; the reply is
  ``{"type": "mcp", "data": <response>}``, and an envsdk request ``id`` makes it exactly-once.
* step actions ``{"type": "list_tools"}`` and ``{"type": "call_tool", "tool_name": …,
  "arguments": {…}}`` on a tool env: answered as observations shaped like OpenEnv's
  ``ListToolsObservation`` / ``CallToolObservation`` (tool failures in ``error``).

Sessions created over MCP, and OpenEnv's ``/ws?session_id=`` attach
---------------------------------------------------------------------
``openenv/session/create`` opens a session with no socket and answers a ``session_id`` handle:
the session's id and a 256-bit token of its own, joined by a dot. OpenEnv's ``MCPToolClient``
passes that handle back in ``params.session_id`` and in ``/ws?session_id=``; the server checks
its token in constant time. It is the creator's credential for the session's life, as OpenEnv's
session id is, and it is separate from envsdk's resume token, which still rotates on every
resume: a resume with ``session_id`` and ``resume_token`` works on such a session as on any
other, and neither credential opens the other's door wider. Such a session is resumable from
birth: while no socket is attached it lives for ``resume_window_s`` after its last MCP call,
and it is never evicted to make room for a new connection (it has no socket by design).
``openenv/session/close`` on a session with a socket attached answers ``closing: true`` and the
session ends when that socket goes; a ``close`` frame on such a socket only detaches it (the
session is the creator's to close), as in OpenEnv. ``openenv/session/create`` sent on a
session's own socket answers that session's handle and makes it resumable, like the session
handshake.

Every tool call is an env call and goes through `env_call`: the step deadline (TIMEOUT ends
the episode, as a step's does), the env's executor lane, and the session's one-call-at-a-time
order. Calls of envsdk tool methods run like ``step`` (sync ones in the thread pool, unless the
env is ``INLINE_SYNC``); an OpenEnv ``MCPEnvironment``'s tools are called through its FastMCP
client session, held open for the env's life as OpenEnv holds it, and run as FastMCP runs them.
Needs the ``fastmcp`` package (``pip install 'envsdk[mcp]'``) for tool environments only.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import math
import secrets
import typing
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, WebSocket

from envsdk.protocol import ErrorCode, FrameError, McpRequest, dumps, encode_observation, frame_size
from envsdk.tools import tool_methods, tool_signature

if TYPE_CHECKING:
    from envsdk.server.sessions import Session, SessionTable

__all__ = [
    "MCP_PATH",
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

# JSON-RPC 2.0 error codes (the values of `mcp.types`' constants; a test pins them). The
# envelope is built here, not with the `mcp` package, so that every envsdk server answers /mcp
# (OpenEnv's validator requires it) without that optional dependency; tool envs need it.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603,
)
SERVER_ERROR = -32000

_HANDLE_SEPARATOR = "."
_TOOL_ACTIONS = frozenset({"list_tools", "call_tool"})

# The session a native tool method is being called for (set around each call, read by the
# method's FastMCP wrapper, so one FastMCP server per env class serves every instance).
_CALLER: contextvars.ContextVar[Session | None] = contextvars.ContextVar("envsdk_tool_caller", default=None)


async def env_call(session: Session, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` as one ``tool`` call of `session`'s env, by the execution core's
    `Session.call_env`: on the session's lane (a coroutine function on the loop), under the
    deadline of ``tool`` calls (``tool_timeout_s``, else the step's), a timed-out call ending the
    episode as a timed-out step does. Every tool call runs inside one of the session's requests
    (a ``/ws`` frame or ``/mcp`` call taken through `Session.handle`), which holds its turn and
    records its reply. The one place a tool call enters the execution core. Raises `FrameError`
    (TIMEOUT, EXECUTION_ERROR, CAPACITY_REACHED, SHUTTING_DOWN)."""
    return await session.call_env("tool", fn, args, kwargs)


# ---------------------------------------------------------------- the MCP side of an env


class _ToolCallFailed(Exception):
    """A tool call that failed for a reason the caller should read (JSON-RPC code + message)."""

    def __init__(self, code: int, message: str, error_type: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.error_type, self.data = code, message, error_type, data


class _Tools:
    """How one env's tools are listed and called (see `_NativeTools`, `_McpEnvTools`)."""

    async def list(self) -> list[dict[str, Any]]:
        """``tools/list``'s tools, as MCP ``Tool`` objects in JSON."""
        raise NotImplementedError

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def release(self) -> None:
        """Let go of whatever the tools hold open (called before the env is closed)."""

    async def call(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's MCP result as OpenEnv sends it; raises `_ToolCallFailed`."""
        from fastmcp.exceptions import NotFoundError, ToolError, ValidationError
        from pydantic import ValidationError as ArgumentsError

        session.table.metrics.tool_calls += 1
        try:
            return await self._invoke(session, name, arguments)
        except FrameError as exc:
            raise _failed_frame(name, exc) from None
        except NotFoundError as exc:
            raise _ToolCallFailed(INTERNAL_ERROR, str(exc), "tool_not_found") from None
        except (ValidationError, ArgumentsError) as exc:
            raise _ToolCallFailed(INTERNAL_ERROR, f"Invalid arguments for tool {name!r}: {exc}", "invalid_args") from None
        except ToolError as exc:
            if isinstance(exc.__cause__, FrameError):
                raise _failed_frame(name, exc.__cause__) from None
            message = str(exc)
            kind = "tool_not_found" if message.startswith("Unknown tool") else "execution_error"
            raise _ToolCallFailed(INTERNAL_ERROR, message, kind) from None
        except Exception as exc:
            raise _ToolCallFailed(INTERNAL_ERROR, f"Error calling tool {name!r}: {exc}", "execution_error") from None


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

    async def tools(self) -> dict[str, Any]:
        if self._tools is None:
            self._tools = {t.name: t for t in await self.server.list_tools()}
        return self._tools

    async def list(self) -> list[dict[str, Any]]:
        if self._listed is None:
            self._listed = [t.to_mcp_tool().model_dump(mode="json") for t in (await self.tools()).values()]
        return self._listed

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from fastmcp.exceptions import NotFoundError
        from fastmcp.utilities.types import get_cached_typeadapter

        found = (await self.tools()).get(name)
        if found is None:
            raise NotFoundError(f"Unknown tool: {name!r}")
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
    FastMCP's per-session state (``ctx.set_state``) and middleware behave as under OpenEnv.

    The session is entered and left in one task of its own (`_hold`): never in a request's task,
    which the server may cancel."""

    def __init__(self, env: Any) -> None:
        self.server = env.mcp_server
        self._env = weakref.ref(env)
        self._client: asyncio.Future[Any] | None = None
        self._holder: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    async def client(self) -> Any:
        if self._client is None:
            env = self._env()
            if env is None:
                raise RuntimeError("the environment is gone")
            self._client = asyncio.get_running_loop().create_future()
            self._holder = asyncio.ensure_future(_hold(env, self.server, self._client, self._done))
        return await asyncio.shield(self._client)

    async def list(self) -> list[dict[str, Any]]:
        client = await self.client()
        return [t.model_dump(mode="json") for t in await client.list_tools()]

    async def _invoke(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        client = await self.client()
        result = await env_call(session, client.call_tool, (name, arguments), {})
        return {
            "content": [block.model_dump(mode="json") for block in result.content],
            "structured_content": result.structured_content,
            "meta": result.meta,
            "data": _jsonable(result.data),
            "is_error": bool(result.is_error),
        }

    async def release(self) -> None:
        self._done.set()
        if self._holder is not None:
            await asyncio.wait({self._holder}, timeout=_RELEASE_TIMEOUT_S)


_RELEASE_TIMEOUT_S = 10.0


async def _hold(env: Any, server: Any, ready: asyncio.Future[Any], done: asyncio.Event) -> None:
    try:
        factory = getattr(env, "mcp_session", None)
        if callable(factory):
            context = factory()
        else:
            from fastmcp import Client

            context = Client(server)
        async with context as client:
            ready.set_result(client)
            await done.wait()
    except Exception as exc:
        if not ready.done():
            ready.set_exception(exc)
        else:
            logger.warning("closing the MCP session of %s raised %r", type(env).__name__, exc)


def _jsonable(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    try:
        return to_jsonable_python(value)
    except Exception:  # an object FastMCP built from the output schema that pydantic cannot dump
        return str(value)


def _failed_frame(name: str, exc: FrameError) -> _ToolCallFailed:
    if exc.code is ErrorCode.TIMEOUT:
        return _ToolCallFailed(SERVER_ERROR, exc.message, "timeout", {"code": exc.code.value, **exc.details})
    return _ToolCallFailed(INTERNAL_ERROR, f"Error calling tool {name!r}: {exc.message}", "execution_error")


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


async def describe_tools(factory: Callable[[], Any]) -> list[dict[str, Any]] | None:
    """The tools an env of `factory` lists (``tools/list`` entries), or None for an env without
    tools (or one that cannot be built). The class is read from `factory` itself or from its
    return annotation; only an OpenEnv ``MCPEnvironment`` (or a factory whose class cannot be
    told) is built for it, then released and closed."""
    from envsdk.tools import is_tool_env

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
    try:
        env = await asyncio.to_thread(factory)
    except Exception as exc:
        logger.warning("building an env to list its tools failed: %r", exc)
        return None
    try:
        tools = tools_of(env)
        return await tools.list() if tools is not None else None
    finally:
        await release(env)
        closing = await asyncio.to_thread(env.close)
        if inspect.isawaitable(closing):
            await closing


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


def _parse(payload: Any) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """(id, method, params) of a JSON-RPC request, or the error response to send instead."""
    if not isinstance(payload, dict):
        return _error(None, INVALID_REQUEST, "Invalid request: a JSON-RPC request is a JSON object")
    request_id = payload.get("id")
    method = payload.get("method")
    if payload.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return _error(request_id, INVALID_REQUEST, "Invalid request: 'jsonrpc' must be \"2.0\" and 'method' a string")
    params = payload.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return _error(request_id, INVALID_PARAMS, "Params must be an object")
    return request_id, method, params


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
        return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
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
        return _error(request_id, INTERNAL_ERROR, f"Cannot list the tools of {type(env).__name__}: {exc}")
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
    """The observation frame answering a ``list_tools`` / ``call_tool`` step action."""
    tools = tools_of(session.env) if session.env is not None else None
    if tools is None:
        raise FrameError(ErrorCode.VALIDATION_ERROR, f"{data.get('type')}: this environment has no tools")
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
    body = {"tool_name": name, "result": None, "error": None, "metadata": {}}
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
    ends by ``openenv/session/close`` or when its resume window passes with no socket."""
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
    return session if secrets.compare_digest(expected.encode(), token.encode()) else None


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
        return _error(request_id, INVALID_PARAMS, f"Unknown session_id: {target}")
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
    if not isinstance(payload, dict):
        return _error(None, INVALID_REQUEST, "Invalid request: a JSON-RPC request is a JSON object")
    reply = await session.handle(McpRequest(data=payload))
    decoded: dict[str, Any] = json.loads(reply)
    if decoded.get("type") == "mcp":
        return dict(decoded["data"])
    error = decoded.get("data") or {}
    return _error(payload.get("id"), SERVER_ERROR, str(error.get("message")), {"code": error.get("code")})


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
            return _error(request_id, INVALID_PARAMS, f"Unknown session_id: {params['session_id']}")
        reply = await _run_on(target, payload)
        if target.connection is None and not target.closed:
            table.keep(target)
        return reply
    if method not in ("tools/list", "tools/call"):
        return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
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
    """Add ``POST /mcp`` and ``WS /mcp`` to `app` (the ``/ws`` side lives in the session).

    An envsdk tool env class gets its FastMCP server now: importing FastMCP takes seconds, which
    must not land on the event loop at the first tool call."""
    factory = table.spec.factory
    if isinstance(factory, type) and getattr(factory, "mcp_server", None) is None:
        tools_of_class(factory)

    @app.post(MCP_PATH)
    async def mcp_post(request: Request) -> Any:
        try:
            payload = json.loads(await request.body())
        except (ValueError, RecursionError) as exc:
            return _error(None, PARSE_ERROR, f"Parse error: {exc}")
        return await _post(table, payload)

    @app.websocket(MCP_PATH)
    async def mcp_socket(ws: WebSocket) -> None:
        limit = table.config.max_frame_bytes
        await ws.accept()
        try:
            session = await table.open(ws)
        except FrameError as exc:
            table.metrics.errors[exc.code.value] += 1
            await ws.send_text(dumps(_error(None, SERVER_ERROR, exc.message, {"code": exc.code.value, **exc.details})))
            await ws.close(code=1013 if exc.code is ErrorCode.CAPACITY_REACHED else 1000)
            return
        try:
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
                    try:
                        payload = json.loads(raw)
                    except (ValueError, RecursionError) as exc:
                        reply = _error(None, PARSE_ERROR, f"Parse error: {exc}")
                    else:
                        reply = await _run_on(session, payload)
                del raw
                try:
                    await ws.send_text(dumps(reply))
                except Exception:  # the peer is gone
                    return
        finally:
            table.detach(session, ws)

