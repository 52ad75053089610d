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
* the pool is the TextArena server's bounded service (``servers.textarena.pool``): a deadline
  per generation, a bounded queue (CAPACITY_REACHED past it), a board nobody waits for any more
  is not generated;
* a reset without a seed draws one from ``secrets`` and reports it in ``state.seed``, so every
  episode can be replayed.

Every method is a plain function, so the server runs it on the session's lane under its
deadline (a game step is game code, and game code never runs on the event loop; see
``servers.textarena.environment`` for what stops a runaway call). Moves are capped at
`MAX_MOVE_CHARS` characters, and string options at 256.
"""

from __future__ import annotations

import atexit
import re
import secrets
import threading
import uuid
from concurrent.futures import Future
from typing import Any, ClassVar, NamedTuple, get_args

import textarena as ta
from textarena.core import ActionWrapper, Wrapper
from textarena.envs.registration import ENV_REGISTRY

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
)
from servers.sudoku.rubric import SUDOKU_RUBRICS, SudokuRubric
from servers.textarena.environment import (
    MAX_OPTION_CHARS,
    WATCHDOG,
    TextArenaEnvironment,
    _limit,
    convert_messages,
    render_messages,
    snapshot_state,
    unwrap,
)
from servers.textarena.errors import TextArenaOptionError, shown
from servers.textarena.pool import DEFAULT_TASK_TIMEOUT_S, MAX_WORKERS, WorkerPool

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


class SudokuOptionError(TextArenaOptionError):
    """A reset option or server setting has a value the Sudoku server cannot use."""


def check_env_id(env_id: str) -> str:
    """Return `env_id` if it names a TextArena Sudoku variant, else raise `SudokuOptionError`
    listing the valid ones."""
    if not isinstance(env_id, str) or env_id not in SUDOKU_ENV_IDS:
        raise SudokuOptionError(
            f"Unknown Sudoku env id {shown(env_id)}; valid ids: {', '.join(SUDOKU_ENV_IDS)}"
        )
    return env_id


def _clues(env_id: str) -> int:
    return int(ENV_REGISTRY[env_id].kwargs["clues"])


class GeneratedBoard(NamedTuple):
    """A puzzle and its unique solution, as TextArena generated them for one seed."""

    solution: Board
    puzzle: Board


def _generate_board(env_id: str, seed: int) -> GeneratedBoard:
    """Worker-process task: TextArena's own seeded generation (seeds this process's RNG)."""
    game = ta.make(env_id)
    game.reset(num_players=1, seed=seed)
    base = unwrap(game)
    return GeneratedBoard(solution=base.full_grid, puzzle=base.game_board)


class BoardPool(WorkerPool):
    """Generates TextArena Sudoku boards in worker processes; caches them by (clues, seed).

    `submit` is thread-safe and never blocks on generation: it returns a future shared by every
    caller asking for the same board. The pool's processes start on first use (``spawn``: a
    fresh interpreter, safe in a threaded server); `warm` starts them ahead of time.
    """

    preload = ("textarena", "servers.sudoku.environment")

    def __init__(
        self, workers: int | None = None, cache_size: int = 4096, *,
        task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S, max_queued: int | None = None,
    ) -> None:
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise SudokuOptionError(f"BoardPool takes 1 to {MAX_WORKERS} workers, got {workers}")
        super().__init__(workers, cache_size, task_timeout_s=task_timeout_s, max_queued=max_queued)

    def board(self, env_id: str, seed: int, *, timeout_s: float) -> GeneratedBoard:
        """The board of `seed` for `env_id`'s clue count (cached, shared); blocks up to
        `timeout_s` (see `WorkerPool.generate`)."""
        clues = _clues(check_env_id(env_id))
        board: GeneratedBoard = self.generate((clues, seed), clues, _generate_board, env_id, seed, timeout_s=timeout_s)
        return board

    def submit(self, env_id: str, seed: int) -> Future[GeneratedBoard]:
        """The future board of `seed` for `env_id`'s clue count (cached, shared, never given
        up: see `WorkerPool.submit_cached`)."""
        clues = _clues(check_env_id(env_id))
        return self.submit_cached((clues, seed), clues, _generate_board, env_id, seed)


_DEFAULT_POOL: BoardPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_board_pool() -> BoardPool:
    """The process-wide `BoardPool` every `SudokuEnvironment` uses unless given another."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = BoardPool()
            # Stopped before the interpreter finalises: a pool still running then could start a
            # replacement worker that dies reading its start-up data from a parent gone away.
            atexit.register(_DEFAULT_POOL.shutdown)
        return _DEFAULT_POOL


