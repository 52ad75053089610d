"""The wire protocol: every frame that travels over `/ws`, in one module.

Frames are JSON text, one request gets exactly one reply, in order. The shapes are OpenEnv's
(its ``/ws`` frames and error codes), so an OpenEnv client works against an envsdk server and the
envsdk client works against an OpenEnv server. envsdk's extensions are opt-in: a peer that
did not ask for them is never sent their frames or fields, and gets the error codes listed
after them only as said there:

* ``{"type": "mcp", "data": <JSON-RPC request>}`` — an MCP call on the session (OpenEnv 0.10):
  answered ``{"type": "mcp", "data": <JSON-RPC response>}``; see `envsdk.server.mcp`.
* ``{"type": "session"}`` — the session handshake. The reply carries a session id and a
  resume token; from then on the session outlives its connection for ``resume_window_s``.
  A client resumes by connecting to ``/ws?session_id=<id>&resume_token=<token>``.
* ``"id"`` on a request — a request id, echoed on its reply. A request whose id was already
  answered is answered again from the server's record, never applied twice; an id is bound
  to its request, so the same id with a different request gets ``ID_REUSED``. Only sent to a
  server that answered the handshake (OpenEnv forbids unknown top-level keys).
* error codes ``TIMEOUT``, ``NOT_RESET``, ``EPISODE_DONE``, ``FRAME_TOO_LARGE``,
  ``RESUME_FAILED``, ``UNAUTHORIZED``, ``SHUTTING_DOWN``, ``ID_REUSED``.

What a peer that did not ask gets instead of each extension code (a peer asks by the
``session`` handshake, or by an ``id`` on the request; `code_for_peer`):

* ``NOT_RESET`` (a step before the first reset, or after a call timed out) and
  ``EPISODE_DONE`` (a step after ``done``): ``EXECUTION_ERROR`` with the same message. OpenEnv
  hands such a step to the env, and an env that refuses it raises: an ``EXECUTION_ERROR``
  there too. envsdk refuses it without calling the env.
* ``TIMEOUT``, ``FRAME_TOO_LARGE``, ``SHUTTING_DOWN``, ``UNAUTHORIZED``: sent as they are.
  OpenEnv has no deadlines, frame limit, drain or token, so no code of its own for these;
  its client reports any code the same way (``RuntimeError("Server error: <message> (code:
  <code>)")``), so the precise one costs it nothing.
* ``RESUME_FAILED``, ``ID_REUSED``: only ever answer an extension (a resume, a request id).

Rewards: JSON has no NaN or infinity. A non-finite reward or reward part is never sent (as
``null`` it would read as "no reward" or "not evaluated"): the server answers the step with
``EXECUTION_ERROR`` naming the value, and the envsdk client refuses such a value from any
server with `envsdk.errors.ProtocolError`.

Server and client both build and read frames through this module only.
"""

from __future__ import annotations

import functools
import itertools
import json
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar, Union, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json, to_json

__all__ = [
    "PROTOCOL_VERSION",
    "WS_PATH",
    "SHUTDOWN_CLOSE_REASON",
    "ErrorCode",
    "code_for_peer",
    "CloseCode",
    "ResetRequest",
    "StepRequest",
    "StateRequest",
    "CloseRequest",
    "SessionRequest",
    "McpRequest",
    "Request",
    "REQUEST_TYPES",
    "ObservationData",
    "ObservationReply",
    "StateReply",
    "ErrorData",
    "ErrorReply",
    "SessionInfo",
    "SessionReply",
    "McpReply",
    "Reply",
    "FrameError",
    "decode_request",
    "validate_model",
    "validation_errors",
    "extra_key_error",
    "MAX_REPORTED_ERRORS",
    "MAX_ECHOED_CHARS",
    "shorten_input",
    "decode_reply",
    "encode",
    "observation_reply",
    "state_reply",
    "error_reply",
    "session_reply",
    "encode_observation",
    "encode_mcp",
    "dumps",
]

PROTOCOL_VERSION = 1
WS_PATH = "/ws"
SHUTDOWN_CLOSE_REASON = "server shutting down"
"""Reason of the 1001 close a server sends every connection when it shuts down."""


