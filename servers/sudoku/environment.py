"""TextArena Sudoku as an envsdk `Environment`, speaking OpenEnv's TextArena wire models.

Seeds and concurrency. TextArena's ``SudokuEnv.reset(seed=s)`` calls the process-wide
``random.seed(s)`` and then draws the board from the global RNG, so two sessions resetting at
once in one process can swap or mix boards, and a ``-hard`` board takes up to seconds of pure
Python (GIL-bound) search. This module therefore never lets the server process generate a board:
`BoardPool` runs TextArena's own ``reset(seed=s)`` in worker *processes* (one task at a time per
worker, so the global RNG a worker seeds is used by that task alone) and returns the solution
and the puzzle. The session then builds a fresh ``ta.make(env_id)`` game around those grids and
resets it without a seed, which touches no RNG. Consequences:

* the board of seed ``s`` is exactly the board ``ta.make(env_id).reset(num_players=1, seed=s)``
  gives in a fresh interpreter, whatever other sessions do at the same time;
* a long ``-hard`` generation occupies a worker process, never the server's GIL or event loop;
* results are cached by (clue count, seed), and a request for a board already being generated
  waits for that one (a GRPO group of sessions sharing a seed generates it once);
* a reset without a seed draws one from ``secrets`` and reports it in ``state.seed``, so every
  episode can be replayed.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, ClassVar, NamedTuple, get_args

import textarena as ta
from textarena.core import ActionWrapper, ObservationWrapper, Wrapper
from textarena.envs.registration import ENV_REGISTRY

from envsdk.env import Environment
from envsdk.errors import EpisodeDoneError, NotResetError
from envsdk.games.sudoku import MOVE_RE, Board, count_filled
from envsdk.protocol import ErrorCode
from servers.sudoku.models import (
    LastMove,
    MoveVerdict,
    ObservationForm,
    SudokuAction,
    SudokuObservation,
    SudokuState,
    TextArenaMessage,
)
from servers.sudoku.rubric import SUDOKU_RUBRICS, SudokuRubric

__all__ = [
    "SUDOKU_ENV_IDS",
    "OBSERVATION_FORMS",
    "SudokuOptionError",
    "check_env_id",
    "GeneratedBoard",
    "BoardPool",
    "default_board_pool",
    "convert_messages",
    "SudokuEnvironment",
]

#: Every TextArena Sudoku variant this server serves (``Sudoku-v0``, ``-very-easy``, ``-easy``,
#: ``-medium``, ``-hard`` and their ``-train`` / ``-raw`` forms), in TextArena's registry order.
SUDOKU_ENV_IDS: tuple[str, ...] = tuple(k for k in ENV_REGISTRY if k.startswith("Sudoku-"))
OBSERVATION_FORMS: tuple[str, ...] = get_args(ObservationForm)

_ADMIN_REASON_RE = re.compile(r"Reason: (.*?) Please resubmit", re.DOTALL)
_INVALID_PREFIX = "Invalid Move: "


class SudokuOptionError(ValueError):
    """A reset option or server setting has a value the Sudoku server cannot use."""


def check_env_id(env_id: str) -> str:
    """Return `env_id` if it names a TextArena Sudoku variant, else raise `SudokuOptionError`
    listing the valid ones."""
    if env_id not in SUDOKU_ENV_IDS:
        raise SudokuOptionError(
            f"Unknown Sudoku env id {env_id!r}; valid ids: {', '.join(SUDOKU_ENV_IDS)}"
        )
    return env_id


def _clues(env_id: str) -> int:
    return int(ENV_REGISTRY[env_id].kwargs["clues"])


def _unwrap(game: Any) -> Any:
    while isinstance(game, Wrapper):
        game = game.env
    return game


class GeneratedBoard(NamedTuple):
    """A puzzle and its unique solution, as TextArena generated them for one seed."""

    solution: Board
    puzzle: Board


def _generate_board(env_id: str, seed: int) -> GeneratedBoard:
    """Worker-process task: TextArena's own seeded generation (seeds this process's RNG)."""
    game = ta.make(env_id)
    game.reset(num_players=1, seed=seed)
    base = _unwrap(game)
    return GeneratedBoard(solution=base.full_grid, puzzle=base.game_board)


def _noop() -> None:
    return None


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class BoardPool:
    """Generates TextArena Sudoku boards in worker processes; caches them by (clues, seed).

    `submit` is thread-safe and never blocks on generation: it returns a future shared by every
    caller asking for the same board. The pool's processes start on first use (``spawn``: a
    fresh interpreter, safe in a threaded server); `warm` starts them ahead of time.
    """

    def __init__(self, workers: int | None = None, cache_size: int = 4096) -> None:
        if workers is not None and workers < 1:
            raise SudokuOptionError(f"BoardPool needs at least 1 worker, got {workers}")
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[int, int], Future[GeneratedBoard]] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def submit(self, env_id: str, seed: int) -> Future[GeneratedBoard]:
        """The future board of `seed` for `env_id`'s clue count (cached, shared)."""
        key = (_clues(check_env_id(env_id)), seed)
        with self._lock:
            future = self._cache.get(key)
            if future is not None and not (future.done() and future.exception() is not None):
                self._cache.move_to_end(key)
                return future
            future = self._submit_locked(_generate_board, env_id, seed)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def warm(self) -> None:
        """Start every worker process now instead of on the first resets.

        Called from the main thread, the workers are started with SIGINT ignored, which they
        keep from their first instruction: a Ctrl-C at the terminal (sent to the whole process
        group) then never interrupts a worker still importing, and the parent, which stops
        them, answers it alone."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            with self._lock:
                for _ in range(self.workers):
                    self._submit_locked(_noop)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def shutdown(self) -> None:
        """Stop the worker processes now, a running generation included (a ``-hard`` board can
        take minutes, and exiting would otherwise wait for it); queued ones are cancelled.
        Idempotent."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._cache.clear()
        if executor is None:
            return
        # Python < 3.14 has no public way to stop a busy worker; `_processes` is the executor's
        # own table of them.
        workers = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(timeout=5)

    def _submit_locked(self, fn: Any, *args: Any) -> Future[Any]:
        # Workers ignore Ctrl-C: a terminal sends SIGINT to the whole process group, and the
        # parent, which stops them through `shutdown`, is the one that should answer it.
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=get_context("spawn"), initializer=_ignore_sigint
            )
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool:
            # A worker died (e.g. killed by the OOM killer): replace the pool, retry once.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=get_context("spawn"), initializer=_ignore_sigint
            )
            return self._executor.submit(fn, *args)


