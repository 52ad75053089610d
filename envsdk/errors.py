"""One exception hierarchy for everything envsdk raises to its users.

Each class says what went wrong; server-side errors keep every field of the error frame
(`code`, `message`, `details`) so nothing the server said is dropped.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "EnvSDKError",
    "ProtocolError",
    "ConnectError",
    "ServerError",
    "CapacityError",
    "EnvTimeoutError",
    "EpisodeDoneError",
    "NotResetError",
    "SessionLostError",
    "ServerShutdownError",
    "AuthenticationError",
    "EnvNotFoundError",
    "ToolCallError",
    "RequestEncodingError",
    "BaseUrlError",
    "mask_secrets",
]

# ``token=…`` / ``resume_token=…`` anywhere, any query parameter whose name ends in a secret's
# word (``access_token``, ``api_key``, ``client_secret``, ``X-Amz-Signature``: a gateway's own
# names, in any case), and the ``user:password@`` of a URL. A value runs to the query's next
# ``&``, as a server reads it: a bearer token is the user's own string (``)``, ``#``, ``\\``
# included, sent as typed), so it ends early only where no request target goes on (a quote, a
# space, ``: ``). A password runs to the URL's last ``@``.
_SECRET_QUERY = re.compile(
    r"((?<=[?&;])[\w.%-]*?(?:token|key|secret|password|passwd|pwd|signature|credential)|\b(?:resume_)?token)"
    r"=[^&\s\"']*?(?=[&\s\"']|:\s|$)",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s\"']*@")


def mask_secrets(text: str) -> str:
    """`text` with every URL's secrets masked (``***``): the values of ``token=`` and
    ``resume_token=`` (a resume token lets whoever reads it take the session over), of any query
    parameter named for a secret (``access_token``, ``api_key``, ``client_secret``, ...) and a
    URL's ``user:password@``. Applied to every message that may carry a URL."""
    if "=" in text:
        text = _SECRET_QUERY.sub(r"\1=***", text)
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    return text


class EnvSDKError(Exception):
    """Base class of every error envsdk raises."""


class ProtocolError(EnvSDKError):
    """A peer sent a frame that does not follow the wire protocol."""


class RequestEncodingError(EnvSDKError, ValueError):
    """A request holds what a JSON frame cannot carry (a lone surrogate such as ``"\\ud800"``, which
    UTF-8 has no form for; a value JSON has no type for): nothing was sent, and the session is
    as it was. A `ValueError`, as the serialiser's own error was."""


class BaseUrlError(EnvSDKError, ValueError):
    """A server's base URL that no connection can be made with (no scheme or host, a port that
    is not a number from 0 to 65535, an unclosed IPv6 address, a user name or password in it).
    A `ValueError`, as the client's refusals of a URL always were. ``url`` is the URL as it may
    be shown (its secrets masked), ``problem`` what is wrong with it."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"base_url {url!r} {problem}")
        self.url = url
        self.problem = problem


class ConnectError(EnvSDKError):
    """The server could not be reached (refused, DNS, handshake failure)."""


class ServerError(EnvSDKError):
    """The server answered with an error frame.

    `code` is the wire error code (see `envsdk.protocol.ErrorCode`), `details` every other
    field of the frame's data (for example pydantic's `errors` list, `active_sessions`).
    """

    def __init__(self, message: str, code: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{message} (code: {code})")
        self.message = message
        self.code = code
        self.details: dict[str, Any] = dict(details or {})


class CapacityError(ServerError):
    """The server holds `max_sessions` sessions already (`CAPACITY_REACHED`)."""

    @property
    def active_sessions(self) -> int | None:
        return self.details.get("active_sessions")

    @property
    def max_sessions(self) -> int | None:
        return self.details.get("max_sessions")


class EnvTimeoutError(ServerError):
    """A reset or step ran past its deadline (`TIMEOUT`), or the reply did not arrive in time."""


class ToolCallError(ServerError):
    """An MCP ``tools/list`` or ``tools/call`` was answered with a JSON-RPC error (unknown
    tool, bad arguments, the tool raised). `code` is the JSON-RPC code as a string
    (``"-32603"``); `details` holds the error's ``data``."""


class EpisodeDoneError(ServerError):
    """A step was sent after the episode ended (`EPISODE_DONE`); reset first."""


class NotResetError(ServerError):
    """A step or state was sent before any reset, or after a timeout ended the episode."""


class AuthenticationError(ServerError):
    """The server refused the credentials (`UNAUTHORIZED`)."""


class SessionLostError(EnvSDKError):
    """The session this client was using is gone and cannot be resumed.

    Raised instead of silently continuing in a new episode: the caller must treat the
    episode as lost (for a trainer: record the trajectory as an error). ``session_id`` is the
    lost session when one was known; ``code`` and ``details`` carry the server's error frame
    when the server refused the resume (``RESUME_FAILED``).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.session_id = session_id
        self.code = code
        self.details: dict[str, Any] = dict(details or {})


class ServerShutdownError(SessionLostError):
    """The server shut down (or is shutting down) under this session: it answered
    ``SHUTTING_DOWN`` or closed the connection with 1001 "server shutting down". The session
    and its episode are gone; a restarted server does not know them. Retry the episode on a
    server that is up."""


class EnvNotFoundError(EnvSDKError, KeyError):
    """A registry lookup failed; the message lists the names that are known."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else ""