class ErrorCode(str, Enum):
    """Error codes carried in ``{"type": "error", "data": {"code": ...}}``.

    The first seven are OpenEnv's and mean what they mean there; the rest are envsdk's.
    """

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"
    # envsdk extensions
    TIMEOUT = "TIMEOUT"
    NOT_RESET = "NOT_RESET"
    EPISODE_DONE = "EPISODE_DONE"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    RESUME_FAILED = "RESUME_FAILED"
    UNAUTHORIZED = "UNAUTHORIZED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    ID_REUSED = "ID_REUSED"


_PLAIN_PEER_CODES = {ErrorCode.NOT_RESET: ErrorCode.EXECUTION_ERROR, ErrorCode.EPISODE_DONE: ErrorCode.EXECUTION_ERROR}


def code_for_peer(code: ErrorCode, extended: bool) -> ErrorCode:
    """The code to send for `code` to a peer that asked for envsdk's extensions (`extended`)
    or did not (a plain OpenEnv client): see the module docstring."""
    return code if extended else _PLAIN_PEER_CODES.get(code, code)


class CloseCode(int, Enum):
    """WebSocket close codes the server uses (RFC 6455 plus the 4000 private range)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    TRY_AGAIN_LATER = 1013
    SESSION_NOT_FOUND = 4404
    SUPERSEDED = 4409


# ---------------------------------------------------------------- requests (client -> server)


class _Request(BaseModel):
    # OpenEnv forbids unknown top-level keys; `id` is envsdk's only addition.
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, max_length=128, description="envsdk request id")


class ResetRequest(_Request):
    type: Literal["reset"] = "reset"
    data: dict[str, Any] = Field(default_factory=dict)


class StepRequest(_Request):
    type: Literal["step"] = "step"
    data: dict[str, Any]


class StateRequest(_Request):
    type: Literal["state"] = "state"


class CloseRequest(_Request):
    type: Literal["close"] = "close"


class SessionRequest(_Request):
    type: Literal["session"] = "session"


class McpRequest(_Request):
    """OpenEnv 0.10's MCP frame: `data` is one JSON-RPC 2.0 request (checked by the server)."""

    type: Literal["mcp"] = "mcp"
    data: dict[str, Any]


Request = Annotated[
    Union[ResetRequest, StepRequest, StateRequest, CloseRequest, SessionRequest, McpRequest],
    Field(discriminator="type"),
]
REQUEST_TYPES: dict[str, type[_Request]] = {
    "reset": ResetRequest,
    "step": StepRequest,
    "state": StateRequest,
    "close": CloseRequest,
    "session": SessionRequest,
    "mcp": McpRequest,
}

_REQUEST_ADAPTER: TypeAdapter[Any] = TypeAdapter(Request)

# ---------------------------------------------------------------- replies (server -> client)


class _Reply(BaseModel):
    # Lenient: OpenEnv 0.10 adds fields (e.g. top-level "metadata") that older peers lack.
    model_config = ConfigDict(extra="allow")

    id: str | None = None


class ObservationData(BaseModel):
    model_config = ConfigDict(extra="allow")

    observation: dict[str, Any] = Field(default_factory=dict)
    reward: float | int | bool | None = None
    done: bool = False


class ObservationReply(_Reply):
    type: Literal["observation"] = "observation"
    data: ObservationData


class StateReply(_Reply):
    type: Literal["state"] = "state"
    data: dict[str, Any] = Field(default_factory=dict)


