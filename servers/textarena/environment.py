"""Any TextArena game as an envsdk `Environment`, speaking OpenEnv's TextArena wire models.

Where game code runs. Every method of the session class (``reset``, ``step``, ``state``,
``close``) is a plain function, so the server runs it on the session's lane thread under the
call's deadline like any sync env call: game code never runs on the event loop. A step that
never returns is written off by the server (its session answered TIMEOUT, the thread counted
until it ends), and others go on. Two more guards keep such a thread from costing others:

* **Runaway steps are stopped.** A game step (the agent's move and the opponent's) still
  running after `step_limit_s` (0.5 s; a step takes well under 50 ms, see the move caps) gets
  an asynchronous `GameRunaway` exception in its thread (``PyThreadState_SetAsyncExc``), which
  ends a pure Python loop (TextArena's free-for-all rotation once every player is eliminated
  is one); the session is answered TIMEOUT and its episode is over. Why stop it so early,
  before the step's deadline: a spinning thread takes the GIL each time the event loop makes a
  system call, and the loop then waits for it (measured: honest steps fell to 35% of their rate
  while one step spun), so every second it spins costs every session. A reset gets the same
  at its deadline plus ``RUNAWAY_GRACE_S`` (it waits for the game pool, which is not
  spinning). The exception cannot stop C code that holds the GIL (a regex on a long move):
  that is what the per-game move caps are for (`max_move_chars`, measured with ``python -m
  bench games moves``), and a call that never returns at all is written off by the server at
  its deadline as any env call is.
* **No lock is shared between sessions.** Each session's calls draw from its own generators
  (below) without a process-wide lock, so a stuck call holds nothing another session needs. A
  lease with a timed-out lock was considered; it would have stalled every game for as long as
  one stuck step held it.

Free-for-all games also get their turn rotation guarded (`guard_rotation`): a step that
eliminates the last player ends the game (every player loses) instead of looping.

Seeds. TextArena games draw from the process-wide ``random`` generator (and a few from
numpy's): ``reset(seed=s)`` calls ``random.seed(s)`` and then generates the game (for some
games, a second of pure Python), and later steps (a 2048 tile, a Blackjack card, a Bandit
payout) keep drawing from it. In one shared process, sessions would mix each other's draws and
a seed would replay nothing. So:

* the seeded reset runs in a worker process of a `GamePool` (``servers.textarena.pool``): one
  task at a time per worker, so the generator it seeds serves that game alone; the game and the
  generator states after the reset come back pickled, cached by (id, kwargs, players, seed) and
  shared by every session asking for the same seed; each session unpickles its own copy;
* every later call into the game runs inside the session's `GameRandom` lease: the module
  functions of ``random`` (and of ``numpy.random``, for games that use it) are replaced, once,
  by functions that draw from the generator the calling thread leases, else from the process's
  own; a lease sets the session's generators for its (lane) thread.

Hence seed ``s`` gives the episode ``ta.make(env_id).reset(num_players=n, seed=s)`` gives in a
fresh interpreter, step for step, whatever other sessions do at the same time; the server
process's own generators are left alone; a reset without a seed draws one from ``secrets`` and
reports it in ``state.seed``.

Bounds. Every option is checked before any work (`num_players` within the game's own range,
strings at most `MAX_OPTION_CHARS`), a move at most `max_move_chars` characters and an
episode's moves at most `MAX_EPISODE_MOVE_CHARS` in all (the cumulative transcript repeats
them in every reply), and errors echo at most 256 characters of client input.
"""

from __future__ import annotations

import ctypes
import difflib
import enum
import functools
import importlib
import inspect
import logging
import math
import pickle
import random
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_args

import textarena as ta
from textarena.core import GAME_ID, ObservationType, ObservationWrapper, Wrapper
from textarena.envs.registration import ENV_REGISTRY

from envsdk.env import Environment
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.protocol import ErrorCode, FrameError
from servers.textarena.errors import TextArenaOptionError, shown
from servers.textarena.models import (
    ObservationForm,
    OpponentName,
    TextArenaAction,
    TextArenaMessage,
    TextArenaObservation,
    TextArenaState,
)
from servers.textarena.nltk_data import forbid_downloads
from servers.textarena.opponents import Opponent, make_opponent
from servers.textarena.pool import GamePool, default_game_pool

