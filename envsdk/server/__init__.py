"""envsdk's environment server: `create_app` builds a FastAPI app serving one environment over
`/ws` (OpenEnv's protocol plus opt-in extensions) and HTTP; `serve` runs it with uvicorn.

The names below load on first use, so that importing a light module of this package (its
configuration, as every ``envsdk`` command does to describe ``serve``) does not import FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envsdk.server.app import create_app
    from envsdk.server.config import ServerConfig
    from envsdk.server.executors import run_in_process
    from envsdk.server.launch import serve

__all__ = ["ServerConfig", "create_app", "run_in_process", "serve"]


def __getattr__(name: str) -> Any:
    # Each name from its own module, named here: no module is looked up from a string.
    if name == "create_app":
        from envsdk.server.app import create_app

        return create_app
    if name == "ServerConfig":
        from envsdk.server.config import ServerConfig

        return ServerConfig
    if name == "serve":
        from envsdk.server.launch import serve

        return serve
    if name == "run_in_process":
        from envsdk.server.executors import run_in_process

        return run_in_process
    raise AttributeError(f"module 'envsdk.server' has no attribute {name!r}")
