"""The environment of OpenEnv's scaling study, twice: against envsdk's base classes and against
OpenEnv's, each served by its own framework's ``create_app`` (``python -m bench.servers
envsdk-wait`` / ``openenv-wait``, for `bench.openenv_scaling`).

What the study's environment does, and so these: a step sleeps, in env code, for the seconds its
action asks (``{"wait_seconds": w}``), so that what is measured is the server's handling of
sessions, not the environment; a reset and a step answer the process id and a hash unique to the
session, by which a client can tell that each session reached its own environment instance.
Both are plain sync environments, as the study's is: envsdk runs them on its default path (each
session's calls on its lane), OpenEnv on its thread per session.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from pydantic import Field

from envsdk.env import Environment
from envsdk.types import Action, Observation, State

MAX_WAIT_S = 600.0
"""The longest sleep a step may ask for: a bound, so that no request can hold a lane for ever."""


class WaitAction(Action):
    wait_seconds: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class WaitObservation(Observation):
    waited_seconds: float = 0.0
    pid: int = 0
    session_hash: str = ""
    step_count: int = 0


class WaitEnvironment(Environment[WaitAction, WaitObservation, State]):
    """Sleeps for the action's ``wait_seconds`` on each step; answers its pid and session hash."""

    def __init__(self) -> None:
        self._session_hash = uuid.uuid4().hex[:12]
        self._state = State(step_count=0)

    def _observe(self, waited: float) -> WaitObservation:
        return WaitObservation(
            waited_seconds=waited, pid=os.getpid(), session_hash=self._session_hash, step_count=self._state.step_count
        )

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> WaitObservation:
        self._state = State(episode_id=episode_id or self._session_hash, step_count=0)
        return self._observe(0.0)

    def step(self, action: WaitAction) -> WaitObservation:
        self._state.step_count += 1
        if action.wait_seconds > 0:
            time.sleep(action.wait_seconds)
        return self._observe(action.wait_seconds)

    @property
    def state(self) -> State:
        return self._state


def envsdk_app(max_sessions: int) -> Any:
    """envsdk serving `WaitEnvironment` on its default path; step deadline above `MAX_WAIT_S`."""
    from envsdk.server import create_app

    return create_app(
        WaitEnvironment, WaitAction, WaitObservation, max_concurrent_envs=max_sessions, web=False,
        step_timeout_s=MAX_WAIT_S + 30,
    )


def openenv_app(max_sessions: int) -> Any:
    """OpenEnv's own ``create_app`` serving the same environment written against OpenEnv's
    base classes (imported here only: openenv is a test extra)."""
    from openenv.core.env_server import Action as OEAction
    from openenv.core.env_server import Environment as OEEnvironment
    from openenv.core.env_server import Observation as OEObservation
    from openenv.core.env_server import State as OEState
    from openenv.core.env_server import create_app as openenv_create_app

    class OEWaitAction(OEAction):  # type: ignore[misc]  # openenv is untyped
        wait_seconds: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)

    class OEWaitObservation(OEObservation):  # type: ignore[misc]
        waited_seconds: float = 0.0
        pid: int = 0
        session_hash: str = ""
        step_count: int = 0

    class OEWaitEnvironment(OEEnvironment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._session_hash = uuid.uuid4().hex[:12]
            self._state = OEState(step_count=0)

        def _observe(self, waited: float) -> Any:
            return OEWaitObservation(
                waited_seconds=waited, pid=os.getpid(), session_hash=self._session_hash,
                step_count=self._state.step_count,
            )

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Any:
            self._state = OEState(episode_id=episode_id or self._session_hash, step_count=0)
            return self._observe(0.0)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            self._state.step_count += 1
            if action.wait_seconds > 0:
                time.sleep(action.wait_seconds)
            return self._observe(action.wait_seconds)

        @property
        def state(self) -> Any:
            return self._state

    return openenv_create_app(
        OEWaitEnvironment, OEWaitAction, OEWaitObservation, env_name="benchmark", max_concurrent_envs=max_sessions
    )