__all__ = [
    "TEXTARENA_ENV_IDS",
    "OBSERVATION_FORMS",
    "DEFAULT_ENV_ID",
    "DEFAULT_MAX_MOVE_CHARS",
    "MAX_MOVE_CHARS",
    "MAX_EPISODE_MOVE_CHARS",
    "MAX_OPTION_CHARS",
    "RUNAWAY_GRACE_S",
    "GAME_LANE_WAIT_S",
    "TextArenaOptionError",
    "GameRunaway",
    "GameStepStopped",
    "check_env_id",
    "max_move_chars",
    "player_range",
    "guard_rotation",
    "unwrap",
    "convert_messages",
    "render_messages",
    "snapshot_state",
    "game_outcome",
    "GameRandom",
    "TextArenaEnvironment",
]

logger = logging.getLogger("envsdk.server")

#: Every game id TextArena registers (each game with its wrapper variants), in registry order.
TEXTARENA_ENV_IDS: tuple[str, ...] = tuple(ENV_REGISTRY)
OBSERVATION_FORMS: tuple[str, ...] = get_args(ObservationForm)
_OPPONENTS: tuple[str, ...] = get_args(OpponentName)

#: The game served when none is named: one that runs offline (OpenEnv's default, Wordle,
#: needs NLTK data that no package installs).
DEFAULT_ENV_ID = "GuessTheNumber-v0"

#: Longest move (characters) a game takes unless it has its own cap below. Some games parse
#: moves with regexes that take time quadratic or worse in the move's length, in C with the
#: GIL held (nothing can interrupt them, a thread cannot stop them): the caps keep each game's
#: worst measured step under about 30 ms (``python -m bench games moves`` measures every game
#: that runs offline: at 4,000 characters ConnectFour took 1.3 s, LinesOfAction 0.39 s, Bandit
#: 0.11 s, ColonelBlotto 0.08 s, every other game under 5 ms; at 16,000: 14 s, -, 2.0 s, 5.3 s).
DEFAULT_MAX_MOVE_CHARS = 4096
#: Games whose moves cost more per character, by game (every variant of the game).
MAX_MOVE_CHARS: dict[str, int] = {"ConnectFour": 512, "LinesOfAction": 1024, "Bandit": 2048, "ColonelBlotto": 2048}
#: Characters of moves one episode may send in all: the cumulative observation repeats every
#: move in every reply, so this bounds the replies of a long episode.
MAX_EPISODE_MOVE_CHARS = 256 * 1024
#: Longest string option (``episode_id``, ``env_id`` and the others).
MAX_OPTION_CHARS = 256
#: Most players of a free-for-all or team game (TextArena's largest stated range is 2-15).
MAX_PLAYERS = 15
#: A reset still running this long after its class deadline is stopped (`GameRunaway`).
RUNAWAY_GRACE_S = 1.0
#: The game servers' ``lane_wait_s`` unless ``ENVSDK_LANE_WAIT_S`` is set: the event loop waits
#: (GIL released) for a game call on its lane when that kind of call has recently taken under a
#: tenth of this. Game steps take 0.1-1 ms, so under the server's default (1 ms) they would be
#: handed over the slow way, the loop woken for each reply: measured with ``python -m
#: bench.games throughput``, that cost a Sudoku game about 30% more server CPU than when its
#: steps ran on the loop. A call that turns slow costs the loop at most this, once.
GAME_LANE_WAIT_S = 0.005


