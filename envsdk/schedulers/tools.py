"""`ToolScheduler`: any tool environment (envsdk ``@tool`` methods or an OpenEnv
``MCPEnvironment``) driven by a model's tool calls, with no adapter written per environment.

At the start of a trajectory the tools are discovered over MCP (OpenEnv's ``list_tools`` step
action, which every client, pool and server here speaks). Every tool call of a reply is sent,
in the reply's order, as OpenEnv's ``call_tool`` step action; a reply without a tool call ends
the episode (status ``done``, reason ``no tool call``). Two forms, chosen per trajectory:

* **native** (a policy whose ``supports_tools`` is true: an OpenAI-compatible endpoint, a
  transformers model with a tool-calling chat template): the policy is given the tools as
  OpenAI tool definitions (`tools_for`), which its chat template renders; no tool is listed by
  hand. Each entry of the assistant message's ``tool_calls`` is a call, and each result
  becomes a ``{"role": "tool", "tool_call_id": …, "name": …, "content": …}`` message, as
  OpenAI's chat API and Hugging Face chat templates expect. A call whose arguments are not a
  JSON object is answered with an error and not run (every call id gets its answer).
* **text** (any other policy; ms-swift's rollout loop): the tools are listed in the system
  message, in the ``<tools>`` block Qwen/Hermes templates write, and the reply is read for
  ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks (or that JSON object alone).
  The results come back as one user message of ``<tool_response>`` blocks, one per call in
  order: the characters a Qwen chat template renders for tool turns. They are not ``tool``
  messages: an endpoint or template without tool support refuses a ``tool`` message that
  answers no ``tool_calls``, or renders it under a role the model never learnt.

The form is the policy's (``supports_tools``) unless ``tool_format`` says otherwise; records
state it (``infos["tool_format"]``), and a native record keeps the tool definitions the model
was given (``infos["tools"]``), so its messages can be rendered again as the model read them
(`envsdk.tools.chat_template_messages`).

Reward: a tool env reports its episode reward in its state's ``reward`` field (see
examples/ledger_tools.py); it is read before the session closes and becomes the trajectory's
``total_reward``. A boolean ``success`` in the state, if it has one, is the episode's success.
The reward's named parts are a rubric's parts on the wire (a call's ``reward_components``
metadata, kept on its step), or, where no call carried any, the state's ``reward_components``
(Harbor's: a ``reward.json``'s other numbers), kept on the step that ended the episode; either
way they are the record's ``reward_components``.

An episode whose env failed on the very call that ended it (a Harbor verifier that wrote no
reward, NaN or garbage: the ``submit`` answered with the env's error) has no verdict: its
reward is no score of the agent's work. It ends in an error (status ``error``, ``error_kind``
``ToolCallError``, the env's one-line error as the reason), as a step the env failed on does,
never as an episode that scored 0.0.

The end of an episode: a tool call cannot say that it ended the episode (an envsdk ``@tool``
answers ``done: false``), so a tool env whose state has a ``done`` field says it there: the
state is read after the first call and, where it has that field, after every call; the call
after which it is true ended the episode (Harbor's ``submit``, its time or step limit): the
reply's later calls are not run, and that step is recorded as done. An env that offers a tool
named ``submit`` taking no argument judges the work when it is called: when the episode ends
otherwise (a reply without a tool call, which is the agent saying it is done; ``max_turns``; a
cut reply) and the env has not ended it, the scheduler calls ``submit`` itself (a step of the
record; ``infos["submitted"]``) before it reads the reward, so that the verdict is the env's,
never an unjudged default. Not after an error or a cancel.

`serves_tools` tells whether a server is a tool environment (its ``/mcp`` lists tools);
`scheduler_for` names the scheduler to play a server with, so a tool server is never played as
a text environment by mistake. Registered in `envsdk.registry.schedulers` as ``tools``; under ms-swift the
same scheduler runs through the bridge of examples/swift (``make_core`` returning it).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from envsdk.env import RolloutRequest
from envsdk.errors import ToolCallError, mask_secrets
from envsdk.formats import ObservationFormatter
from envsdk.rewards.parts import REWARD_PARTS, components_from, episode_parts, evaluated
from envsdk.schedulers.base import DEFAULT_CUT_RULE, CutRule, Policy, StepRecord, Trajectory, TurnResult
from envsdk.schedulers.openenv import EnvSession, OpenEnvScheduler, server_json
from envsdk.tools import ToolCall, ToolSpec

if TYPE_CHECKING:
    from envsdk.client.pool import PoolSpec

logger = logging.getLogger("envsdk.schedulers")

__all__ = [
    "ToolScheduler",
    "ToolFormat",
    "TOOL_FORMATS",
    "ToolFormatError",
    "parse_tool_call",
    "parse_tool_calls",
    "tool_responses",
    "TOOLS_SYSTEM_MESSAGE",
    "serves_tools",
    "scheduler_for",
    "SUBMIT_TOOL",
]

ToolFormat = Literal["native", "text"]
#: The forms a tool environment can be played in (see the module docstring).
TOOL_FORMATS: tuple[ToolFormat, ...] = ("native", "text")


class ToolFormatError(ValueError):
    """The tool form asked for cannot be played with the policy given."""


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
    "You may call one or more of these tools per reply. Tools:\n<tools>\n{tools}\n</tools>\n"
    'Call each tool as <tool_call>{{"name": <tool name>, "arguments": <JSON object>}}</tool_call>; '
    "the results come back in <tool_response> blocks, in the order of the calls."
)

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call_object(body: str) -> tuple[str, dict[str, Any]] | None:
    """The (name, arguments) a ``{"name": …, "arguments": {…}}`` JSON text holds, else None."""
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


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call a text reply makes, in order: one per ``<tool_call>`` block, or, when
    it has no block, the reply itself when it is one call object. A block that holds no call
    object is a `ToolCall` with its ``error`` (answered, not run). [] when it makes no call."""
    blocks = [found.group(1).strip() for found in _TOOL_CALL.finditer(text)]
    if not blocks:
        call = _call_object(text.strip())
        return [] if call is None else [ToolCall(name=call[0], arguments=call[1])]
    calls = []
    for body in blocks:
        call = _call_object(body)
        if call is None:
            calls.append(ToolCall(name="", error=f'not a call object {{"name": …, "arguments": {{…}}}}: {body[:200]}'))
        else:
            calls.append(ToolCall(name=call[0], arguments=call[1]))
    return calls


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The (name, arguments) of the first tool call in a reply, or None when it has none."""
    first = next((c for c in parse_tool_calls(text) if c.error is None), None)
    return None if first is None else (first.name, first.arguments)


def tool_responses(results: list[str]) -> str:
    """Tool results as one user message of the text form: a ``<tool_response>`` block each,
    as a Qwen chat template renders consecutive ``tool`` messages."""
    return "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)


#: The tool an env judges the work with when it is called with no argument (see the module docstring).
SUBMIT_TOOL = "submit"


@dataclass
class _ToolPlay:
    """What a trajectory of `ToolScheduler` keeps: its form, the tools it was given and the
    last turn's results, for `ToolScheduler.step`; whether the env's state says when the
    episode ends (None: not known yet) and whether the env ended it."""

    native: bool
    tools: list[dict[str, Any]]
    answers: list[tuple[ToolCall, str]] = field(default_factory=list)
    states_done: bool | None = None
    env_ended: bool = False


class ToolScheduler(OpenEnvScheduler):
    """`OpenEnvScheduler` for tool environments: replies are tool calls, observations their
    values; see the module docstring. Takes `OpenEnvScheduler`'s arguments and ``tool_format``:
    ``"native"`` or ``"text"`` for every trajectory, None (the default) for the policy's own
    (native when its ``supports_tools`` is true). ``"native"`` with a policy that takes no
    tools raises `ToolFormatError` when the run starts."""

    def __init__(
        self,
        *,
        base_url: PoolSpec | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        system_message: str | None = None,
        max_concurrent_envs: int = 4,
        max_turns: int = 10,
        max_completion_chars: int | None = None,
        use_threads: bool = False,
        client_factory: Callable[[str], EnvSession] | None = None,
        formatter: str | ObservationFormatter | None = None,
        cut_replies: CutRule = DEFAULT_CUT_RULE,
        cut_penalty: float | None = None,
        tool_format: ToolFormat | None = None,
    ) -> None:
        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise ToolFormatError(f"tool_format must be one of {', '.join(TOOL_FORMATS)} (or None), got {tool_format!r}")
        super().__init__(
            base_url=base_url, reset_kwargs=reset_kwargs, system_message=system_message,
            max_concurrent_envs=max_concurrent_envs, max_turns=max_turns, max_completion_chars=max_completion_chars,
            use_threads=use_threads, client_factory=client_factory, formatter=formatter,
            cut_replies=cut_replies, cut_penalty=cut_penalty,
        )
        self.tool_format: ToolFormat | None = tool_format

    def tool_format_for(self, policy: Any) -> ToolFormat:
        """The form trajectories played by `policy` take (see the class docstring)."""
        supports = bool(getattr(policy, "supports_tools", False))
        if self.tool_format == "native" and not supports:
            raise ToolFormatError(
                f"tool_format 'native' needs a policy that takes tools= (supports_tools), and "
                f"{type(policy).__name__} does not: use 'text', or leave it unset to follow the policy"
            )
        return self.tool_format or ("native" if supports else "text")

    async def run(
        self,
        requests: list[RolloutRequest],
        policy: Policy,
        *,
        max_concurrency: int | None = None,
        on_done: Any = None,
    ) -> list[Trajectory]:
        self.tool_format_for(policy)  # a form the policy cannot play is refused before any episode
        return await super().run(requests, policy, max_concurrency=max_concurrency, on_done=on_done)

    async def run_trajectory(self, trajectory: Trajectory, policy: Policy) -> Trajectory:
        trajectory.rollout_infos["tool_format"] = self.tool_format_for(policy)
        return await super().run_trajectory(trajectory, policy)

    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        await super().on_trajectory_start(trajectory)
        listed, _ = await self.env_step(trajectory, {"type": "list_tools"})
        tools = [ToolSpec.from_wire(t).openai() for t in _as_observation(listed.observation).get("tools") or []]
        # Driven without a policy at hand (ms-swift's loop calls the hooks): the scheduler's form, else text.
        native = trajectory.rollout_infos.get("tool_format", self.tool_format) == "native"
        trajectory.rollout_infos["tool_format"] = "native" if native else "text"
        self.episode(trajectory).game = _ToolPlay(native=native, tools=tools)
        if native:
            trajectory.rollout_infos["tools"] = tools
            return
        block = TOOLS_SYSTEM_MESSAGE.format(tools="\n".join(json.dumps(t) for t in tools))
        messages = trajectory.messages
        if messages and messages[0].get("role") == "system":
            messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
        else:
            messages.insert(0, {"role": "system", "content": block})

    def tools_for(self, trajectory: Trajectory) -> list[dict[str, Any]] | None:
        """The env's tools as OpenAI tool definitions in the native form, None in the text form
        (the system message lists them)."""
        play = self._play(trajectory)
        return play.tools if play.native else None

    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        play = self._play(trajectory)
        calls = self._native_calls(trajectory) if play.native else parse_tool_calls(response_text)
        if not calls:
            trajectory.finish("done", _no_call_reason(play.native, response_text))
            return {"done": True, "rollout_infos": {"total_reward": trajectory.total_reward}}
        play.answers = []
        done = False
        for call in calls:  # in the reply's order, one after another on the session
            observation, done = await self._run_call(trajectory, call, turn)
            if not done and call.error is None and play.states_done is not False:
                done = trajectory.steps[-1].done = await self._state_says_done(trajectory, play)
            play.answers.append((call, self.observation_text(trajectory, observation)))
            if done:  # the env ended the episode: later calls are not run
                break
        play.env_ended = done
        return {"done": done, "rollout_infos": {"tool_calls": len(trajectory.steps)}}

    async def step(self, trajectory: Trajectory, turn_result: TurnResult, turn: int) -> None:
        play = self._play(trajectory)
        if play.native:
            trajectory.messages.extend(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}
                for call, text in play.answers
            )
        else:
            trajectory.messages.append({"role": "user", "content": tool_responses([text for _, text in play.answers])})

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        try:
            try:
                await self._submit_for_the_agent(trajectory)
            except Exception as exc:  # the call that was to judge the work failed: no verdict
                _fail(trajectory, exc)
                return
            if self._fail_without_verdict(trajectory):
                return
            state = await self._final_state(trajectory)
            reward = state.get("reward")
            if isinstance(reward, (int, float)) and not isinstance(reward, bool):
                trajectory.total_reward = float(reward)
                trajectory.rollout_infos["total_reward"] = float(reward)
            if isinstance(state.get("success"), bool):
                trajectory.rollout_infos["success"] = state["success"]
            self._take_parts(trajectory, state)
        finally:
            await super().on_trajectory_end(trajectory)

    def is_success(self, trajectory: Trajectory) -> bool | None:
        """The ``success`` the env's state stated at the end, if any (a reward is not one)."""
        stated = trajectory.rollout_infos.get("success")
        return stated if isinstance(stated, bool) else super().is_success(trajectory)

    # ------------------------------------------------------------ internals

    def _play(self, trajectory: Trajectory) -> _ToolPlay:
        play = self.episode(trajectory).game
        if not isinstance(play, _ToolPlay):
            raise RuntimeError(f"trajectory {trajectory.uuid} has no tools (not started)")
        return play

    async def _state_says_done(self, trajectory: Trajectory, play: _ToolPlay) -> bool:
        """Whether the env's state says the episode is over; the first time, whether its state
        says it at all (`_ToolPlay.states_done`: if not, it is not asked again)."""
        state = await self._final_state(trajectory)
        play.states_done = "done" in state
        return state.get("done") is True

    async def _submit_for_the_agent(self, trajectory: Trajectory) -> None:
        """Call the env's argument-free `SUBMIT_TOOL` when the episode ended without the env
        ending it (see the module docstring); nothing after an error or a cancel."""
        play = getattr(trajectory.runtime, "game", None)
        if not isinstance(play, _ToolPlay) or play.env_ended or trajectory.status in ("error", "cancelled", "running"):
            return
        offered = next((t["function"] for t in play.tools if t.get("function", {}).get("name") == SUBMIT_TOOL), None)
        if offered is None or (offered.get("parameters") or {}).get("required"):
            return
        _, play.env_ended = await self._run_call(trajectory, ToolCall(name=SUBMIT_TOOL), trajectory.turns)
        if not play.env_ended and play.states_done is not False:
            play.env_ended = trajectory.steps[-1].done = await self._state_says_done(trajectory, play)
        trajectory.rollout_infos["submitted"] = "by the scheduler"

    @staticmethod
    def _fail_without_verdict(trajectory: Trajectory) -> bool:
        """End the episode in an error when the env failed on the call that ended it (see the
        module docstring); whether it did."""
        last = trajectory.steps[-1] if trajectory.steps else None
        if last is None or not last.done or trajectory.status in ("error", "cancelled"):
            return False
        error = last.observation.get("error") if isinstance(last.observation, dict) else None
        if not isinstance(error, dict):
            return False
        _fail(trajectory, ToolCallError(" ".join(str(error.get("message")).split()), str(error.get("error_type"))))
        return True

    @staticmethod
    def _take_parts(trajectory: Trajectory, state: dict[str, Any]) -> None:
        """The episode's reward parts (see the module docstring): the calls' own, else the
        state's ``reward_components``, on the step that ended the episode. A state's parts
        that are not ``{name: finite number}`` are a broken env's: `ValueError`."""
        if not any(step.components for step in trajectory.steps):
            ending = trajectory.steps[-1] if trajectory.steps and trajectory.steps[-1].done else None
            parts = evaluated(components_from(state))
            if ending is None or not parts:
                return
            ending.components = parts
        trajectory.rollout_infos[REWARD_PARTS] = episode_parts(step.components for step in trajectory.steps)

    @staticmethod
    def _native_calls(trajectory: Trajectory) -> list[ToolCall]:
        """The calls of the assistant message the reply became (the run loop appends it,
        with its ``tool_calls``, before `on_turn_end`)."""
        message = trajectory.messages[-1] if trajectory.messages else {}
        raw = message.get("tool_calls") if message.get("role") == "assistant" else None
        return [ToolCall.from_openai(c) for c in raw] if isinstance(raw, list) else []

    async def _run_call(self, trajectory: Trajectory, call: ToolCall, turn: int) -> tuple[dict[str, Any], bool]:
        """Send one call to the env (or answer an unreadable one with its error); record it as
        a step. Returns the observation and whether the env ended the episode."""
        action = {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
        if call.error is not None:
            observation: dict[str, Any] = {
                "tool_name": call.name, "result": None, "error": {"error_type": "invalid_call", "message": call.error},
            }
            done, duration, parts = False, 0.0, {}
        else:
            result, duration = await self.env_step(trajectory, action)
            observation, done = _as_observation(result.observation), bool(result.done)
            parts = evaluated(components_from(result.metadata))
        trajectory.steps.append(
            StepRecord(turn=turn, action=action, observation=observation, reward=0.0, done=done,
                       info={"tool_error": observation.get("error")} if observation.get("error") else {},
                       components=parts, duration_s=duration)
        )
        return observation, done

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


def _fail(trajectory: Trajectory, exc: Exception) -> None:
    """End `trajectory` in the error `exc`, as the run loop ends one whose step failed, although
    it had ended otherwise (``done``): only its verdict, which came after, failed."""
    trajectory.status, trajectory.error_kind = "error", type(exc).__name__
    trajectory.reason = mask_secrets(f"{type(exc).__name__}: {exc}")
    logger.warning("trajectory %s ended with an error: %s", trajectory.uuid, trajectory.reason)


def _no_call_reason(native: bool, text: str) -> str:
    if native and "<tool_call>" in text:
        # The model wrote a call the endpoint did not parse into `tool_calls`.
        return (
            "no tool call (the reply's text holds a <tool_call> block the policy did not return as tool_calls: "
            "serve the model with tool-call parsing, e.g. vLLM's --enable-auto-tool-choice --tool-call-parser hermes, "
            "or play the text form, --tool-format text)"
        )
    return "no tool call"


def _as_observation(observation: Any) -> dict[str, Any]:
    return observation if isinstance(observation, dict) else {}
