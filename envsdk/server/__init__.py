"""envsdk's environment server: `create_app` builds a FastAPI app serving one environment over
`/ws` (OpenEnv's protocol plus opt-in extensions) and HTTP; `serve` runs it with uvicorn."""

from __future__ import annotations

from envsdk.server.app import create_app
from envsdk.server.config import ServerConfig
from envsdk.server.executors import run_in_process
from envsdk.server.launch import serve

__all__ = ["create_app", "ServerConfig", "serve", "run_in_process"]