def check_env_id(env_id: str) -> str:
    """Return `env_id` if TextArena registers it, else raise `TextArenaOptionError`."""
    if not isinstance(env_id, str) or env_id not in ENV_REGISTRY:
        prefix = env_id.lower()[:4] if isinstance(env_id, str) else None
        close = [k for k in ENV_REGISTRY if prefix is not None and k.lower().startswith(prefix)]
        hint = f"; similar: {', '.join(close[:8])}" if close else ""
        # A misspelt id (Wordl-v0) shares no prefix with its game's own ids: the closest id by spelling.
        nearest = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=1) if isinstance(env_id, str) else []
        raise TextArenaOptionError(
            f"Unknown TextArena env id {shown(env_id)}{f' (did you mean {nearest[0]!r}?)' if nearest else ''} "
            f"({len(ENV_REGISTRY)} ids are registered, "
            f"e.g. GuessTheNumber-v0, TicTacToe-v0, Sudoku-v0{hint})"
        )
    return env_id


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` if it is an int (not a bool) within [`minimum`, `maximum`], else
    `TextArenaOptionError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TextArenaOptionError(f"{name} must be an integer, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise TextArenaOptionError(f"{name} must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise TextArenaOptionError(f"{name} must be <= {maximum}, got {shown(value)}")
    return value


def check_text(name: str, value: Any, maximum: int = MAX_OPTION_CHARS) -> str:
    """`value` if it is a string of at most `maximum` characters, else `TextArenaOptionError`."""
    if not isinstance(value, str):
        raise TextArenaOptionError(f"{name} must be a string, got {shown(value)}")
    if len(value) > maximum:
        raise TextArenaOptionError(f"{name} must be at most {maximum} characters, got {len(value)}")
    return value


def check_observation_form(value: Any) -> ObservationForm:
    """`value` if it names an observation form, else `TextArenaOptionError`."""
    if value not in OBSERVATION_FORMS:
        raise TextArenaOptionError(
            f"observation_form must be one of {', '.join(OBSERVATION_FORMS)}, got {shown(value)}"
        )
    return value  # type: ignore[no-any-return]


def _game_name(env_id: str) -> str:
    entry_point: str = ENV_REGISTRY[env_id].entry_point
    return entry_point.rsplit(":", 1)[-1].removesuffix("Env")


def max_move_chars(env_id: str, configured: int | None = None) -> int:
    """The longest move `env_id` takes: `configured` (the server's setting) if given, else the
    game's own cap (`MAX_MOVE_CHARS`), else `DEFAULT_MAX_MOVE_CHARS`."""
    if configured is not None:
        return configured
    return MAX_MOVE_CHARS.get(_game_name(env_id), DEFAULT_MAX_MOVE_CHARS)


@functools.cache
def player_range(env_id: str) -> tuple[int, int]:
    """The player counts `env_id` may be reset with before its game is generated: 2 to
    `MAX_PLAYERS` for free-for-all and team games (read from the kind of state the game class
    builds; with one player their turn rotation never ends), else 1 to `MAX_PLAYERS`. Within
    that, the game's own check (``assert 2 <= num_players <= 15``, a two-player game's
    ``== 2``) runs when it is generated and its refusal comes back as a VALIDATION_ERROR."""
    module, _, name = ENV_REGISTRY[env_id].entry_point.partition(":")
    try:
        source = inspect.getsource(getattr(importlib.import_module(module), name))
    except Exception:  # a module that does not import here (NLTK data, Python version): the game says why at reset
        return (1, MAX_PLAYERS)
    return (2, MAX_PLAYERS) if "MultiPlayerState" in source else (1, MAX_PLAYERS)


def unwrap(game: Any) -> Any:
    """The TextArena game under its wrappers."""
    while isinstance(game, Wrapper):
        game = game.env
    return game


def guard_rotation(game: Any) -> None:
    """Make a free-for-all game end, rather than loop, once every player is eliminated.

    TextArena's ``FFAMultiPlayerState.step`` passes the turn with ``while current_player_id in
    elimination_order``, which never ends when every player is in it (two players eliminated
    by invalid moves in MarketEntryGame or PublicGoodsGame). The guard ends such a game before
    the rotation: every player loses (-1), as an eliminated player does."""
    state = unwrap(game).state
    if not isinstance(state, ta.FFAMultiPlayerState):
        return
    rotate = state.step

    def step(rotate_player: bool = True) -> Any:
        # Exactly the case in which TextArena's rotation would never end.
        if (
            rotate_player and not state.made_invalid_move and not state.done
            and set(range(state.num_players)) <= set(state.elimination_order)
        ):
            state.set_game_outcome(
                {pid: -1 for pid in range(state.num_players)}, "Every player was eliminated."
            )
        return rotate(rotate_player)

    state.step = step


# ------------------------------------------------------------------ generators


class _Leased(threading.local):
    python: random.Random | None = None
    numpy: Any = None


_LEASED = _Leased()
_DISPATCH_LOCK = threading.Lock()
_DISPATCHED: set[str] = set()


def _dispatcher(default: Any, name: str, slot: str) -> Any:
    """A module function `name` that draws from the calling thread's leased generator (its
    `slot` of `_LEASED`), else from `default` (the process's own)."""

    def draw(*args: Any, **kwargs: Any) -> Any:
        leased = getattr(_LEASED, slot)
        return getattr(leased if leased is not None else default, name)(*args, **kwargs)

    draw.__name__ = draw.__qualname__ = name
    draw.__doc__ = getattr(default, name).__doc__
    return draw


def _dispatch(module: Any, default: Any, slot: str) -> None:
    """Replace (once) every function of `module` bound to its global generator `default`."""
    with _DISPATCH_LOCK:
        if module.__name__ in _DISPATCHED:
            return
        for name in dir(module):
            if getattr(getattr(module, name), "__self__", None) is default:
                setattr(module, name, _dispatcher(default, name, slot))
        _DISPATCHED.add(module.__name__)


class GameRandom:
    """One session's own ``random`` and numpy generators.

    `lease` is a context manager: inside it, the module functions of ``random`` (and of
    ``numpy.random`` when `numpy`) called from this thread draw from this session's generators;
    other threads, the server's own code included, are unaffected, and nothing is locked.
    `restore` sets the session's states (the states a worker process had right after
    generating the session's game).
    """

    def __init__(self) -> None:
        self._python = random.Random()
        self._numpy: Any = None
        self.numpy = False

    def restore(self, python_state: Any, numpy_state: Any, *, numpy: bool) -> None:
        """Set the session's states; `numpy` says whether numpy's generator is leased too
        (only for games that draw from it)."""
        self._python = random.Random()
        if python_state is not None:
            self._python.setstate(python_state)
        self.numpy = numpy and numpy_state is not None
        if self.numpy:
            self._numpy = _numpy_random().RandomState()
            self._numpy.set_state(numpy_state)

    @contextmanager
    def lease(self) -> Iterator[None]:
        _dispatch(random, random._inst, "python")
        if self.numpy:
            numpy_random = _numpy_random()
            _dispatch(numpy_random, numpy_random.mtrand._rand, "numpy")
        saved = _LEASED.python, _LEASED.numpy
        _LEASED.python, _LEASED.numpy = self._python, self._numpy
        try:
            yield
        finally:
            _LEASED.python, _LEASED.numpy = saved


def _numpy_random() -> Any:
    import numpy

    return numpy.random


@functools.cache
def draws_from_numpy(game_class: Any) -> bool:
    """Whether the code of `game_class`'s package names numpy's global generator."""
    package = Path(inspect.getfile(game_class)).parent
    return any(
        "np.random." in text or "numpy.random." in text
        for text in (path.read_text(errors="replace") for path in package.rglob("*.py"))
    )


# ------------------------------------------------------------------ runaway calls


_Step = TypeVar("_Step")  # what a game step returns: a subclass's own observation type


class GameRunaway(Exception):
    """Raised inside a game call that ran past its limit (see the module docstring)."""


class GameStepStopped(FrameError):
    """A game step ran past its limit and was stopped (TIMEOUT): the episode is over."""

    def __init__(self, env_id: str, limit_s: float) -> None:
        super().__init__(
            ErrorCode.TIMEOUT,
            f"the {env_id} step ran past {limit_s:g}s (the game was looping) and was stopped; "
            "the episode is over, reset to start a new one",
            timeout_s=limit_s,
        )


class _Watchdog:
    """Stops game calls that run too long: one daemon thread checks the calls in flight ten
    times a second and raises `GameRunaway` in the thread of each one past its limit."""

    PERIOD_S = 0.1

    def __init__(self) -> None:
        self._calls: dict[int, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.stopped = 0  # calls stopped so far

    @contextmanager
    def limit(self, seconds: float | None, what: str) -> Iterator[None]:
        if seconds is None:
            yield
            return
        ident = threading.get_ident()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="envsdk-game-watchdog", daemon=True)
                self._thread.start()
            self._calls[ident] = (time.monotonic() + seconds, what)
        try:
            yield
        finally:
            # Under the lock: once this pop is done the watchdog cannot fire at this thread,
            # and one fired before it raises before the game call returns.
            with self._lock:
                self._calls.pop(ident, None)

    def _watch(self) -> None:
        while True:
            time.sleep(self.PERIOD_S)
            now = time.monotonic()
            with self._lock:
                for ident, (deadline, what) in list(self._calls.items()):
                    if now < deadline:
                        continue
                    del self._calls[ident]
                    fired = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(ident), ctypes.py_object(GameRunaway)
                    )
                    if fired:
                        self.stopped += 1
                        logger.warning("stopped a runaway game call (%s) in thread %d", what, ident)


