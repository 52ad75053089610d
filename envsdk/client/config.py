"""Small value objects that configure a client: `Timeouts` (with `ServerDeadline`),
`Keepalive`, `Retry`.

They replace loose keyword arguments (as httpx's ``Timeout`` and ``Limits`` do): one object
per concern, immutable, validated at construction, shareable between clients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Timeouts", "ServerDeadline", "Keepalive", "Retry"]


def _check_positive(name: str, value: float | None) -> None:
    # `not value > 0` rather than `value <= 0`: NaN is refused too.
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")


@dataclass(frozen=True)
class ServerDeadline:
    """A request timeout that follows the server: wait as long as the server says the request
    may take, plus ``margin`` seconds (the server's own work around the env call, and the
    reply's travel), so a long call the server allows is waited for and, past the server's
    deadline, its typed TIMEOUT arrives before the client gives up.

    An envsdk server says how long each kind of request may take in its session handshake
    (`envsdk.protocol.SessionInfo.deadlines_s`: a Harbor server allows minutes for a command or
    its verifier). Where the server says nothing (a plain OpenEnv server), the client waits
    ``otherwise`` seconds (OpenEnv's message timeout, 60 s; None: forever).
    """

    margin: float = 10.0
    otherwise: float | None = 60.0

    def __post_init__(self) -> None:
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be a finite number of seconds >= 0, got {self.margin!r}")
        _check_positive("otherwise", self.otherwise)

    def seconds(self, announced: float | None) -> float | None:
        """How long to wait for a reply the server announced `announced` seconds for (None:
        it announced nothing; a negative or non-finite number counts as nothing)."""
        if announced is None or not 0 <= announced < math.inf:
            return self.otherwise
        return announced + self.margin


@dataclass(frozen=True)
class Timeouts:
    """How long the client waits, in seconds; ``None`` waits forever.

    * ``connect`` — opening the socket and the session handshake (OpenEnv's default: 10 s).
    * ``request`` — from sending a request until its reply arrives. By default a
      `ServerDeadline`: as long as the server announced for that kind of request plus a
      margin, else 60 s (OpenEnv's message timeout). A number: that many seconds for every
      request, whatever the server allows. A reply that misses it counts as a dropped
      connection: a resumable session reconnects and resends, any other session is lost.
    * ``close`` — the closing handshake of the socket.
    """

    connect: float | None = 10.0
    request: float | ServerDeadline | None = ServerDeadline()
    close: float | None = 5.0

    def __post_init__(self) -> None:
        for name in ("connect", "request", "close"):
            value = getattr(self, name)
            if not isinstance(value, ServerDeadline):
                _check_positive(name, value)

    def request_s(self, announced: float | None) -> float | None:
        """Seconds to wait for the reply to a request the server announced `announced` seconds
        for (None: not announced); None waits forever."""
        if isinstance(self.request, ServerDeadline):
            return self.request.seconds(announced)
        return self.request


@dataclass(frozen=True)
class Keepalive:
    """WebSocket ping settings: a ping every ``interval`` seconds, the connection counted as
    dropped when its pong is ``timeout`` seconds late.

    ``Keepalive(None)`` or ``Keepalive.disabled()`` sends no pings at all, for tunnels and
    proxies that drop ping frames.
    """

    interval: float | None = 20.0
    timeout: float | None = 20.0

    def __post_init__(self) -> None:
        _check_positive("interval", self.interval)
        _check_positive("timeout", self.timeout)

    @classmethod
    def disabled(cls) -> Keepalive:
        """No pings: the connection is only known dead when a send or receive fails."""
        return cls(interval=None, timeout=None)

    @property
    def enabled(self) -> bool:
        return self.interval is not None


@dataclass(frozen=True)
class Retry:
    """How a resumable session reconnects after a dropped connection.

    At most ``max_attempts`` reconnect attempts are made for one request; before attempt
    ``n`` (0-based) the client waits ``min(backoff_max, backoff_base * 2**n)`` seconds.
    ``Retry(max_attempts=0)`` never reconnects: any drop loses the session.
    """

    max_attempts: int = 5
    backoff_base: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {self.max_attempts!r}")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise ValueError("backoff_base and backoff_max must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0-based)."""
        return float(min(self.backoff_max, self.backoff_base * (2**attempt)))
