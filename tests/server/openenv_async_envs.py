"""OpenEnv environments whose ``reset_async`` / ``step_async`` differ from their sync methods,
as OpenEnv 0.10's server calls the async ones when a class overrides them. Each observation
says which variant answered, on which thread and which event loop.

Self-contained (it imports only openenv), so that the CLI tests can copy it into a user's folder."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class A(Action):
    message: str


class O(Observation):
    text: str = ""
    thread: int = 0
    loop: int = 0


def _where() -> dict[str, int]:
    return {"thread": threading.get_ident(), "loop": id(asyncio.get_running_loop())}


class OEnv(Environment):
    """The README user's env: the sync methods answer "sync ...", the async ones "ASYNC ...".
    ``step_async`` of "hang" sleeps 5 s (its deadline is 1 s), of "hang-for-an-hour" an hour;
    of "end" ends the episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    step_timeout_s = 1.0

    def __init__(self) -> None:
        super().__init__()
        self._s = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> O:
        return O(text="sync reset")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> O:
        await asyncio.sleep(0)
        self._s = State(episode_id=episode_id, step_count=0)
        return O(text=f"ASYNC reset {seed}", **_where())

    def step(self, action: A) -> O:
        return O(text="sync step")

    async def step_async(self, action: A, timeout_s: float | None = None, **kw: Any) -> O:
        if action.message == "hang":
            await asyncio.sleep(5)
        if action.message == "hang-for-an-hour":
            await asyncio.sleep(3600)
        await asyncio.sleep(0)
        self._s.step_count += 1
        return O(text=f"ASYNC step {action.message}", done=action.message == "end", **_where())

    @property
    def state(self) -> State:
        return self._s


class SoundAsyncEnv(Environment):
    """Deterministic, and its async methods are the ones served: check-env passes it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._s = State(step_count=0)
        self._seed = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> O:
        return O(text="sync reset")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> O:
        self._seed = seed or 0
        self._s = State(episode_id=episode_id, step_count=0)
        return O(text=f"reset {self._seed}")

    def step(self, action: A) -> O:
        return O(text="sync step")

    async def step_async(self, action: A, timeout_s: float | None = None, **kw: Any) -> O:
        self._s.step_count += 1
        return O(text=f"{self._seed}: {action.message}", reward=1.0, done=self._s.step_count >= 2)

    @property
    def state(self) -> State:
        return self._s


class HangingStepAsyncEnv(SoundAsyncEnv):
    """Its sync step is sound; the ``step_async`` a server calls never returns."""

    async def step_async(self, action: A, timeout_s: float | None = None, **kw: Any) -> O:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")