WATCHDOG = _Watchdog()


def convert_messages(messages: Any) -> list[TextArenaMessage]:
    """OpenEnv's TextArena message conversion, kept byte-for-byte in behaviour.

    A wrapped game gives one string (iterated character by character, then merged back into one
    ``MESSAGE`` from sender -1); a raw game gives ``(sender, text, type)`` tuples, merged when
    consecutive tuples share sender and type.
    """
    converted: list[TextArenaMessage] = []
    sender: int | None = None
    category: str | None = None
    parts: list[str] = []
    for entry in messages:
        if isinstance(entry, tuple) and len(entry) == 3:
            e_sender, content, e_category = entry
        elif isinstance(entry, tuple) and len(entry) == 2:
            e_sender, content = entry
            e_category = "MESSAGE"
        else:
            e_sender, content, e_category = -1, str(entry), "MESSAGE"
        name = getattr(e_category, "name", str(e_category))
        sid = int(e_sender) if isinstance(e_sender, (int, float)) else -1
        if parts and category == name and sender == sid:
            parts.append(str(content))
            continue
        if parts:
            converted.append(TextArenaMessage(sender_id=sender if sender is not None else -1,
                                              content="".join(parts), category=category or "MESSAGE"))
        sender, category, parts = sid, name, [str(content)]
    if parts:
        converted.append(TextArenaMessage(sender_id=sender if sender is not None else -1,
                                          content="".join(parts), category=category or "MESSAGE"))
    return converted


