"""envsdk: environment servers, clients and multi-turn schedulers for agentic RL of LLMs."""

from __future__ import annotations

from typing import Any

from envsdk.env import Env, Environment, RolloutRequest
from envsdk.errors import (
    AuthenticationError,
    CapacityError,
    ConnectError,
    EnvNotFoundError,
    EnvSDKError,
    EnvTimeoutError,
    EpisodeDoneError,
    NotResetError,
    ProtocolError,
    RequestEncodingError,
    ServerError,
    ServerShutdownError,
    SessionLostError,
)
from envsdk.types import Action, Observation, State, StepResult

__version__ = "0.1.0"

# Heavier pieces load on first use so that `import envsdk` stays cheap.
_LAZY = {
    "create_app": "envsdk.server",
    "ServerConfig": "envsdk.server",
    "EnvClient": "envsdk.client",
    "OpenEnvWrapper": "envsdk.client",
    "EnvPool": "envsdk.client.pool",
}

__all__ = [
    "Action",
    "Observation",
    "State",
    "StepResult",
    "Environment",
    "Env",
    "RolloutRequest",
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
    "RequestEncodingError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envsdk' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
