"""Wire models: OpenEnv's coding env shapes (``CodeAction``, ``CodeObservation``, ``CodeState``).

The observation body is exactly OpenEnv's (``stdout``, ``stderr``, ``exit_code``,
``metadata``), so OpenEnv's own client, which builds its strict model from the body, parses
it; everything else (the problem, the test verdict, the reward parts) travels in ``metadata``.
"""

from __future__ import annotations

from pydantic import Field

from envsdk.types import Action, Observation, State

__all__ = ["CodeAction", "CodeObservation", "CodeState"]


class CodeAction(Action):
    """Python code to run in the episode's persistent interpreter."""

    code: str = Field(description="Python source; names it defines stay for the next step")


class CodeObservation(Observation):
    """What the code printed and its exit status (0 ok, 1 an exception, negative: killed).

    ``metadata``: ``task_id``, ``prompt`` and ``entry_point`` of the problem; after a step,
    ``tests`` (``passed``, ``verdict``, ``output``, ``seconds``, ``timed_out``) when the program defines the
    entry point, ``timed_out``, ``truncated``, ``note``, and ``reward_components``
    (``compiles``, ``tests_passed``), ``timings`` (``time_s``: seconds the step took on the server).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class CodeState(State):
    last_exit_code: int = 0
    task_id: str | None = None
    reward: float = Field(default=0.0, description="1.0 once the problem's tests passed")
    solved: bool = False
    sandbox: str = Field(default="", description="The sandbox provider serving this session")