class ErrorData(BaseModel):
    """An error's message and code; every other field is a detail (``errors``,
    ``active_sessions``, ``max_sessions``, ``retry_after_s``, ``limit`` …)."""

    model_config = ConfigDict(extra="allow")

    message: str
    code: str

    @property
    def details(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ErrorReply(_Reply):
    type: Literal["error"] = "error"
    data: ErrorData


class SessionInfo(BaseModel):
    """The session handshake's answer. ``deadlines_s``: how long the server lets the env run
    for each kind of request of this session (``reset``, the env built first included; ``step``;
    ``mcp``; ``state``), after which it answers TIMEOUT; a client waits that long, plus the
    reply's travel, before it counts a reply as lost. Empty from servers that do not say."""

    model_config = ConfigDict(extra="allow")

    session_id: str
    resume_token: str
    resumed: bool = False
    resume_window_s: float
    protocol_version: int = PROTOCOL_VERSION
    max_frame_bytes: int | None = None
    episode_id: str | None = None
    step_count: int = 0
    done: bool = False
    deadlines_s: dict[str, float] = Field(default_factory=dict)


class SessionReply(_Reply):
    type: Literal["session"] = "session"
    data: SessionInfo


class McpReply(_Reply):
    """The answer to an `McpRequest`: `data` is the JSON-RPC 2.0 response."""

    type: Literal["mcp"] = "mcp"
    data: dict[str, Any]


Reply = Annotated[
    Union[ObservationReply, StateReply, ErrorReply, SessionReply, McpReply],
    Field(discriminator="type"),
]
_REPLY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Reply)

# ---------------------------------------------------------------- decoding


class FrameError(Exception):
    """A request frame could not be decoded; `reply` is the error frame to send back."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def to_reply(self, request_id: str | None = None) -> ErrorReply:
        return error_reply(self.code, self.message, request_id=request_id, **self.details)


def frame_size(raw: str | bytes, max_bytes: int) -> int:
    """The UTF-8 size of a frame, as far as comparing it with `max_bytes` needs: at most 4
    bytes a character, so only a non-ASCII text that could pass the limit by its length alone
    is encoded to be measured (ASCII and short frames cost nothing)."""
    size = len(raw)
    if isinstance(raw, str) and size <= max_bytes < size * 4 and not raw.isascii():
        size = len(raw.encode("utf-8", "surrogatepass"))
    return size


def decode_request(
    raw: str | bytes, *, max_bytes: int | None = None
) -> ResetRequest | StepRequest | StateRequest | CloseRequest | SessionRequest | McpRequest:
    """Decode one client frame into a request model, or raise `FrameError`.

    Never raises anything else: every bad input (not JSON, not an object, unknown type, bad
    fields, too large) becomes the typed error the client should get. `max_bytes` counts the
    frame's UTF-8 bytes, not its characters. Lone surrogates (``"\\ud800"``) are INVALID_JSON:
    they are no Unicode text, and no reply could echo them.
    """
    if max_bytes is not None:
        size = frame_size(raw, max_bytes)
        if size > max_bytes:
            raise FrameError(
                ErrorCode.FRAME_TOO_LARGE,
                f"Frame of {size} bytes exceeds the limit of {max_bytes} bytes",
                limit=max_bytes,
            )
    try:
        # One pass in pydantic-core parses and validates a well-formed frame (the common
        # case, about twice as fast); any failure is decoded again below to name the error.
        return _REQUEST_ADAPTER.validate_json(raw)  # type: ignore[no-any-return]
    except (ValidationError, ValueError, RecursionError):
        pass
    try:
        # pydantic-core's parser, unlike json.loads, refuses lone surrogates.
        obj = from_json(raw)
    except ValueError as exc:  # invalid UTF-8, too deep, lone surrogate ...
        raise FrameError(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"A frame must be a JSON object, got {type(obj).__name__}",
            errors=[{"type": "dict_type", "loc": [], "msg": "Input should be a valid dictionary"}],
        )
    msg_type = obj.get("type")
    model = REQUEST_TYPES.get(msg_type) if isinstance(msg_type, str) else None
    if model is None:
        shown = msg_type if isinstance(msg_type, str) else ("" if msg_type is None else repr(shorten_input(msg_type)))
        raise FrameError(ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {shorten_input(shown)}")
    return cast(
        "ResetRequest | StepRequest | StateRequest | CloseRequest | SessionRequest",
        validate_model(model, obj),
    )


MAX_REPORTED_ERRORS = 20
"""Most entries of a VALIDATION_ERROR's ``errors`` list; ``errors_omitted`` counts the rest."""
MAX_ECHOED_CHARS = 256
"""Longest string of client input echoed back in an error (the rest is counted, not sent)."""
_MAX_ECHOED_ITEMS = 8
_MAX_ECHOED_DEPTH = 4

_M = TypeVar("_M", bound=BaseModel)


