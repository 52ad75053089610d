"""The Host allow-list: which ``Host`` header values a server answers (DNS rebinding).

A page on ``http://attacker.example`` can make its name resolve to 127.0.0.1 after loading; the
browser then sends the server on the user's machine requests that are "same origin" for it
(``Origin`` and ``Host`` both ``attacker.example:PORT``), so the Origin check alone lets them
through. The ``Host`` header is the one thing such a request cannot fake: it names the
attacker's domain.

`HostPolicy` decides from ``ServerConfig.allowed_hosts``:

* ``None`` (the default): a connection that arrived on a loopback address (the server is bound
  to, or reached through, 127.0.0.1 or ::1) must name ``localhost``, ``127.0.0.1`` or ``::1``;
  connections on other addresses are not checked (a server on a network interface is reached by
  whatever names its operators give it; list them to check them).
* a list: only those host names (any port); ``*.example.com`` matches its subdomains; ``*`` any.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["LOOPBACK_HOSTS", "HostPolicy", "host_name"]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Host names served by default on a loopback connection."""


def host_name(host: str) -> str:
    """The name part of a Host header value, lower-cased: ``"[::1]:80"`` → ``"::1"``,
    ``"Example.com.:8000"`` → ``"example.com"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.partition("%")[0]).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Whether a request's Host header is one this server answers (see the module docstring)."""

    def __init__(self, allowed_hosts: Sequence[str] | None) -> None:
        self.configured = allowed_hosts is not None
        names = [host_name(h) for h in (allowed_hosts or ())]
        self._any = "*" in names
        self._exact = frozenset(n for n in names if not n.startswith("*."))
        self._suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host: str | None, local_address: str | None) -> bool:
        """Whether `host` (the Host header, None if absent) may be served on a connection that
        arrived on `local_address` (the server's side of the socket; None if unknown)."""
        if self._any:
            return True
        if not self.configured:
            if local_address is None or not _is_loopback(local_address):
                return True
            return host is not None and host_name(host) in LOOPBACK_HOSTS
        if host is None:
            return False
        name = host_name(host)
        return name in self._exact or name.endswith(self._suffixes)

    def describe(self) -> str:
        """The allowed names, for an error message."""
        if not self.configured:
            return ", ".join(sorted(LOOPBACK_HOSTS))
        return ", ".join(sorted(self._exact) + [f"*{s}" for s in self._suffixes])