def render_messages(
    game: Any, player_id: int, *, form: ObservationForm, env_id: str
) -> tuple[str, list[TextArenaMessage], dict[str, Any]]:
    """Take `player_id`'s new messages from `game` and render them in `form`.

    Returns ``(prompt, messages, metadata)``. ``"cumulative"`` is what OpenEnv's server sends
    (the game's wrappers render the whole transcript; the prompt is the instructions while the
    turn is 0, then the env id; metadata repeats the messages). ``"compact"`` sends only the
    messages new since the last observation, with their TextArena categories; the prompt is
    the instructions at reset and ``""`` after. The messages are consumed: call once per turn.
    """
    base = unwrap(game)
    state = base.state
    raw = list(state.observations.get(player_id, []))
    state.observations[player_id] = []
    turn = int(getattr(state, "turn", 0))
    if form == "compact":
        all_new = convert_messages(raw)
        prompt = "\n".join(m.content for m in all_new if m.category == "PROMPT").strip()
        return prompt, [m for m in all_new if m.category != "PROMPT"], {"env_id": env_id, "turn": turn}

    rendered: Any = raw
    layers: list[Any] = []
    layer: Any = game
    while isinstance(layer, Wrapper):
        layers.append(layer)
        layer = layer.env
    for wrapper in reversed(layers):  # what `game.get_observation()` would return
        if isinstance(wrapper, ObservationWrapper):
            rendered = wrapper.observation(player_id, rendered)
    # A wrapped game renders one string, which OpenEnv's conversion turns into exactly one
    # MESSAGE from -1, character by character (~30 ms late in a long game); build it directly.
    if isinstance(rendered, str):
        messages = [TextArenaMessage(sender_id=-1, content=rendered, category="MESSAGE")] if rendered else []
    else:
        messages = convert_messages(rendered)
    prompt_lines = [m.content for m in messages if m.category == "PROMPT"]
    if not prompt_lines:
        prompt_lines = [messages[0].content] if turn == 0 and messages else [env_id]
    metadata = {"env_id": env_id, "turn": turn, "raw_messages": [m.model_dump() for m in messages]}
    return "\n".join(prompt_lines).strip(), messages, metadata


def jsonable(value: Any) -> Any:
    """`value` with every container turned into dicts and lists of JSON values (sets sorted
    when they can be, enums by name, other objects by ``str``), so any game state encodes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k.name if isinstance(k, enum.Enum) else k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def snapshot_state(game: Any) -> dict[str, Any]:
    """OpenEnv's ``raw_state``: the game state's turn, game_state, logs, rewards, done,
    role_mapping, game_info and step_info, as JSON values."""
    state = unwrap(game).state
    snapshot: dict[str, Any] = jsonable({
        "turn": getattr(state, "turn", 0),
        "game_state": getattr(state, "game_state", {}),
        "logs": list(getattr(state, "logs", [])),
        "rewards": getattr(state, "rewards", None),
        "done": getattr(state, "done", False),
        "role_mapping": getattr(state, "role_mapping", {}),
        "game_info": getattr(state, "game_info", {}),
        "step_info": getattr(state, "step_info", {}),
    })
    return snapshot


def game_outcome(game: Any, player_id: int, *, plays_one_side: bool) -> tuple[bool | None, str | None]:
    """How a finished `game` ended for `player_id`: ``(success, reason)``.

    `reason` is what the game said ended it (TextArena's ``game_info[player]["reason"]``:
    "Congratulations! You guessed the correct number.", "Player 1 has won!", "Invalid Move:
    ..."), None when it said nothing. `success` is stated only for a session that plays one
    side (`plays_one_side`): in a one-player game, whether the player solved it (TextArena
    gives a solved game 1 and an unsolved one its progress below that); in a game of several
    players, whether the player won: its reward is the highest and not every player's, so a
    draw is no success. It is None for a session that plays every player (self-play: no side
    of its own won) and for a game that gave the player no numeric reward.
    """
    state = unwrap(game).state
    info = (getattr(state, "game_info", None) or {}).get(player_id)
    said = info.get("reason") if isinstance(info, dict) else None
    reason = said.strip() if isinstance(said, str) and said.strip() else None
    rewards = getattr(state, "rewards", None)
    if not plays_one_side or not isinstance(rewards, dict):
        return None, reason
    numbers = {p: float(r) for p, r in rewards.items() if isinstance(r, (int, float)) and math.isfinite(r)}
    mine = numbers.pop(player_id, None)
    if mine is None or len(numbers) < len(rewards) - 1:
        return None, reason
    if not numbers:
        return mine >= 1.0, reason
    return mine >= max(numbers.values()) and mine > min(numbers.values()), reason


def _as_reward(value: Any) -> float:
    """A game's reward as a float; anything not a number counts as 0.0 (textarena 0.7.4's
    Countdown passes its reason text where the reward belongs)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return 0.0


