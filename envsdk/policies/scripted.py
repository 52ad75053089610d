"""Policies that need no model: random well-formed moves, and oracles that solve the game.

They let schedulers, servers and trainers run end to end, and be tested, without a GPU: a random
policy exercises invalid-move paths, an oracle exercises winning ones.

Each reads only the conversation it is given (OpenAI chat messages), exactly as a model would:

* Sudoku: TextArena's board text (``R1  4  8  . | …`` rows); the reply is ``[r c n]``.
* FrozenLake: `envsdk.envs.frozen_lake`'s map rendering (rows of ``S F H G P`` separated by
  spaces, ``P`` on the player); the reply is ``<action>direction</action>``.
* Tool environments: the ``<tools>`` block of the system message (one JSON function
  description a line, as Qwen/Hermes chat templates and `ToolScheduler` write it); the reply is
  ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` with arguments drawn from the schema.
* A typed action (a server's ``/schema`` ``action`` given to `RandomPolicy`): a JSON object drawn
  from that schema (`envsdk.schema_values`), every value of its type and within its bounds.

`NoopPolicy` does nothing and says at once that it is done: the do-nothing agent a task's
verifier must score 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

from envsdk.envs.frozen_lake import DIRECTIONS, shortest_path
from envsdk.formats import action_fields
from envsdk.games.sudoku import Board, candidates, parse_board, solve
from envsdk.policies.base import (
    Message,
    ObservationParseError,
    Policy,
    PolicyError,
    PolicyOutput,
    message_text,
)
from envsdk.schema_values import random_value

__all__ = [
    "RandomPolicy",
    "NoopPolicy",
    "SudokuOraclePolicy",
    "FrozenLakeOraclePolicy",
    "FrozenLakeView",
    "parse_frozen_lake",
    "canonical_env_name",
    "SUPPORTED_ENVS",
    "GENERIC_REPLIES",
    "listed_tools",
    "typed_action",
    "offered_tools",
    "tool_call_reply",
]

SUPPORTED_ENVS = ("sudoku", "frozen_lake", "coding", "harbor")

#: What `RandomPolicy` replies for an environment it does not know: common action formats, so
#: that many text environments see some valid moves and episodes end.
GENERIC_REPLIES: tuple[str, ...] = (
    "<action>up</action>",
    "<action>down</action>",
    "<action>left</action>",
    "<action>right</action>",
    "right",
    "down",
    "[1 1 1]",
    "done",
    "hello",
    "",
)

_DIRECTION_NAMES = tuple(DIRECTIONS)
_TOOLS_BLOCK = re.compile(r"<tools>\s*(.*?)\s*</tools>", re.DOTALL)
_GRID_LINE = re.compile(r"^[SFHGP](?: [SFHGP])+$")


def canonical_env_name(env_name: str) -> str:
    """One of `SUPPORTED_ENVS` for the spellings users write (``Sudoku-v0``, ``sudoku-hard``,
    ``FrozenLake``, ``frozen-lake``, ``HumanEval``, ``HarborEnvironment``); `ValueError` for
    anything else."""
    key = re.sub(r"[^a-z]", "", env_name.lower())
    if key.startswith("sudoku"):
        return "sudoku"
    if key.startswith("frozenlake"):
        return "frozen_lake"
    if key.startswith(("coding", "humaneval")):
        return "coding"
    if key.startswith("harbor"):
        return "harbor"
    raise ValueError(
        f"no scripted policy knows the environment {env_name!r}; supported: {', '.join(SUPPORTED_ENVS)}"
    )


def _user_texts_newest_first(messages: list[Message]) -> list[str]:
    # The observation is normally the last user message; older ones are a fallback for
    # conversations whose last user turn carries no board (e.g. a bare "invalid move" notice).
    return [message_text(m) for m in reversed(messages) if m.get("role") == "user"]


def listed_tools(messages: list[Message]) -> list[dict[str, Any]]:
    """The tools a conversation's system message offers (its ``<tools>`` block: one JSON
    function description a line, ``{"type": "function", "function": {"name", "parameters"}}``
    or the bare function), as ``{"name", "parameters"}`` dicts; [] when it offers none."""
    for message in messages:
        if message.get("role") != "system":
            continue
        found = _TOOLS_BLOCK.search(message_text(message))
        if found is None:
            continue
        tools = []
        for line in found.group(1).splitlines():
            try:
                described = json.loads(line)
            except ValueError:
                continue
            function = described.get("function", described) if isinstance(described, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                tools.append({"name": function["name"], "parameters": function.get("parameters") or {}})
        return tools
    return []


def typed_action(action_schema: Mapping[str, Any] | None) -> bool:
    """Whether an action with this JSON schema takes typed values rather than a reply's text: it
    has a field that is not a free string, or several fields. An action of one free string field
    (OpenEnv's ``message``, TextArena's) gets the text of a reply as it is."""
    if not isinstance(action_schema, Mapping):
        return False
    fields = action_fields(action_schema)
    if len(fields) != 1:
        return bool(fields)
    prop = next(iter(fields.values()))
    free = {"type": "string"}
    return not (isinstance(prop, dict) and {k: v for k, v in prop.items() if k in ("type", "enum", "const", "anyOf",
        "oneOf", "$ref", "allOf", "pattern", "minLength", "maxLength")} == free)


def offered_tools(messages: list[Message], tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The tools a policy is offered, by name, each with its parameters' JSON schema: the
    native definitions `tools` (OpenAI's form) when given, else the ``<tools>`` block of the
    system message (`listed_tools`); {} when neither offers any."""
    if tools is not None:
        offered = {}
        for described in tools:
            function = described.get("function", described) if isinstance(described, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                offered[function["name"]] = function.get("parameters") or {}
        return offered
    return {tool["name"]: tool["parameters"] for tool in listed_tools(messages)}


def tool_call_reply(calls: Sequence[tuple[str, dict[str, Any]]], *, native: bool, turn: int = 1) -> PolicyOutput:
    """A reply making `calls` (a tool's name and its arguments), in order: as OpenAI
    ``tool_calls`` when `native` (ids ``call_<turn>_<n>``, arguments as JSON text), else written
    in its text as ``<tool_call>`` blocks, the form a tool scheduler reads from a policy that
    does not call tools natively. No call: an empty reply, which ends a tool env's episode."""
    if native:
        return PolicyOutput(text="", tool_calls=[
            {"id": f"call_{turn}_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for n, (name, arguments) in enumerate(calls, start=1)
        ] or None)
    return PolicyOutput(text="\n".join(
        f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>" for name, arguments in calls
    ))


class NoopPolicy(Policy):
    """The do-nothing agent: it does no work and says at once that it is done, so that the
    environment judges the machine or board as it was given. Where the policy is offered a tool
    named ``submit`` that takes no argument (natively, or listed in the system message: Harbor's
    tasks), its first reply calls it and nothing else; every other reply is empty (no move, no
    tool call, which ends a tool env's episode). A task's verifier must score it 0."""

    supports_tools = True

    async def act(self, messages: list[Message]) -> str:
        return (await self.act_ex(messages)).text

    async def act_ex(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> PolicyOutput:
        submit = offered_tools(messages, tools).get("submit")
        first = not any(m.get("role") == "assistant" for m in messages)
        calls: list[tuple[str, dict[str, Any]]] = (
            [("submit", {})] if first and submit is not None and not submit.get("required") else []
        )
        return tool_call_reply(calls, native=tools is not None)


class RandomPolicy(Policy):
    """Random but well-formed moves: ``[r c n]`` with r, c, n uniform in 1–9 for Sudoku,
    ``<action>d</action>`` with d uniform over the four directions for FrozenLake, a call of a
    uniformly drawn tool with arguments drawn from its schema for a tool environment (one whose
    system message lists tools), an action drawn from `action_schema` (a server's ``/schema``
    ``action``) written as a JSON object when that action is typed (`typed_action`: an int to
    guess, an order of several fields), and for any other environment (an action of one free
    text field) a reply drawn uniformly from `GENERIC_REPLIES`.

    The same `seed` gives the same sequence of replies; only a tool list is read from the
    conversation. A scheduler gives each episode its own policy (`for_episode`), whose replies
    are drawn from a generator seeded by (`seed`, example, rollout index): a run repeats exactly
    whatever its concurrency and the order its episodes end in.
    """

    def __init__(
        self, env_name: str, seed: int | str | None = None, *, action_schema: Mapping[str, Any] | None = None
    ) -> None:
        try:
            self.env_name = canonical_env_name(env_name)
        except ValueError:
            self.env_name = env_name  # any other env: generic replies
        self.seed = seed
        self.action_schema = dict(action_schema) if isinstance(action_schema, Mapping) else None
        self._typed = typed_action(self.action_schema)
        self._rng = random.Random(seed)

    def for_episode(self, request: Any) -> RandomPolicy:
        """This episode's policy: seeded by (`seed`, the request's example and rollout index, from
        its ``eval`` tag, else its uuid); unseeded, this one (replies are not meant to repeat)."""
        if self.seed is None:
            return self
        data = getattr(request, "data_dict", None) or {}
        tag = data.get("eval") if isinstance(data, dict) else None
        if isinstance(tag, dict) and "example" in tag and "index" in tag:
            episode = f"{tag['example']}/{tag['index']}"
        else:
            episode = str(getattr(request, "uuid", ""))
        # A str seed is hashed with SHA-512 by `random.Random`: the same on every run and machine.
        return RandomPolicy(self.env_name, seed=f"{self.seed}/{episode}", action_schema=self.action_schema)

    async def act(self, messages: list[Message]) -> str:
        tools = listed_tools(messages)
        if tools:
            tool = self._rng.choice(tools)
            parameters = tool["parameters"]
            properties = parameters.get("properties") or {}
            arguments = {
                name: random_value(self._rng, properties.get(name), parameters) for name in parameters.get("required", [])
            }
            return tool_call_reply([(tool["name"], arguments)], native=False).text
        if self.env_name == "sudoku":
            r, c, n = (self._rng.randint(1, 9) for _ in range(3))
            return f"[{r} {c} {n}]"
        if self.env_name == "frozen_lake":
            return f"<action>{self._rng.choice(_DIRECTION_NAMES)}</action>"
        if self._typed and self.action_schema is not None:
            schema = self.action_schema
            fields = action_fields(schema)
            drawn = random_value(self._rng, {**schema, "properties": fields}, schema)
            return json.dumps(drawn, ensure_ascii=False)
        return self._rng.choice(GENERIC_REPLIES)


class SudokuOraclePolicy(Policy):
    """Answers a correct move for an empty cell of the current Sudoku board.

    The board is the last one found in the user messages, newest first: a message's
    ``"board"`` key (a 9×9 list of ints, 0 = empty) if it has one, else the board drawn in its
    text (`envsdk.games.sudoku.parse_board`). The cell chosen is the empty cell with the fewest
    candidates (ties: first in row-major order), so replies look like a sensible solver's.

    Solutions are cached (up to `cache_size` puzzles): a later board of the same game is
    recognised because its filled cells agree with a cached solution, so a whole game costs
    one solve. Solving runs in a worker thread so a hard puzzle never blocks the event loop.

    Raises `ObservationParseError` when no board can be read, `PolicyError` when the board is
    full or has no solution.
    """

    def __init__(self, cache_size: int = 256) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.cache_size = cache_size
        # Each solution with its 81 digits packed into one int (a byte per cell), so that
        # recognising a game's board is one masked comparison in C per cached game.
        self._solutions: OrderedDict[int, tuple[int, Board]] = OrderedDict()
        self._next_key = 0

    async def act(self, messages: list[Message]) -> str:
        board = self.read_board(messages)
        empty = candidates(board)
        if not empty:
            raise PolicyError("the Sudoku board has no empty cell: nothing to play")
        solution = await self._solution(board)
        (r, c), _ = min(empty.items(), key=lambda item: (len(item[1]), item[0]))
        return f"[{r + 1} {c + 1} {solution[r][c]}]"

    @staticmethod
    def read_board(messages: list[Message]) -> Board:
        """The current board (see the class docstring for where it is looked for)."""
        for message in reversed(messages):
            if message.get("role") != "user":
                continue
            structured = message.get("board")
            if structured is not None:
                return _checked_board(structured)
            board = parse_board(message_text(message))
            if board is not None:
                return board
        raise ObservationParseError(
            "no Sudoku board found in the user messages: expected TextArena's board text"
            " (rows 'R1 … R9') or a 'board' key holding a 9x9 list of ints"
        )

    async def _solution(self, board: Board) -> Board:
        cells = _cells(board)
        digits, filled = int.from_bytes(cells, "big"), int.from_bytes(cells.translate(_FILLED), "big")
        # A cached solution agrees with the board when it holds the board's digit in every filled
        # cell: its packed digits, masked to those cells, are the board's.
        for key, (packed, solution) in self._solutions.items():
            if packed & filled == digits:
                self._solutions.move_to_end(key)
                return solution
        solved: Board | None = await asyncio.to_thread(solve, board)
        if solved is None:
            raise PolicyError("the Sudoku board has no solution (a filled cell contradicts another)")
        self._solutions[self._next_key] = (int.from_bytes(_cells(solved), "big"), solved)
        self._next_key += 1
        if len(self._solutions) > self.cache_size:
            self._solutions.popitem(last=False)
        return solved


def _checked_board(value: Any) -> Board:
    ok = (
        isinstance(value, list)
        and len(value) == 9
        and all(
            isinstance(row, list)
            and len(row) == 9
            and all(isinstance(v, int) and 0 <= v <= 9 for v in row)
            for row in value
        )
    )
    if not ok:
        raise ObservationParseError("a message's 'board' must be a 9x9 list of ints from 0 to 9")
    return [list(row) for row in value]


def _cells(board: Board) -> bytes:
    """The board's 81 cells, a byte each (boards read here hold 0-9 only)."""
    return bytes(chain.from_iterable(board))


# A byte per cell: 0 (empty) stays 0, a digit becomes 0xFF (the filled cells' mask).
_FILLED = bytes([0] + [0xFF] * 255)


class FrozenLakeView:
    """A FrozenLake map as read from its text: rows of ``S``/``F``/``H``/``G`` (the player's
    cell given back its underlying safe tile), the player's position and the goal's."""

    def __init__(self, grid: list[str], position: tuple[int, int], goal: tuple[int, int]) -> None:
        self.grid = grid
        self.position = position
        self.goal = goal


def parse_frozen_lake(text: str) -> FrozenLakeView | None:
    """The last complete map drawn in `text` by `FrozenLakeGame.render`, or None.

    A map is a block of consecutive lines of space-separated ``S F H G P`` cells forming a
    square, with exactly one ``P`` (the player) and one ``G`` (the goal). A map whose player
    stands on the goal or in a hole (the game is over) has no visible goal and is skipped.
    """
    found: FrozenLakeView | None = None
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if _GRID_LINE.match(stripped):
            block.append(stripped.split(" "))
            continue
        if block:
            view = _view_of(block)
            if view is not None:
                found = view
            block = []
    return found


def _view_of(rows: list[list[str]]) -> FrozenLakeView | None:
    size = len(rows)
    if any(len(row) != size for row in rows):
        return None
    players = [(r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == "P"]
    goals = [(r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == "G"]
    if len(players) != 1 or len(goals) != 1:
        return None
    # The player hides the tile under it; it can only be a safe one (S or F) while the game runs.
    grid = ["".join("F" if cell == "P" else cell for cell in row) for row in rows]
    return FrozenLakeView(grid, players[0], goals[0])


class FrozenLakeOraclePolicy(Policy):
    """Answers the first move of a shortest hole-free path from the player to the goal, as
    ``<action>direction</action>``, reading the newest map in the user messages.

    Raises `ObservationParseError` when no running game's map can be read, `PolicyError` when
    the goal cannot be reached.
    """

    async def act(self, messages: list[Message]) -> str:
        for text in _user_texts_newest_first(messages):
            view = parse_frozen_lake(text)
            if view is not None:
                break
        else:
            raise ObservationParseError(
                "no FrozenLake map with a player (P) and a goal (G) found in the user messages"
            )
        path = shortest_path(view.grid, view.position, view.goal)
        if not path:
            raise PolicyError(f"the goal {view.goal} cannot be reached from {view.position}")
        return f"<action>{path[0]}</action>"
