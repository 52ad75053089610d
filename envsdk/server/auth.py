"""Access control of an envsdk server: the Host allow-list, an optional bearer token and a
browser Origin check.

`AccessControl` is an ASGI middleware that `create_app` puts in front of every route.

Token (``ServerConfig.token``, default ``$ENVSDK_TOKEN``; off when unset)
    Every route except ``GET /health`` needs ``Authorization: Bearer <token>`` or, for clients
    that cannot set headers (browsers' ``WebSocket``), a ``?token=<token>`` query parameter.
    The comparison is constant-time. Prefer the header: a query string shows up in access
    logs (uvicorn logs the path of every WebSocket it accepts).

Host (``ServerConfig.allowed_hosts``)
    Checked first; see `envsdk.server.hosts` (by default, a connection on a loopback address
    must name localhost, 127.0.0.1 or ::1: a DNS-rebinding page names its own domain).

Origin (``ServerConfig.allowed_origins``)
    A browser always sends ``Origin``; a page on another site must not drive a server on
    the user's machine (cross-site WebSocket hijacking). A request with an Origin header is
    refused unless that origin is listed, ``"*"`` is listed, or it is the server's own origin
    (same host and port as the ``Host`` header). Requests without Origin (Python clients,
    curl, OpenEnv's client) are not affected.

``/health`` stays open to everyone, so that load balancers and orchestrators can probe it
without credentials; it reveals the session counts and the environment's name, nothing else.

How a refusal looks
    HTTP: status 401 (token missing or wrong, with ``WWW-Authenticate: Bearer``) or 403
    (host or origin), body ``{"detail": {"message", "code": "UNAUTHORIZED", "reason"}}``.
    WebSocket: the upgrade is accepted, one ``UNAUTHORIZED`` error frame is sent, and the
    socket is closed with 1008 (policy violation). No session is created. This is what the
    server does for CAPACITY_REACHED too, and it is the clearest error a client can get: an
    HTTP 401 on the upgrade reaches most WebSocket clients (OpenEnv's included) as a bare
    "server rejected WebSocket connection: HTTP 401", whereas the frame carries the reason,
    and envsdk's `EnvClient` raises it as `envsdk.errors.AuthenticationError` at connect.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from envsdk.protocol import CloseCode, ErrorCode, encode, error_reply
from envsdk.server.hosts import HostPolicy

__all__ = ["OPEN_PATHS", "TOKEN_ENV", "AccessControl", "Refusal"]

TOKEN_ENV = "ENVSDK_TOKEN"
"""The environment variable both `ServerConfig.token` and `EnvClient` read by default."""

OPEN_PATHS = frozenset({"/health"})
"""Paths served without a token or an Origin check."""

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: HTTP ``status`` (401/403), a machine-readable ``reason``
    (``host_not_allowed``, ``missing_token``, ``invalid_token``, ``origin_not_allowed``) and a ``message`` for people."""

    status: int
    reason: str
    message: str


class AccessControl:
    """ASGI middleware enforcing the token and Origin rules of the module docstring.

    ``token`` None turns authentication off; ``allowed_origins`` lists the browser origins
    let in besides the server's own (``"*"``: any); ``allowed_hosts`` is `HostPolicy`'s.
    """

    def __init__(
        self, app: _ASGIApp, *, token: str | None, allowed_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._hosts = HostPolicy(allowed_hosts)
        self._token = token.encode() if token else None
        self._any_origin = "*" in allowed_origins
        self._origins = frozenset(_normalise_origin(o) for o in allowed_origins if o != "*")

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("path") not in OPEN_PATHS:
            refusal = self.check(scope)
            if refusal is not None:
                if scope["type"] == "http":
                    await _refuse_http(scope, receive, send, refusal)
                else:
                    await _refuse_websocket(receive, send, refusal)
                return
        await self.app(scope, receive, send)

    def check(self, scope: _Scope) -> Refusal | None:
        """The refusal for this connection scope, or None when it may pass."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        server = scope.get("server")
        if not self._hosts.allows(headers.get("host"), server[0] if server else None):
            return Refusal(
                403,
                "host_not_allowed",
                f"Host {headers.get('host')!r} is not served here (allowed: {self._hosts.describe()}); "
                "add it to ServerConfig.allowed_hosts (envsdk serve --allowed-hosts)",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, headers.get("host"), scope):
            return Refusal(
                403,
                "origin_not_allowed",
                f"Origin {origin!r} is not allowed to use this server; add it to "
                "ServerConfig.allowed_origins",
            )
        if self._token is None:
            return None
        given = _presented_token(headers, scope.get("query_string", b""))
        if given is None:
            return Refusal(
                401,
                "missing_token",
                "This server requires a token: send 'Authorization: Bearer <token>' "
                f"(EnvClient(token=...) or ${TOKEN_ENV}) or add ?token=<token> to the URL",
            )
        if not hmac.compare_digest(given.encode(), self._token):
            return Refusal(401, "invalid_token", "The token is not valid for this server")
        return None

    def _origin_allowed(self, origin: str, host: str | None, scope: _Scope) -> bool:
        if self._any_origin:
            return True
        normalised = _normalise_origin(origin)
        if normalised in self._origins:
            return True
        # Same origin: the page was served by this very server (scheme aside, since a page
        # at http://h:p opens ws://h:p).
        parts = urlsplit(normalised)
        return host is not None and parts.netloc != "" and parts.netloc == _with_port(host.lower(), scope)


def _normalise_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, default ports made explicit."""
    parts = urlsplit(origin.strip().lower())
    if not parts.scheme or not parts.hostname:
        return origin.strip().lower()  # e.g. "null" from sandboxed pages: only an exact match
    default = {"http": 80, "ws": 80, "https": 443, "wss": 443}.get(parts.scheme)
    port = parts.port or default
    return f"{parts.scheme}://{parts.hostname}:{port}" if port else f"{parts.scheme}://{parts.hostname}"


def _with_port(host: str, scope: _Scope) -> str:
    if host.rsplit(":", 1)[-1].isdigit() and not host.endswith("]"):
        return host
    secure = scope.get("scheme") in ("https", "wss")
    return f"{host}:{443 if secure else 80}"


def _presented_token(headers: dict[str, str], query_string: bytes) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for key, val in parse_qsl(query_string.decode("latin-1")):
        if key == "token" and val:
            return val
    return None


async def _refuse_http(scope: _Scope, receive: _Receive, send: _Send, refusal: Refusal) -> None:
    from starlette.responses import JSONResponse

    headers = {"WWW-Authenticate": 'Bearer realm="envsdk"'} if refusal.status == 401 else None
    body = {"message": refusal.message, "code": ErrorCode.UNAUTHORIZED.value, "reason": refusal.reason}
    response = JSONResponse({"detail": body}, status_code=refusal.status, headers=headers)
    await response(scope, receive, send)


async def _refuse_websocket(receive: _Receive, send: _Send, refusal: Refusal) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    frame = encode(error_reply(ErrorCode.UNAUTHORIZED, refusal.message, reason=refusal.reason))
    try:
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": frame})
        await send({"type": "websocket.close", "code": CloseCode.POLICY_VIOLATION.value, "reason": refusal.reason})
    except OSError:  # the peer left before hearing why; nothing to do
        return