class TextArenaEnvironment(Environment[TextArenaAction, TextArenaObservation, TextArenaState]):
    """One session of any TextArena game (see the module docstring for where game code runs,
    seeding and bounds, README.md for the observation forms and opponents).

    `env_id`, `num_players`, `max_turns` and `env_kwargs` are the server's settings (OpenEnv's
    ``TEXTARENA_*`` variables): `env_kwargs` go to ``ta.make``; `max_turns` is reported in the
    state as OpenEnv does (a game's own turn limit is one of its kwargs, e.g. ``max_turns``).
    `max_move_chars` caps every game's moves (default: each game's own cap, `max_move_chars`).
    Each reset's game comes from `game_pool` (default: the process-wide `GamePool`) and is put
    under the session's TextArena wrappers, which are kept across resets of the same id with
    their transcript cleared.
    """

    reset_timeout_s: ClassVar[float | None] = 60.0
    step_timeout_s: ClassVar[float | None] = 10.0
    #: Whether free-for-all games end when every player is eliminated (`guard_rotation`)
    #: instead of looping forever as TextArena's own rotation does.
    guard_rotation: ClassVar[bool] = True
    #: Seconds a step may run before it is stopped (see the module docstring).
    step_limit_s: ClassVar[float] = 0.5

    def __init__(
        self,
        env_id: str = DEFAULT_ENV_ID,
        *,
        num_players: int = 1,
        max_turns: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        game_pool: GamePool | None = None,
        max_move_chars: int | None = None,
    ) -> None:
        self.env_id = check_env_id(env_id)
        self.num_players = check_int("num_players", num_players, minimum=1, maximum=MAX_PLAYERS)
        self.max_turns = None if max_turns is None else check_int("max_turns", max_turns, minimum=1)
        self.env_kwargs = dict(env_kwargs or {})
        self.max_move_chars = None if max_move_chars is None else check_int("max_move_chars", max_move_chars, minimum=1)
        self._pool = game_pool
        self._random = GameRandom()
        self._game: Any = None
        self._wrapped: Any = None  # the session's TextArena wrappers (kept across resets of an id)
        self._game_id: str | None = None
        self._move_cap = DEFAULT_MAX_MOVE_CHARS
        self._episode_chars = 0
        self._opponent: Opponent | None = None
        self._opponent_rng = random.Random()
        self._state = TextArenaState(env_id=self.env_id, num_players=self.num_players, max_turns=self.max_turns)

    # No **kwargs on purpose: the server refuses unknown reset options by this signature
    # instead of silently dropping them.
    def reset(  # type: ignore[override]
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        *,
        env_id: str | None = None,
        num_players: int | None = None,
        observation_form: ObservationForm = "cumulative",
        opponent: OpponentName | None = None,
        agent_player_id: int = 0,
    ) -> TextArenaObservation:
        """Start a new game.

        Options: `seed` (int; same seed, same episode), `episode_id` (str, at most
        `MAX_OPTION_CHARS` characters), `env_id` (any TextArena id; default: the server's),
        `num_players` (default: the server's; within the game's range, `player_range`),
        `observation_form` ("cumulative" or "compact"), `opponent` ("random" or "scripted":
        the server plays every player but `agent_player_id`; games with a built-in opponent
        only, see `servers.textarena.opponents`). Bad values raise `TextArenaOptionError`.
        """
        if seed is not None:
            check_int("seed", seed)
        if episode_id is not None:
            check_text("episode_id", episode_id)
        game_id = check_env_id(env_id) if env_id is not None else self.env_id
        low, high = player_range(game_id)
        players = num_players if num_players is not None else self.num_players
        check_int("num_players", players, minimum=low, maximum=high)
        form = check_observation_form(observation_form)
        if opponent is not None and opponent not in _OPPONENTS:
            raise TextArenaOptionError(f"opponent must be one of {', '.join(_OPPONENTS)} or null, got {shown(opponent)}")
        check_int("agent_player_id", agent_player_id, minimum=0)
        if opponent is not None and agent_player_id >= players:
            raise TextArenaOptionError(
                f"agent_player_id must be below num_players ({players}), got {agent_player_id}"
            )
        seed = seed if seed is not None else secrets.randbelow(2**31)

        kwargs = self.env_kwargs if game_id == self.env_id else {}
        pool = self._pool or default_game_pool()
        with WATCHDOG.limit(_limit(type(self).reset_timeout_s), f"{game_id} reset"):
            # Until the new game is generated and its options accepted, a refusal (the game's
            # own checks, the pool full or past its deadline) leaves the running episode as it was.
            try:
                generated = pool.game(game_id, kwargs, players, seed, timeout_s=type(self).reset_timeout_s or 60.0)
            except (AssertionError, TypeError, ValueError) as exc:  # TextArena's own checks of its arguments
                if isinstance(exc, TextArenaOptionError):
                    raise
                raise TextArenaOptionError(
                    f"{game_id} cannot be reset with num_players={players} and kwargs {shown(kwargs)}: {shown(str(exc))}"
                ) from None
            except SyntaxError as exc:  # some textarena 0.7.4 games need Python 3.12's f-strings
                raise TextArenaOptionError(
                    f"{game_id}'s TextArena module does not compile on Python "
                    f"{sys.version_info.major}.{sys.version_info.minor}: {exc}"
                ) from None
            base, python_state, numpy_state = pickle.loads(generated.payload)
            opponent_player = make_opponent(opponent, base, game_id) if opponent is not None else None
            self._game = None  # no half-started episode: a failure from here on leaves NOT_RESET behind
            self._random.restore(python_state, numpy_state, numpy=draws_from_numpy(base.__class__))
            game = self._game_for(game_id, base)
            if type(self).guard_rotation:
                guard_rotation(base)
            self._game = game
            self._opponent = opponent_player
            self._opponent_rng = random.Random(seed)
            self._move_cap = max_move_chars(game_id, self.max_move_chars)
            self._episode_chars = 0
            self._state = TextArenaState(
                episode_id=episode_id or str(uuid.uuid4()),
                step_count=0,
                env_id=game_id,
                num_players=players,
                max_turns=self.max_turns,
                seed=seed,
                observation_form=form,
                opponent=opponent,
                agent_player_id=agent_player_id if opponent is not None else None,
            )
            if self._opponent is not None:
                self._play_opponents()
            return self._observe(reward=0.0, done=bool(unwrap(game).state.done))

    def step(self, action: TextArenaAction) -> TextArenaObservation:
        """Play one move (then the opponent's, if any). Raises `NotResetError` before the first
        reset, `EpisodeDoneError` once the game is over (the server refuses those steps
        itself, with the same codes) and `TextArenaOptionError` for a move past the game's
        cap or past the episode's (`MAX_EPISODE_MOVE_CHARS`)."""
        if self._game is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._state.done:
            raise EpisodeDoneError(
                f"Episode {self._state.episode_id} is over; call reset to start a new one",
                code=ErrorCode.EPISODE_DONE.value,
            )
        message = action.message
        if len(message) > self._move_cap:
            raise TextArenaOptionError(
                f"the move is {len(message)} characters long; {self._state.env_id} takes at most "
                f"{self._move_cap} (the move was not played)",
                max_move_chars=self._move_cap,
            )
        if self._episode_chars + len(message) > MAX_EPISODE_MOVE_CHARS:
            raise TextArenaOptionError(
                f"this episode's moves would pass {MAX_EPISODE_MOVE_CHARS} characters in all (every "
                "reply repeats them); reset to start a new episode (the move was not played)",
                max_episode_move_chars=MAX_EPISODE_MOVE_CHARS,
            )
        self._episode_chars += len(message)
        return self._limited_step(lambda: self._play(message))

    def _limited_step(self, play: Callable[[], _Step]) -> _Step:
        """Run one game step under the watchdog's `step_limit_s`; a step stopped there ends the
        episode with `GameStepStopped`."""
        limit_s = type(self).step_limit_s
        try:
            with WATCHDOG.limit(limit_s, f"{self._state.env_id} step"):
                return play()
        except GameRunaway:
            self._game = None  # stopped mid-step: nothing of this episode can be trusted
            self._state.done = True  # the state says so too
            raise GameStepStopped(self._state.env_id, limit_s) from None

    def _play(self, message: str) -> TextArenaObservation:
        with self._random.lease():
            done, info = self._game.step(message)
        self._state.last_info = dict(info or {})
        if self._opponent is not None and not done:
            done = self._play_opponents()
        state = unwrap(self._game).state
        self._state.step_count += 1
        self._state.turn = int(getattr(state, "turn", self._state.turn + 1))
        reward = self._reward()
        self._state.last_reward = reward
        return self._observe(reward=reward, done=bool(done))

    @property
    def state(self) -> TextArenaState:
        """The session's state; ``raw_state`` is copied from the game now (a game log grows
        each step, so it is built when asked for, not at every step)."""
        if self._game is not None:
            self._state.raw_state = snapshot_state(self._game)
        return self._state

    def close(self) -> None:
        self._game = self._wrapped = None
        self._game_id = None

    # ------------------------------------------------------------------ helpers

    def _game_for(self, game_id: str, base: Any) -> Any:
        """The session's game for `game_id` around `base` (a freshly reset, unwrapped game):
        the wrappers are kept across resets of the same id, their transcript cleared."""
        if self._wrapped is None or self._game_id != game_id:
            # Settings for the server's game only: another id may not take the same kwargs.
            kwargs = self.env_kwargs if game_id == self.env_id else {}
            forbid_downloads()
            with self._random.lease():  # a constructor may draw, too
                self._wrapped = ta.make(game_id, **kwargs)
            self._game_id = game_id
        if not isinstance(self._wrapped, Wrapper):
            return base
        layer: Any = self._wrapped
        while True:  # the wrappers keep every message they rendered; a new episode starts clean
            if hasattr(layer, "full_observations"):
                layer.full_observations = {}
            if not isinstance(layer.env, Wrapper):
                layer.env = base
                return self._wrapped
            layer = layer.env

    def _agent(self) -> int:
        """The player whose view this session sends: the agent's, or whoever moves next."""
        if self._state.agent_player_id is not None:
            return self._state.agent_player_id
        return int(unwrap(self._game).state.current_player_id)

    def _play_opponents(self) -> bool:
        """Let the opponent move while it is not the agent's turn; returns ``done``."""
        assert self._opponent is not None and self._state.agent_player_id is not None
        state = unwrap(self._game).state
        done = bool(state.done)
        # An opponent's refused move does not pass the turn; the bound keeps a broken opponent
        # from spinning forever.
        for _ in range(1000):
            if done or state.current_player_id == self._state.agent_player_id:
                break
            player = int(state.current_player_id)
            state.observations[player] = []  # the opponent reads the board, not the transcript
            move = self._opponent.move(unwrap(self._game), player, self._opponent_rng)
            with self._random.lease():
                done, _ = self._game.step(move)
            state = unwrap(self._game).state
        return bool(done)

    def _reward(self) -> float:
        rewards = getattr(unwrap(self._game).state, "rewards", None)
        if not isinstance(rewards, dict):
            return 0.0
        if self._state.agent_player_id is not None:
            return _as_reward(rewards.get(self._state.agent_player_id))
        # OpenEnv's rule: the reward of the player to move, else player 0's.
        current = getattr(unwrap(self._game).state, "current_player_id", 0)
        return _as_reward(rewards[current] if current in rewards else rewards.get(0))

    def _observe(self, *, reward: float, done: bool) -> TextArenaObservation:
        state = unwrap(self._game).state
        player = self._agent()
        outcome = self._outcome(player) if done else {}
        prompt, messages, metadata = render_messages(
            self._game, player, form=self._state.observation_form, env_id=self._state.env_id
        )
        metadata.update(outcome)
        self._state.done = done
        return TextArenaObservation(
            prompt=prompt,
            messages=messages,
            current_player_id=int(state.current_player_id),
            legal_players=sorted(p for p in state.role_mapping if isinstance(p, int) and p >= 0),
            info=dict(getattr(state, "step_info", {}) or {}),
            reward=reward,
            done=done,
            metadata=metadata,
        )

    def _outcome(self, player: int) -> dict[str, Any]:
        """The ending of the finished game for `player`, for the last observation's metadata:
        ``success`` and ``reason`` (`game_outcome`). The reason also goes into `player`'s
        transcript as the game's last message, unless the game already said it: TextArena
        keeps it in ``game_info`` only, where no player reads it."""
        one_side = self._state.agent_player_id is not None or self._state.num_players == 1
        success, reason = game_outcome(self._game, player, plays_one_side=one_side)
        if reason is not None:
            pending = unwrap(self._game).state.observations.setdefault(player, [])
            if not any(reason in str(entry[1]) for entry in pending if isinstance(entry, tuple) and len(entry) > 1):
                pending.append((GAME_ID, reason, ObservationType.GAME_ADMIN))
        return {"success": success, "reason": reason}


def _limit(deadline_s: float | None) -> float | None:
    """How long a game call may run before it is stopped: its deadline plus the grace."""
    return None if deadline_s is None else deadline_s + RUNAWAY_GRACE_S
