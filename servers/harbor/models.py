"""Wire models of the Harbor server: ``HarborAction``, ``HarborObservation``, ``HarborState``.

A step action is one of the four tools as data (``{"tool": "bash", "command": "ls /app"}``),
so a client without MCP plays the same episode the tools play. The observation's ``text`` is
what the model reads (the instruction at reset, a tool's output after a step: the same
characters the tool returns over MCP); everything else travels in ``metadata``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from envsdk.types import Action, Observation, State

__all__ = ["TOOL_ARGUMENTS", "HarborAction", "HarborObservation", "HarborState"]

#: Each tool's arguments, in order: what a `HarborAction` of that tool must carry.
TOOL_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "bash": ("command",),
    "read_file": ("path",),
    "write_file": ("path", "content"),
    "submit": (),
}


class HarborAction(Action):
    """One tool call as a step: ``bash`` (``command``), ``read_file`` (``path``),
    ``write_file`` (``path``, ``content``) or ``submit`` (no argument: the agent is done)."""

    tool: Literal["bash", "read_file", "write_file", "submit"] = Field(description="The tool to call")
    command: str | None = Field(default=None, description="bash: the command line, run by bash in the task's container")
    path: str | None = Field(default=None, description="read_file, write_file: absolute, or relative to the working folder")
    content: str | None = Field(default=None, description="write_file: the file's new text")

    @model_validator(mode="after")
    def _arguments_of_the_tool(self) -> HarborAction:
        wanted = TOOL_ARGUMENTS[self.tool]
        given = {name for name in ("command", "path", "content") if getattr(self, name) is not None}
        missing = [name for name in wanted if name not in given]
        extra = sorted(given - set(wanted))
        if missing or extra:
            needs = ", ".join(wanted) if wanted else "no argument"
            raise ValueError(
                f"{self.tool} takes {needs}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; not taken: {', '.join(extra)}" if extra else "")
            )
        return self

    def arguments(self) -> dict[str, Any]:
        """The tool's arguments by name, as its MCP call takes them."""
        return {name: getattr(self, name) for name in TOOL_ARGUMENTS[self.tool]}


class HarborObservation(Observation):
    """``text``: at reset the task's instruction, after a step the tool's output as the model
    reads it; ``exit_code``: a ``bash`` step's exit status (negative: killed), else None.

    ``metadata``: ``task`` (name), ``task_metadata`` (the ``[metadata]`` table), at reset
    ``agent_timeout_s`` and ``max_steps``; after a step ``tool``, ``timed_out``,
    ``truncated``, ``timings`` (``time_s``: the step's seconds; ``verifier_s``: the
    verifier's, on the step that ran it); on the step that ends the episode ``ended``
    (``submit``, ``agent_timeout``, ``max_steps``), ``verifier`` (``exit_code``,
    ``timed_out``; never its output) and, from a ``reward.json``, ``reward_components``.
    Wall-clock figures are in ``timings`` only, so two equal episodes give equal observations
    but for it.
    """

    text: str = ""
    exit_code: int | None = None


class HarborState(State):
    """The episode: its task; once it ended (``done``), why (``ended``) and the verifier's
    verdict (``reward``, ``success``, ``reward_components``), or why there is none (``error``)."""

    task: str | None = Field(default=None, description="The episode's task (its folder's name)")
    done: bool = Field(default=False, description="Whether the episode has ended")
    reward: float = Field(default=0.0, description="The verifier's reward once the episode ended, else 0.0")
    success: bool | None = Field(
        default=None, description="Whether every test passed (reward >= 1.0); None until the verifier gave a reward",
    )
    ended: str | None = Field(default=None, description="Why the episode ended: submit, agent_timeout, max_steps")
    reward_components: dict[str, float] = Field(default_factory=dict, description="reward.json's named parts")
    error: str | None = Field(default=None, description="Why the verifier gave no reward (a broken task's one line)")
