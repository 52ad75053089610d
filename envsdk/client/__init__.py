"""The client side: an async `EnvClient`, a blocking `OpenEnvWrapper`, and the transports
that carry frames (a real WebSocket, or an in-process ASGI app with no socket), and `EnvPool`,
which places episodes on many servers."""

from __future__ import annotations

from envsdk.client.client import EnvClient, ServerKind, error_from_frame, websocket_url
from envsdk.client.config import Keepalive, Retry, ServerDeadline, Timeouts
from envsdk.client.pool import EnvPool, NoServerAvailableError, PooledEnvClient, PoolSettings, pools
from envsdk.client.sync import OpenEnvWrapper
from envsdk.client.transports import (
    DEFAULT_MAX_FRAME_BYTES,
    Connection,
    ConnectionSettings,
    InProcessTransport,
    Transport,
    TransportClosed,
    WebSocketTransport,
)

__all__ = [
    "EnvClient",
    "OpenEnvWrapper",
    "EnvPool",
    "PoolSettings",
    "PooledEnvClient",
    "NoServerAvailableError",
    "pools",
    "ServerKind",
    "Timeouts",
    "ServerDeadline",
    "Keepalive",
    "Retry",
    "Transport",
    "Connection",
    "ConnectionSettings",
    "TransportClosed",
    "WebSocketTransport",
    "InProcessTransport",
    "DEFAULT_MAX_FRAME_BYTES",
    "error_from_frame",
    "websocket_url",
]
