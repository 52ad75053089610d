"""Any TextArena game as an envsdk `Environment`, speaking OpenEnv's TextArena wire models.

Seeds and concurrency. TextArena games draw from the process-wide ``random`` generator (and a
few from numpy's): ``reset(seed=s)`` calls ``random.seed(s)`` and then generates the game (for
some games, a second of pure Python), and later steps (a 2048 tile, a Blackjack card, a Bandit
payout) keep drawing from it. In one shared process, sessions would mix each other's draws and
a seed would replay nothing. So:

* the seeded reset runs in a worker process of a `GamePool` (``servers.textarena.pool``): one
  task at a time per worker, so the generator it seeds serves that game alone; the game and the
  generator states after the reset come back pickled, cached by (id, kwargs, players, seed) and
  shared by every session asking for the same seed; each session unpickles its own copy, and a
  slow generation never holds the server's event loop or GIL;
* every later call into the game runs inside the session's `GameRandom` lease: under one
  process-wide lock, the global generators are set to the session's own state, the call runs,
  the state is saved back to the session and the generators are restored.

Hence seed ``s`` gives the episode ``ta.make(env_id).reset(num_players=n, seed=s)`` gives in a
fresh interpreter, step for step, whatever other sessions do at the same time; the server
process's own generators are left alone; a reset without a seed draws one from ``secrets`` and
reports it in ``state.seed``. Steps are well under a millisecond and run on the event loop.
"""

from __future__ import annotations

import enum
import functools
import inspect
import math
import pickle
import random
import secrets
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, get_args

import textarena as ta
from textarena.core import ObservationWrapper, Wrapper
from textarena.envs.registration import ENV_REGISTRY

from envsdk.env import Environment
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.protocol import ErrorCode
from servers.textarena.errors import TextArenaOptionError
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
from servers.textarena.pool import GamePool, await_shared, default_game_pool

__all__ = [
    "TEXTARENA_ENV_IDS",
    "OBSERVATION_FORMS",
    "TextArenaOptionError",
    "check_env_id",
    "unwrap",
    "convert_messages",
    "render_messages",
    "snapshot_state",
    "GameRandom",
    "TextArenaEnvironment",
]

#: Every game id TextArena registers (each game with its wrapper variants), in registry order.
TEXTARENA_ENV_IDS: tuple[str, ...] = tuple(ENV_REGISTRY)
OBSERVATION_FORMS: tuple[str, ...] = get_args(ObservationForm)
_OPPONENTS: tuple[str, ...] = get_args(OpponentName)