def validate_model(model: type[_M], data: Any) -> _M:
    """``model.model_validate(data)``, or `FrameError` VALIDATION_ERROR whose ``errors`` list
    is bounded (`validation_errors`).

    Unknown keys of a model that forbids them are counted, not validated one by one: pydantic
    would build one error per key, and a frame of a million keys would cost seconds and
    gigabytes to answer.
    """
    # Only a dict of more keys than errors shown can take this path: one len() on the hot path.
    if isinstance(data, dict) and len(data) > MAX_REPORTED_ERRORS and model.model_config.get("extra") == "forbid":
        known = _field_keys(model)
        extra = len(data) - sum(1 for key in known if key in data)
        if extra > MAX_REPORTED_ERRORS:
            errors: list[dict[str, Any]] = []
            total = extra
            try:
                model.model_validate({key: data[key] for key in known if key in data})
            except ValidationError as exc:
                errors, total = validation_errors(exc), total + exc.error_count()
            unknown = itertools.islice((key for key in data if key not in known), MAX_REPORTED_ERRORS)
            errors = [*errors, *(extra_key_error(key, data[key]) for key in unknown)][:MAX_REPORTED_ERRORS]
            raise FrameError(
                ErrorCode.VALIDATION_ERROR,
                f"Invalid message: {extra} unknown field(s)",
                errors=errors,
                errors_omitted=total - len(errors),
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = validation_errors(exc)
        details: dict[str, Any] = {"errors": errors}
        if exc.error_count() > MAX_REPORTED_ERRORS:
            details["errors_omitted"] = exc.error_count() - MAX_REPORTED_ERRORS
        # The sentence a user reads first names the wrong fields; the list is OpenEnv's.
        raise FrameError(ErrorCode.VALIDATION_ERROR, validation_message("Invalid message", errors), **details) from None


@functools.cache
def _field_keys(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(
        key for name, field in model.model_fields.items() for key in (name, field.alias) if key is not None
    )


def extra_key_error(key: str, value: Any, loc: tuple[str, ...] = ()) -> dict[str, Any]:
    """Pydantic's ``extra_forbidden`` error for `key`, its value shortened (`MAX_ECHOED_CHARS`)."""
    return {
        "type": "extra_forbidden",
        "loc": [*loc, shorten_input(key)],
        "msg": "Extra inputs are not permitted",
        "input": shorten_input(value),
    }


def validation_message(prefix: str, errors: list[dict[str, Any]]) -> str:
    """`prefix` followed by which fields are wrong, e.g. ``"Invalid action: message: Field
    required"`` (at most three, then how many more): the sentence a user reads first."""
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ())) or '(message)'}: {e.get('msg', '')}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"{prefix}: {'; '.join(parts)}{more}" if parts else prefix


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's error list in JSON-safe form, as OpenEnv sends it, bounded: at most
    `MAX_REPORTED_ERRORS` entries (``exc.error_count()`` tells how many there were), each
    ``input`` shortened: strings past `MAX_ECHOED_CHARS` characters are cut (with a count of
    the rest), containers past 8 items or 4 levels are described, not echoed.
    """
    errors = exc.errors()[:MAX_REPORTED_ERRORS]
    for error in errors:
        if "input" in error:
            error["input"] = shorten_input(error["input"])
    # The JSON round trip turns what is left (e.g. exceptions in `ctx`) into JSON data.
    return json.loads(to_json(errors, fallback=str))  # type: ignore[no-any-return]


def shorten_input(value: Any, depth: int = 0) -> Any:
    """What an error may echo of client input `value`: see `validation_errors`."""
    if isinstance(value, str):
        if len(value) <= MAX_ECHOED_CHARS:
            return value
        return f"{value[:MAX_ECHOED_CHARS]}... ({len(value) - MAX_ECHOED_CHARS} more characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<integer of {value.bit_length()} bits>"
    if isinstance(value, (dict, list)):
        if depth >= _MAX_ECHOED_DEPTH or len(value) > _MAX_ECHOED_ITEMS:
            kind = "object" if isinstance(value, dict) else "array"
            why = "too deep" if len(value) <= _MAX_ECHOED_ITEMS else "too long"
            return f"<{kind} of {len(value)} items, {why} to echo>"
        if isinstance(value, dict):
            return {str(shorten_input(k, depth)): shorten_input(v, depth + 1) for k, v in value.items()}
        return [shorten_input(v, depth + 1) for v in value]
    return value


def decode_reply(raw: str | bytes) -> ObservationReply | StateReply | ErrorReply | SessionReply | McpReply:
    """Decode one server frame; raises `ValueError` for anything that is not a known reply."""
    try:
        # Parsed and validated in one pass by pydantic-core: the common case, and fast.
        return _REPLY_ADAPTER.validate_json(raw)  # type: ignore[no-any-return]
    except ValueError:  # ValidationError included
        pass
    # The stdlib parser accepts what pydantic-core's does not (lone surrogates); the
    # validation error, if any, is then the one to report.
    try:
        obj = json.loads(raw)
    except RecursionError:  # nested deeper than Python's recursion limit
        raise ValueError("the frame's JSON is nested too deep to decode") from None
    return _REPLY_ADAPTER.validate_python(obj)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- encoding


def dumps(obj: Any) -> str:
    """Compact JSON text of `obj`: ``json.dumps(obj, separators=(",", ":"),
    ensure_ascii=False)``, except that NaN and infinities become ``null`` (valid JSON, as a
    model's JSON dump writes them) and what pydantic can serialise (datetimes, models) is.

    pydantic-core's serialiser: several times faster than the stdlib's for a frame."""
    return str(to_json(obj, inf_nan_mode="null"), "utf-8")


def encode(frame: BaseModel) -> str:
    """Serialise a frame; a reply's `id` is left out unless the request carried one."""
    body = frame.model_dump(mode="json")
    if body.get("id") is None:
        body.pop("id", None)
    return dumps(body)


def encode_observation(
    observation: dict[str, Any],
    reward: float | int | bool | None,
    done: bool,
    *,
    metadata: dict[str, Any] | None = None,
    request_id: str | None = None,
) -> str:
    """``encode(observation_reply(...))``, the same text, without building the models: the
    server's hot path. `observation` must be JSON data or what pydantic serialises (a
    model's ``model_dump()``)."""
    if reward is not None and type(reward) not in (float, int, bool):
        # Anything else (a numpy scalar, a string) gets the model's coercion or its error.
        return encode(observation_reply(observation, reward, done, metadata=metadata, request_id=request_id))
    data: dict[str, Any] = {"observation": observation, "reward": reward, "done": bool(done)}
    if metadata:
        data["metadata"] = metadata
    if request_id is None:
        return dumps({"type": "observation", "data": data})
    return dumps({"id": request_id, "type": "observation", "data": data})


def encode_mcp(response: dict[str, Any], *, request_id: str | None = None) -> str:
    """``encode(McpReply(data=response, id=request_id))``, the same text, without building the
    model (the tool-call hot path). `response` must be JSON data."""
    if request_id is None:
        return dumps({"type": "mcp", "data": response})
    return dumps({"id": request_id, "type": "mcp", "data": response})


def observation_reply(
    observation: dict[str, Any],
    reward: float | int | bool | None,
    done: bool,
    *,
    metadata: dict[str, Any] | None = None,
    request_id: str | None = None,
) -> ObservationReply:
    """OpenEnv's observation frame: `reward` and `done` lifted out of the observation body;
    a non-empty `metadata` is repeated at the top of `data` as openenv 0.10 does."""
    extra: dict[str, Any] = {"metadata": metadata} if metadata else {}
    return ObservationReply(
        id=request_id,
        data=ObservationData(observation=observation, reward=reward, done=done, **extra),
    )


def state_reply(state: dict[str, Any], *, request_id: str | None = None) -> StateReply:
    return StateReply(id=request_id, data=state)


def error_reply(
    code: ErrorCode | str, message: str, *, request_id: str | None = None, **details: Any
) -> ErrorReply:
    code_str = code.value if isinstance(code, ErrorCode) else code
    return ErrorReply(id=request_id, data=ErrorData(message=message, code=code_str, **details))


def session_reply(info: SessionInfo, *, request_id: str | None = None) -> SessionReply:
    return SessionReply(id=request_id, data=info)