def _copy_board(board: Board) -> Board:
    return [row[:] for row in board]


MAX_ERROR_ALLOWANCE = 10
"""Most consecutive invalid moves a client may ask to be forgiven: each one is a step whose
message the cumulative observation repeats, so the option bounds an episode's replies."""


def _check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SudokuOptionError(f"{name} must be an integer, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise SudokuOptionError(f"{name} must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise SudokuOptionError(f"{name} must be <= {maximum}")
    return value


class SudokuEnvironment(TextArenaEnvironment):
    """One Sudoku session: a new TextArena game per episode (see the module docstring for how
    boards are generated and README.md for what each observation form sends). The TextArena
    server's session class, specialised: boards from a `BoardPool`, structured fields.

    ``reset`` and ``step`` are plain functions (run on the session's lane): a reset waits on
    its lane for its board from the `BoardPool`.
    """

    _state: SudokuState

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
    def reset(  # type: ignore[override]
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
        (int, 0 to `MAX_ERROR_ALLOWANCE`: consecutive invalid moves forgiven; one more ends the game),
        `observation_form` ("cumulative" or "compact"), `env_id` (any Sudoku variant; default:
        the server's), `rubric` ("shaped": every step's observation carries the five shaped
        reward parts in ``metadata["reward_components"]``, see servers/sudoku/rubric.py).
        Bad values raise `SudokuOptionError`.
        """
        if seed is not None:
            _check_int("seed", seed)
        if episode_id is not None and not isinstance(episode_id, str):
            raise SudokuOptionError(f"episode_id must be a string, got {shown(episode_id)}")
        if episode_id is not None and len(episode_id) > MAX_OPTION_CHARS:
            raise SudokuOptionError(f"episode_id must be at most {MAX_OPTION_CHARS} characters, got {len(episode_id)}")
        _check_int("error_allowance", error_allowance, minimum=0, maximum=MAX_ERROR_ALLOWANCE)
        if observation_form not in OBSERVATION_FORMS:
            raise SudokuOptionError(
                f"observation_form must be one of {', '.join(OBSERVATION_FORMS)}, "
                f"got {shown(observation_form)}"
            )
        if rubric is not None and rubric not in SUDOKU_RUBRICS:
            raise SudokuOptionError(f"rubric must be one of {', '.join(SUDOKU_RUBRICS)} or null, got {shown(rubric)}")
        game_id = check_env_id(env_id) if env_id is not None else self.env_id
        seed = seed if seed is not None else secrets.randbelow(2**31)
        pool = self._boards or default_board_pool()
        with WATCHDOG.limit(_limit(type(self).reset_timeout_s), f"{game_id} reset"):
            generated = pool.board(game_id, seed, timeout_s=type(self).reset_timeout_s or 120.0)
            return self._start(generated, game_id, seed, episode_id, error_allowance, observation_form, rubric)

    def _start(
        self, generated: GeneratedBoard, game_id: str, seed: int, episode_id: str | None,
        error_allowance: int, observation_form: ObservationForm, rubric: str | None,
    ) -> SudokuObservation:
        game = ta.make(game_id)
        base = unwrap(game)
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

    def step(self, action: SudokuAction) -> SudokuObservation:  # type: ignore[override]
        """Play one move. Raises `NotResetError` before the first reset and `EpisodeDoneError`
        once the game is over (the server refuses those steps itself, with the same codes)."""
        if self._game is None:
            raise NotResetError("Call reset before step", code=ErrorCode.NOT_RESET.value)
        if self._state.done:
            raise EpisodeDoneError(
                f"Episode {self._state.episode_id} is over; call reset to start a new one",
                code=ErrorCode.EPISODE_DONE.value,
            )
        return self._limited_step(lambda: self._play_move(action))

    def _play_move(self, action: SudokuAction) -> SudokuObservation:
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
        if self._game is not None:  # built when asked for: the game log grows each step
            self._state.raw_state = snapshot_state(self._game)
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

    def _observe(  # type: ignore[override]
        self, *, reward: float, done: bool, last_move: LastMove
    ) -> SudokuObservation:
        state = self._base.state
        player_id = int(state.current_player_id)
        prompt, messages, metadata = render_messages(
            self._game, player_id, form=self._state.observation_form, env_id=self._state.env_id
        )
        turn = int(state.turn)
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