def check_env_id(env_id: str) -> str:
    """Return `env_id` if TextArena registers it, else raise `TextArenaOptionError`."""
    if not isinstance(env_id, str) or env_id not in ENV_REGISTRY:
        close = [k for k in ENV_REGISTRY if isinstance(env_id, str) and k.lower().startswith(env_id.lower()[:4])]
        hint = f"; similar: {', '.join(close[:8])}" if close else ""
        raise TextArenaOptionError(
            f"Unknown TextArena env id {env_id!r} ({len(ENV_REGISTRY)} ids are registered, "
            f"e.g. Wordle-v0, TicTacToe-v0, Sudoku-v0{hint})"
        )
    return env_id


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """`value` if it is an int (not a bool) >= `minimum`, else `TextArenaOptionError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TextArenaOptionError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise TextArenaOptionError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_observation_form(value: Any) -> ObservationForm:
    """`value` if it names an observation form, else `TextArenaOptionError`."""
    if value not in OBSERVATION_FORMS:
        raise TextArenaOptionError(
            f"observation_form must be one of {', '.join(OBSERVATION_FORMS)}, got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def unwrap(game: Any) -> Any:
    """The TextArena game under its wrappers."""
    while isinstance(game, Wrapper):
        game = game.env
    return game


class GameRandom:
    """One session's own state of the process-wide ``random`` and numpy generators.

    `lease` is a context manager: inside it, the global generators hold this session's state
    (other sessions wait on a process-wide lock); on exit the state is saved here and the
    generators are put back as they were. `restore` sets the session's state (the states a
    worker process had right after generating the session's game).
    """

    _LOCK: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._python: Any = None
        self._numpy: Any = None
        self.numpy = False

    def restore(self, python_state: Any, numpy_state: Any, *, numpy: bool) -> None:
        """Set the session's states; `numpy` says whether numpy's generator is leased too
        (swapping it costs ~0.5 ms a call, so only for games that draw from it)."""
        self._python, self._numpy, self.numpy = python_state, numpy_state, numpy

    @contextmanager
    def lease(self) -> Iterator[None]:
        numpy_random = _numpy_random() if self.numpy else None
        with self._LOCK:
            saved_python = random.getstate()
            saved_numpy = numpy_random.get_state() if numpy_random is not None else None
            try:
                if self._python is not None:
                    random.setstate(self._python)
                if numpy_random is not None and self._numpy is not None:
                    numpy_random.set_state(self._numpy)
                yield
            finally:
                self._python = random.getstate()
                random.setstate(saved_python)
                if numpy_random is not None:
                    self._numpy = numpy_random.get_state()
                    numpy_random.set_state(saved_numpy)


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


def _as_reward(value: Any) -> float:
    """A game's reward as a float; anything not a number counts as 0.0 (textarena 0.7.4's
    Countdown passes its reason text where the reward belongs)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return 0.0


