"""A tool environment written against OpenEnv's own `MCPEnvironment` and FastMCP: the OpenEnv
side of the MCP tests (each instance keeps its own running total, so sessions can be told apart)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

from envsdk.env import Environment
from envsdk.testing import EchoAction, EchoObservation
from envsdk.tools import tool
from envsdk.types import State as EnvState

__all__ = ["TallyMCPEnvironment", "QuizMCPEnvironment", "SlowToolsEnvironment", "CallToolAction", "CallToolObservation"]


class TallyMCPEnvironment(MCPEnvironment):
    """Tools: ``add(a, b)``, ``tally(x)`` (adds to this instance's total, returns it),
    ``nap(seconds)`` (sleeps) and ``fail(message)`` (raises)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        server = FastMCP("tally")
        self.total = 0

        @server.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @server.tool
        def tally(x: int) -> int:
            """Add x to this session's running total and return the total."""
            self.total += x
            return self.total

        @server.tool
        async def nap(seconds: float) -> str:
            """Sleep, then say so."""
            import asyncio

            await asyncio.sleep(seconds)
            return "rested"

        @server.tool
        def fail(message: str) -> str:
            """Raise an error with this message."""
            raise ValueError(message)

        super().__init__(server)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self.total = 0
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"total": self.total})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return Observation(done=False, reward=0.0, metadata={"total": self.total, "t": time.time()})

    @property
    def state(self) -> State:
        return self._state


class SlowToolsEnvironment(Environment[EchoAction, EchoObservation, EnvState]):
    """An envsdk tool env whose tools sleep or count, for deadlines and exactly-once."""

    step_timeout_s = 1.0

    def __init__(self) -> None:
        self._state = EnvState()
        self.count = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        self._state = EnvState(episode_id=episode_id or str(uuid.uuid4()))
        return EchoObservation(echoed_message=str(threading.get_ident()))

    def step(self, action: EchoAction) -> EchoObservation:
        return EchoObservation(echoed_message=action.message)

    @property
    def state(self) -> EnvState:
        return self._state

    @tool
    def slow(self, seconds: float) -> str:
        """Sleep for `seconds`."""
        time.sleep(seconds)
        return "awake"

    @tool
    def thread_id(self) -> int:
        """The thread this call runs on."""
        return threading.get_ident()

    @tool
    async def bump(self) -> int:
        """Count one more and return the count."""
        self.count += 1
        return self.count


class QuizMCPEnvironment(MCPEnvironment):
    """Built like OpenEnv's FinQA env: `step` and `step_async` count the steps and end the episode
    when ``submit_answer`` is called (reward 1.0 for the right answer, "42"). Tools: ``lookup(key)``,
    ``submit_answer(answer)``, ``total(values)`` (a list argument, for wide validation errors) and
    ``hang(seconds)`` (a synchronous sleep); a tool call's deadline is 1 s. `built` counts instances."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    tool_timeout_s = 1.0
    built = 0
    _count_lock = threading.Lock()

    def __init__(self) -> None:
        with QuizMCPEnvironment._count_lock:
            QuizMCPEnvironment.built += 1
        server = FastMCP("quiz")

        @server.tool
        def lookup(key: str) -> str:
            """The fact stored under `key`."""
            return f"{key} is 42"

        @server.tool
        def submit_answer(answer: str) -> str:
            """Submit the final answer."""
            return f"submitted {answer}"

        @server.tool
        def total(values: list[int]) -> int:
            """The sum of `values`."""
            return sum(values)

        @server.tool
        def hang(seconds: float) -> str:
            """Block this call's thread for `seconds`."""
            time.sleep(seconds)
            return "woke"

        super().__init__(server)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"question": "what is the answer?"})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": "use the tools"})

    def _scored(self, action: Action, obs: Observation) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name == "submit_answer":
            right = action.arguments.get("answer") == "42"
            return Observation(done=True, reward=1.0 if right else 0.0, metadata={**obs.metadata, "right": right})
        return obs

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state
