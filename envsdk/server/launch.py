"""`serve`: run an app with uvicorn, bound to loopback unless told otherwise."""

from __future__ import annotations

import os
from typing import Any

import uvicorn

from envsdk.server.config import ServerConfig

__all__ = ["serve"]

# Frames up to this multiple of max_frame_bytes reach the app and get a typed FRAME_TOO_LARGE
# reply; larger ones are refused by the WebSocket layer itself (close 1009).
_WS_MAX_SIZE_FACTOR = 4


def serve(
    app_or_target: Any,
    host: str | None = None,
    port: int | None = None,
    *,
    log_level: str = "info",
    **uvicorn_kwargs: Any,
) -> None:
    """Run `app_or_target` (an ASGI app, or uvicorn's ``"module:attr"`` import string) until
    interrupted.

    `host` defaults to ``$HOST``, else ``127.0.0.1`` (never all interfaces by default); `port`
    to ``$PORT``, else 8000. For an app built by `create_app`, uvicorn's ``ws_max_size`` is
    set to 4 × ``max_frame_bytes`` unless given. Other keyword arguments go to `uvicorn.run`.
    """
    host = host or os.environ.get("HOST") or "127.0.0.1"
    port = port if port is not None else int(os.environ.get("PORT") or 8000)
    config = getattr(getattr(app_or_target, "state", None), "envsdk_config", None)
    if isinstance(config, ServerConfig):
        uvicorn_kwargs.setdefault("ws_max_size", config.max_frame_bytes * _WS_MAX_SIZE_FACTOR)
    uvicorn.run(app_or_target, host=host, port=port, log_level=log_level, **uvicorn_kwargs)
