"""`ToolScheduler`: any tool environment (envsdk ``@tool`` methods or an OpenEnv
``MCPEnvironment``) driven by a model's tool calls, with no adapter written per environment.

At the start of a trajectory the tools are discovered over MCP (OpenEnv's ``list_tools`` step
action, which every client, pool and server here speaks) and listed in the system message, in
the ``<tools>`` block Qwen/Hermes chat templates use. Each model reply is read for one tool call
(``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, or that JSON object alone) and sent as
OpenEnv's ``call_tool`` step action; the tool's value (or its error) is the next user message.
A reply without a tool call ends the episode (status ``done``, reason ``no tool call``).

Reward: a tool env reports its episode reward in its state's ``reward`` field (see
examples/ledger_tools.py); it is read before the session closes and becomes the trajectory's
``total_reward``. A boolean ``success`` in the state, if it has one, is the episode's success.

`serves_tools` tells whether a server is a tool environment (its ``/mcp`` lists tools);
`scheduler_for` names the scheduler to play a server with, so a tool server is never played as
a text environment by mistake. Registered in `envsdk.registry.schedulers` as ``tools``; under ms-swift the
same scheduler runs through the bridge of examples/swift (``make_core`` returning it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from envsdk.schedulers.base import StepRecord, Trajectory, TurnResult
from envsdk.schedulers.openenv import OpenEnvScheduler, server_json
from envsdk.tools import ToolSpec

__all__ = ["ToolScheduler", "parse_tool_call", "TOOLS_SYSTEM_MESSAGE", "serves_tools", "scheduler_for"]


def serves_tools(base_url: str) -> bool:
    """Whether the server at `base_url` is a tool environment: its ``POST /mcp`` ``tools/list``
    (OpenEnv 0.10's MCP wire, which envsdk and OpenEnv servers both answer) lists at least one
    tool. False when it lists none, refuses, or cannot be asked. Blocking (one HTTP request of
    at most 10 s)."""
    try:
        reply = server_json(base_url, "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    except (OSError, ValueError):
        return False
    result = reply.get("result") if isinstance(reply, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    return isinstance(tools, list) and len(tools) > 0


def scheduler_for(base_url: str) -> str:
    """The registered scheduler to play the server at `base_url` with: ``"tools"`` for a tool
    environment (`serves_tools`), else ``"openenv"``. Blocking, like `serves_tools`."""
    return "tools" if serves_tools(base_url) else "openenv"

TOOLS_SYSTEM_MESSAGE = (
    "You may call one of these tools per reply. Tools:\n<tools>\n{tools}\n</tools>\n"
    'Call a tool as <tool_call>{{"name": <tool name>, "arguments": <JSON object>}}</tool_call>.'
)

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The (name, arguments) of the first tool call in a reply, or None when it has none."""
    found = _TOOL_CALL.search(text)
    body = found.group(1) if found else text.strip()
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (call["name"], arguments) if isinstance(arguments, dict) else None


class ToolScheduler(OpenEnvScheduler):
    """`OpenEnvScheduler` for tool environments: replies are tool calls, observations their
    values; see the module docstring. Takes `OpenEnvScheduler`'s arguments."""

    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        await super().on_trajectory_start(trajectory)
        listed, _ = await self.env_step(trajectory, {"type": "list_tools"})
        tools = _as_observation(listed.observation).get("tools") or []
        specs = [ToolSpec.from_wire(t) for t in tools]
        described = "\n".join(
            json.dumps({"type": "function", "function": {"name": s.name, "description": s.description,
                                                        "parameters": s.input_schema}})
            for s in specs
        )
        block = TOOLS_SYSTEM_MESSAGE.format(tools=described)
        messages = trajectory.messages
        if messages and messages[0].get("role") == "system":
            messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
        else:
            messages.insert(0, {"role": "system", "content": block})

    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        call = parse_tool_call(response_text)
        if call is None:
            trajectory.finish("done", "no tool call")
            return {"done": True, "rollout_infos": {"total_reward": trajectory.total_reward}}
        name, arguments = call
        action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        result, duration = await self.env_step(trajectory, action)
        observation = _as_observation(result.observation)
        trajectory.steps.append(
            StepRecord(turn=turn, action=action, observation=observation, reward=0.0, done=bool(result.done),
                       info={"tool_error": observation.get("error")} if observation.get("error") else {},
                       duration_s=duration)
        )
        return {"done": bool(result.done), "rollout_infos": {"tool_calls": len(trajectory.steps)}}

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        try:
            state = await self._final_state(trajectory)
            reward = state.get("reward")
            if isinstance(reward, (int, float)) and not isinstance(reward, bool):
                trajectory.total_reward = float(reward)
                trajectory.rollout_infos["total_reward"] = float(reward)
            if isinstance(state.get("success"), bool):
                trajectory.rollout_infos["success"] = state["success"]
        finally:
            await super().on_trajectory_end(trajectory)

    def is_success(self, trajectory: Trajectory) -> bool | None:
        """The ``success`` the env's state stated at the end, if any (a reward is not one)."""
        stated = trajectory.rollout_infos.get("success")
        return stated if isinstance(stated, bool) else super().is_success(trajectory)

    async def _final_state(self, trajectory: Trajectory) -> dict[str, Any]:
        episode = trajectory.runtime
        read_state = getattr(getattr(episode, "session", None), "state", None)
        if read_state is None:
            return {}
        try:
            state = await read_state()
        except Exception:  # the session is gone: the episode has no reward to report
            return {}
        return state if isinstance(state, dict) else {}


def _as_observation(observation: Any) -> dict[str, Any]:
    return observation if isinstance(observation, dict) else {}