_DEFAULT_POOL: BoardPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_board_pool() -> BoardPool:
    """The process-wide `BoardPool` every `SudokuEnvironment` uses unless given another."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = BoardPool()
        return _DEFAULT_POOL


async def _await_shared(future: Future[GeneratedBoard]) -> GeneratedBoard:
    """Await a future other sessions may share, without cancelling it when this waiter is
    cancelled (``asyncio.wrap_future`` would cancel the shared future)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[GeneratedBoard] = loop.create_future()

    def copy_result(done: Future[GeneratedBoard]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.set_exception(RuntimeError("board generation was cancelled (pool shut down)"))
        elif done.exception() is not None:
            waiter.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[GeneratedBoard]) -> None:
        try:
            loop.call_soon_threadsafe(copy_result, done)
        except RuntimeError:  # the loop closed while the board was being generated
            pass

    future.add_done_callback(on_done)
    return await waiter


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


def _copy_board(board: Board) -> Board:
    return [row[:] for row in board]


def _check_int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SudokuOptionError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise SudokuOptionError(f"{name} must be >= {minimum}, got {value}")
    return value


class SudokuEnvironment(Environment[SudokuAction, SudokuObservation, SudokuState]):
    """One Sudoku session: a new TextArena game per episode (see the module docstring for how
    boards are generated and README.md for what each observation form sends).

    ``reset`` and ``step`` are coroutines: a step is ~0.1 ms of work, cheaper on the event loop
    than a hop to a thread, and a reset only awaits its board from the `BoardPool`.
    """

    # The web page's Sudoku panel (board, hints, reward components), imported only when a
    # server mounts the page: board workers import this module and need none of it.
    web_panel: ClassVar[str] = "servers.sudoku.web:SUDOKU_PANEL"
    # A -hard board can take seconds, and queue behind other generations.
    reset_timeout_s: ClassVar[float | None] = 120.0
    step_timeout_s: ClassVar[float | None] = 10.0

    def __init__(self, env_id: str = "Sudoku-v0", *, board_pool: BoardPool | None = None) -> None:
        self.env_id = check_env_id(env_id)
        self._boards = board_pool
        self._game: Any = None
        self._base: Any = None
        self._state = SudokuState(env_id=self.env_id)

    # No **kwargs on purpose (narrower than the base class): the server refuses unknown
    # reset options by this signature instead of silently dropping them.
    async def reset(  # type: ignore[override]
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        *,
        error_allowance: int = 1,
        observation_form: ObservationForm = "cumulative",
        env_id: str | None = None,
        rubric: str | None = None,
    ) -> SudokuObservation:
        """Start a new game.

        Options: `seed` (int; same seed, same board), `episode_id` (str), `error_allowance`
        (int >= 0: consecutive invalid moves forgiven; one more ends the game),
        `observation_form` ("cumulative" or "compact"), `env_id` (any Sudoku variant; default:
        the server's), `rubric` ("shaped": every step's observation carries the five shaped
        reward parts in ``metadata["reward_components"]``, see servers/sudoku/rubric.py).
        Bad values raise `SudokuOptionError`.
        """
        if seed is not None:
            _check_int("seed", seed)
        if episode_id is not None and not isinstance(episode_id, str):
            raise SudokuOptionError(f"episode_id must be a string, got {episode_id!r}")
        _check_int("error_allowance", error_allowance, minimum=0)
        if observation_form not in OBSERVATION_FORMS:
            raise SudokuOptionError(
                f"observation_form must be one of {', '.join(OBSERVATION_FORMS)}, "
                f"got {observation_form!r}"
            )
        if rubric is not None and rubric not in SUDOKU_RUBRICS:
            raise SudokuOptionError(f"rubric must be one of {', '.join(SUDOKU_RUBRICS)} or null, got {rubric!r}")
        game_id = check_env_id(env_id) if env_id is not None else self.env_id
        seed = seed if seed is not None else secrets.randbelow(2**31)
        pool = self._boards or default_board_pool()
        generated = await _await_shared(pool.submit(game_id, seed))

        game = ta.make(game_id)
        base = _unwrap(game)
        solution, puzzle = _copy_board(generated.solution), _copy_board(generated.puzzle)
        # Hand the pre-generated grids to TextArena's own reset; without a seed it draws nothing.
        base._generate_board = lambda: (solution, puzzle)
        game.reset(num_players=1)
        base.state.error_allowance = error_allowance
        self._game, self._base = game, base
        initial = count_filled(base.game_board)
        self._state = SudokuState(
            episode_id=episode_id or str(uuid.uuid4()),
            step_count=0,
            env_id=game_id,
            max_turns=base.max_turns,
            seed=seed,
            board=_copy_board(base.state.game_state["board"]),
            initial_filled=initial,
            error_allowance=error_allowance,
            observation_form=observation_form,
        )
        first = self._observe(reward=0.0, done=False, last_move=LastMove())
        self.rubric = SudokuRubric() if rubric is not None else None
        if self.rubric is not None:
            self.rubric.begin(first)
        return first

    async def step(self, action: SudokuAction) -> SudokuObservation:
        """Play one move. Raises `NotResetError` before the first reset and `EpisodeDoneError`
        once the game is over (the server refuses those steps itself, with the same codes)."""
        if self._game is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._state.done:
            raise EpisodeDoneError(
                f"Episode {self._state.episode_id} is over; call reset to start a new one",
                code=ErrorCode.EPISODE_DONE.value,
            )
        game_state = self._base.state
        before = _copy_board(game_state.game_state["board"])
        done, info = self._game.step(action.message)
        after = game_state.game_state["board"]
        self._state.step_count += 1
        self._state.turn = game_state.turn
        self._state.board = _copy_board(after)
        self._state.done = bool(done)
        rewards = game_state.rewards
        reward = float(rewards[0]) if isinstance(rewards, dict) and 0 in rewards else 0.0
        self._state.last_reward = reward
        self._state.last_info = dict(info or {})
        verdict = self._verdict(action.message, changed=after != before)
        observation = self._observe(reward=reward, done=bool(done), last_move=verdict)
        self._apply_rubric(action, observation)  # parts into the metadata; the reward stays the game's
        return observation

    @property
    def state(self) -> SudokuState:
        return self._state

    def close(self) -> None:
        self._game = self._base = None

    # ------------------------------------------------------------------ helpers

    def _verdict(self, message: str, *, changed: bool) -> LastMove:
        read = message
        layer: Any = self._game
        while isinstance(layer, Wrapper):  # the text the game itself parsed
            if isinstance(layer, ActionWrapper):
                read = layer.action(read)
            layer = layer.env
        match = MOVE_RE.search(read)
        move = [int(g) for g in match.groups()] if match else None
        if changed:
            return LastMove(move=move, verdict="valid")
        verdict: MoveVerdict = "invalid" if match else "bad_format"
        return LastMove(move=move, verdict=verdict, reason=self._refusal_reason())

    def _refusal_reason(self) -> str | None:
        state = self._base.state
        game_info = state.game_info.get(0, {})
        if state.done and game_info.get("invalid_move"):
            return str(game_info.get("reason", "")).removeprefix(_INVALID_PREFIX) or None
        for _, text, kind in reversed(state.observations.get(0, [])):
            if kind == ta.ObservationType.GAME_ADMIN:
                found = _ADMIN_REASON_RE.search(text)
                return found.group(1) if found else text
        return None

    def _observe(
        self, *, reward: float, done: bool, last_move: LastMove
    ) -> SudokuObservation:
        base = self._base
        state = base.state
        player_id, raw = base.get_observation()  # the messages new since the last observation
        rendered: Any = raw
        layers: list[Any] = []
        layer: Any = self._game
        while isinstance(layer, Wrapper):
            layers.append(layer)
            layer = layer.env
        for wrapper in reversed(layers):  # what `self._game.get_observation()` would return
            if isinstance(wrapper, ObservationWrapper):
                rendered = wrapper.observation(player_id, rendered)

        turn = int(state.turn)
        form = self._state.observation_form
        if form == "cumulative":
            # A wrapped game renders one string, which OpenEnv's conversion turns into exactly
            # one MESSAGE from -1, char by char (~30 ms at the end of a game); build it directly.
            if isinstance(rendered, str):
                messages = [TextArenaMessage(sender_id=-1, content=rendered, category="MESSAGE")] if rendered else []
            else:
                messages = convert_messages(rendered)
            prompt_lines = [m.content for m in messages if m.category == "PROMPT"]
            if not prompt_lines:
                prompt_lines = [messages[0].content] if turn == 0 and messages else [self._state.env_id]
            prompt = "\n".join(prompt_lines).strip()
            metadata: dict[str, Any] = {
                "env_id": self._state.env_id,
                "turn": turn,
                "raw_messages": [m.model_dump() for m in messages],
            }
        else:
            all_new = convert_messages(raw)
            prompt = "\n".join(m.content for m in all_new if m.category == "PROMPT").strip()
            messages = [m for m in all_new if m.category != "PROMPT"]
            metadata = {"env_id": self._state.env_id, "turn": turn}

        game_info = state.game_info.get(0, {})
        return SudokuObservation(
            prompt=prompt,
            messages=messages,
            current_player_id=player_id,
            legal_players=sorted(p for p in state.role_mapping if isinstance(p, int) and p >= 0),
            info=dict(state.step_info),
            board=_copy_board(state.game_state["board"]),
            initial_filled=self._state.initial_filled,
            last_move=last_move,
            invalid_moves_left=0 if done else max(0, state.error_allowance - state.error_count),
            step=self._state.step_count,
            turn=turn,
            end_reason=str(game_info.get("reason")) if done and game_info.get("reason") else None,
            reward=reward,
            done=done,
            metadata=metadata,
        )
