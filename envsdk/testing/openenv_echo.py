"""envsdk.testing's echo environment written against OpenEnv's own base classes, and an app
built with OpenEnv's own `create_app`: the OpenEnv side of compatibility tests and benchmarks.
Importing this module imports openenv (a test extra)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from openenv.core.env_server import Action as OEAction
from openenv.core.env_server import Environment as OEEnvironment
from openenv.core.env_server import Observation as OEObservation
from openenv.core.env_server import State as OEState
from openenv.core.env_server import create_app as openenv_create_app


class OEEchoAction(OEAction):
    message: str


class OEEchoObservation(OEObservation):
    echoed_message: str = ""
    message_length: int = 0


class OEEchoEnvironment(OEEnvironment):
    """envsdk.testing.EchoEnvironment written against OpenEnv's own base classes."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = OEState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> OEEchoObservation:
        self._state = OEState(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return OEEchoObservation(echoed_message="ready", reward=0.0)

    def step(self, action: OEEchoAction, timeout_s: float | None = None, **kwargs: Any) -> OEEchoObservation:  # type: ignore[override]
        msg = action.message
        if msg.startswith("sleep:"):
            time.sleep(float(msg.split(":", 1)[1]))
        self._state.step_count += 1
        return OEEchoObservation(
            echoed_message=msg,
            message_length=len(msg),
            reward=len(msg) / 10.0,
            done=msg == "done",
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> OEState:
        return self._state


def make_openenv_app(max_concurrent_envs: int = 4) -> Any:
    return openenv_create_app(
        OEEchoEnvironment, OEEchoAction, OEEchoObservation, max_concurrent_envs=max_concurrent_envs
    )