class TextArenaEnvironment(Environment[TextArenaAction, TextArenaObservation, TextArenaState]):
    """One session of any TextArena game (see the module docstring for seeding, README.md for
    the observation forms and opponents).

    `env_id`, `num_players`, `max_turns` and `env_kwargs` are the server's settings (OpenEnv's
    ``TEXTARENA_*`` variables): `env_kwargs` go to ``ta.make``; `max_turns` is reported in the
    state as OpenEnv does (a game's own turn limit is one of its kwargs, e.g. ``max_turns``).
    Each reset's game comes from `game_pool` (default: the process-wide `GamePool`) and is put
    under the session's TextArena wrappers, which are kept across resets of the same id with
    their transcript cleared.
    """

    reset_timeout_s: ClassVar[float | None] = 60.0
    step_timeout_s: ClassVar[float | None] = 10.0

    def __init__(
        self,
        env_id: str = "Wordle-v0",
        *,
        num_players: int = 1,
        max_turns: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        game_pool: GamePool | None = None,
    ) -> None:
        self.env_id = check_env_id(env_id)
        self.num_players = check_int("num_players", num_players, minimum=1)
        self.max_turns = None if max_turns is None else check_int("max_turns", max_turns, minimum=1)
        self.env_kwargs = dict(env_kwargs or {})
        self._pool = game_pool
        self._random = GameRandom()
        self._game: Any = None
        self._game_id: str | None = None
        self._opponent: Opponent | None = None
        self._opponent_rng = random.Random()
        self._state = TextArenaState(env_id=self.env_id, num_players=self.num_players, max_turns=self.max_turns)

    # No **kwargs on purpose: the server refuses unknown reset options by this signature
    # instead of silently dropping them.
    async def reset(  # type: ignore[override]
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

        Options: `seed` (int; same seed, same episode), `episode_id` (str), `env_id` (any
        TextArena id; default: the server's), `num_players` (default: the server's),
        `observation_form` ("cumulative" or "compact"), `opponent` ("random" or "scripted":
        the server plays every player but `agent_player_id`; games with a built-in opponent
        only, see `servers.textarena.opponents`). Bad values raise `TextArenaOptionError`.
        """
        if seed is not None:
            check_int("seed", seed)
        if episode_id is not None and not isinstance(episode_id, str):
            raise TextArenaOptionError(f"episode_id must be a string, got {episode_id!r}")
        game_id = check_env_id(env_id) if env_id is not None else self.env_id
        players = check_int("num_players", num_players, minimum=1) if num_players is not None else self.num_players
        form = check_observation_form(observation_form)
        if opponent is not None and opponent not in _OPPONENTS:
            raise TextArenaOptionError(f"opponent must be one of {', '.join(_OPPONENTS)} or null, got {opponent!r}")
        check_int("agent_player_id", agent_player_id, minimum=0)
        if opponent is not None and agent_player_id >= players:
            raise TextArenaOptionError(
                f"agent_player_id must be below num_players ({players}), got {agent_player_id}"
            )
        seed = seed if seed is not None else secrets.randbelow(2**31)

        kwargs = self.env_kwargs if game_id == self.env_id else {}
        pool = self._pool or default_game_pool()
        try:
            generated = await await_shared(pool.submit(game_id, kwargs, players, seed))
        except (AssertionError, TypeError) as exc:  # TextArena's own checks of its arguments
            raise TextArenaOptionError(
                f"{game_id} cannot be reset with num_players={players} and kwargs {kwargs}: {exc}"
            ) from None
        except SyntaxError as exc:  # some textarena 0.7.4 games need Python 3.12's f-strings
            raise TextArenaOptionError(
                f"{game_id}'s TextArena module does not compile on Python "
                f"{sys.version_info.major}.{sys.version_info.minor}: {exc}"
            ) from None
        base, python_state, numpy_state = pickle.loads(generated.payload)
        game = self._game_for(game_id, base)
        self._random.restore(python_state, numpy_state, numpy=draws_from_numpy(base.__class__))
        if isinstance(base.state, ta.FFAMultiPlayerState) and base.state.num_players < 2:
            # TextArena's free-for-all turn rotation loops forever once its only player is
            # eliminated: refuse the setting instead of hanging the server.
            self._game = None
            raise TextArenaOptionError(
                f"{game_id} is a multi-player game: num_players must be at least 2 "
                "(one session plays every player in turn; see current_player_id)"
            )
        try:
            self._opponent = make_opponent(opponent, base, game_id) if opponent is not None else None
        except TextArenaOptionError:
            self._game = None  # no half-started episode: the next step is refused as NOT_RESET
            raise
        self._opponent_rng = random.Random(seed)
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

    async def step(self, action: TextArenaAction) -> TextArenaObservation:
        """Play one move (then the opponent's, if any). Raises `NotResetError` before the first
        reset and `EpisodeDoneError` once the game is over (the server refuses those steps
        itself, with the same codes)."""
        if self._game is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._state.done:
            raise EpisodeDoneError(
                f"Episode {self._state.episode_id} is over; call reset to start a new one",
                code=ErrorCode.EPISODE_DONE.value,
            )
        with self._random.lease():
            done, info = self._game.step(action.message)
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
        self._game = None
        self._game_id = None

    # ------------------------------------------------------------------ helpers

    def _game_for(self, game_id: str, base: Any) -> Any:
        """The session's game for `game_id` around `base` (a freshly reset, unwrapped game):
        the wrappers are kept across resets of the same id, their transcript cleared."""
        if self._game is None or self._game_id != game_id:
            # Settings for the server's game only: another id may not take the same kwargs.
            kwargs = self.env_kwargs if game_id == self.env_id else {}
            forbid_downloads()
            with self._random.lease():  # a constructor may draw, too
                self._game = ta.make(game_id, **kwargs)
            self._game_id = game_id
        if not isinstance(self._game, Wrapper):
            self._game = base
            return base
        layer: Any = self._game
        while True:  # the wrappers keep every message they rendered; a new episode starts clean
            if hasattr(layer, "full_observations"):
                layer.full_observations = {}
            if not isinstance(layer.env, Wrapper):
                layer.env = base
                return self._game
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
        prompt, messages, metadata = render_messages(
            self._game, player, form=self._state.observation_form, env_id=self._state.env_id
        )
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
