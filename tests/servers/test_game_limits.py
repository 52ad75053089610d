"""The game servers' bounds, each attacked over a real socket on a real TextArena server (a
child process, as deployed) while an honest client plays alongside and is measured."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from envsdk.testing import free_port
from tests.reliability.helpers import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.timeout(180)

#: The moves that eliminate both players of MarketEntryGame-v0 (2 players, seed 1) and then
#: pass the turn: TextArena's own rotation never returns from the last one.
LOOPING_MOVES = [
    "[99]", "[99]", "[X]", "[0]", "", "[99]", "[0]", "", "[5]", "[S]", "[E]", "[0]", "[E]", "hello",
    "[0]", "[E]", "[0]", "hello", "hello", "[5]", "", "hello", "[5]",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("game-limits") / "server.log"
    started = start_server(
        "", log, module="servers.textarena", timeout_s=60,
        args=["--env-id", "GuessTheNumber-v0", "--game-workers", "2", "--generation-timeout-s", "4",
              "--max-queued-generations", "6", "--max-concurrent-envs", "32"],
    )
    yield started
    stop_server(started)


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


class Client:
    """A raw-frame client: one JSON request, one JSON reply (its size kept)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.last_size = 0

    async def call(self, frame: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        await self.ws.send(json.dumps(frame))
        raw = await asyncio.wait_for(self.ws.recv(), timeout=timeout)
        self.last_size = len(raw)
        return dict(json.loads(raw))

    async def reset(self, **data: Any) -> dict[str, Any]:
        return await self.call({"type": "reset", "data": data})

    async def step(self, message: str) -> dict[str, Any]:
        return await self.call({"type": "step", "data": {"message": message}})


class Honest:
    """An honest player measured alongside an attack: it plays GuessTheNumber on its own
    session, round after round, recording how long each reply took."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.latencies: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _play(self) -> None:
        async with websockets.connect(ws_url(self.server), max_size=None) as ws:
            client = Client(ws)
            seed = 0
            while not self._stop.is_set():
                seed += 1
                started = time.monotonic()
                reply = await client.reset(seed=seed)
                self.latencies.append(time.monotonic() - started)
                assert reply["type"] == "observation", reply
                for guess in range(1, 21):
                    started = time.monotonic()
                    reply = await client.step(f"[{guess}]")
                    self.latencies.append(time.monotonic() - started)
                    assert reply["type"] == "observation", reply
                    if reply["data"]["done"] or self._stop.is_set():
                        break

    async def __aenter__(self) -> Honest:
        self._task = asyncio.ensure_future(self._play())
        while len(self.latencies) < 3:  # playing before the attack starts
            await asyncio.sleep(0.05)
            if self._task.done():
                self._task.result()
        self.latencies.clear()  # only what the attack could slow counts
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 60)

    def worst(self) -> float:
        return max(self.latencies, default=0.0)


@pytest.fixture
async def honest(server: ServerProcess) -> AsyncIterator[Honest]:
    async with Honest(server) as player:
        yield player


async def test_a_step_that_eliminates_every_player_ends_the_game_and_the_server_goes_on(
    server: ServerProcess, honest: Honest
) -> None:
    async with websockets.connect(ws_url(server), max_size=None) as ws:
        attacker = Client(ws)
        first = await attacker.reset(env_id="MarketEntryGame-v0", num_players=2, seed=1)
        assert first["type"] == "observation", first
        started = time.monotonic()
        for move in LOOPING_MOVES:
            reply = await attacker.call({"type": "step", "data": {"message": move}}, timeout=30)
            assert reply["type"] == "observation", reply
        assert time.monotonic() - started < 10
        # The game is over, every player lost, instead of the server's loop spinning forever.
        assert reply["data"]["done"] is True
        assert reply["data"]["observation"]["info"] is not None
        health_started = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        assert time.monotonic() - health_started < 1
    assert honest.worst() < 2.0, honest.latencies


async def test_a_move_past_its_games_cap_is_refused_unplayed_and_a_move_at_the_cap_is_quick(
    server: ServerProcess, honest: Honest
) -> None:
    async with websockets.connect(ws_url(server), max_size=None) as ws:
        attacker = Client(ws)
        assert (await attacker.reset(env_id="ConnectFour-v0", num_players=2, seed=1))["type"] == "observation"
        started = time.monotonic()
        refused = await attacker.step("[" * 24_000)  # 20 s of ConnectFour's regex, GIL held
        assert time.monotonic() - started < 1
        assert refused["data"]["code"] == "VALIDATION_ERROR", refused
        assert refused["data"]["max_move_chars"] == 512
        assert "24000 characters" in refused["data"]["message"]
        assert attacker.last_size < 1024
        started = time.monotonic()
        at_cap = await attacker.step("[" * 512)  # the longest move ConnectFour takes
        assert at_cap["type"] == "observation", at_cap
        assert time.monotonic() - started < 1
        played = await attacker.step("[col 3]")  # the game goes on: nothing was half-played
        assert played["type"] == "observation" and played["data"]["done"] is False
    assert honest.worst() < 2.0, honest.latencies


async def test_an_episodes_moves_are_bounded_so_its_replies_are(server: ServerProcess) -> None:
    async with websockets.connect(ws_url(server), max_size=None) as ws:
        client = Client(ws)
        assert (await client.reset(env_id="2048-v0", seed=3))["type"] == "observation"
        sizes: list[int] = []
        moves = [(move + " ").ljust(4000, "x") for move in ("[Up]", "[Left]", "[Down]", "[Right]")]
        for played in range(200):
            reply = await client.step(moves[played % 4])
            if reply["type"] == "error":
                break
            sizes.append(client.last_size)
            assert reply["data"]["done"] is False, "the 2048 game ended before the budget was spent"
        assert reply["data"]["code"] == "VALIDATION_ERROR", reply
        assert reply["data"]["max_episode_move_chars"] == 256 * 1024
        assert len(sizes) == 256 * 1024 // 4000
        assert max(sizes) < 1_200_000  # the cumulative transcript holds at most the budget
        again = await client.reset(env_id="2048-v0", seed=3)  # a new episode, a new budget
        assert again["type"] == "observation"
        assert (await client.step(moves[0]))["type"] == "observation"


async def test_string_options_and_unknown_ids_are_bounded_in_reply_and_log(server: ServerProcess) -> None:
    log_before = server.log_path.stat().st_size
    async with websockets.connect(ws_url(server), max_size=None) as ws:
        client = Client(ws)
        unknown = await client.reset(env_id="N" * (4 * 2**20))
        assert unknown["data"]["code"] == "VALIDATION_ERROR"
        assert "Unknown TextArena env id" in unknown["data"]["message"]
        assert client.last_size < 2048
        long_id = await client.reset(episode_id="e" * 2**20)
        assert long_id["data"]["code"] == "VALIDATION_ERROR"
        assert "episode_id must be at most 256 characters" in long_id["data"]["message"]
        assert client.last_size < 2048
        ok = await client.reset(episode_id="e" * 256, seed=1)
        assert ok["type"] == "observation"
        state = await client.call({"type": "state"})
        assert state["data"]["episode_id"] == "e" * 256
    assert server.log_path.stat().st_size - log_before < 4096


async def test_the_game_pool_is_bounded_and_shared_fairly(server: ServerProcess, honest: Honest) -> None:
    """Clients flood the 2-worker pool with a game whose generation takes minutes (Sokoban's
    medium boards): the pool's queue refuses what is past its bound at once, each generation
    is stopped at its deadline (4 s here), and the flood holds one worker only, so an honest
    reset of another game is served at once."""
    sockets = [await websockets.connect(ws_url(server), max_size=None) for _ in range(8)]
    try:
        for k, ws in enumerate(sockets):
            await ws.send(json.dumps({"type": "reset", "data": {"env_id": "Sokoban-v0-medium", "seed": 1000 + k}}))
        replies = [asyncio.ensure_future(ws.recv()) for ws in sockets]
        await asyncio.sleep(0.5)
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            started = time.monotonic()
            reply = await Client(ws).reset()  # unseeded, the server's game
            assert reply["type"] == "observation", reply
            assert time.monotonic() - started < 5
        # 4 queued (one game may fill 3/4 of the queue of 6) and 1 running (unless the eighth
        # came before the worker took the first): 3 or 4 refused at once.
        # A seed whose board comes quickly may be answered with its game by then (the one
        # taken first): only the replies that are errors are refusals.
        done, _ = await asyncio.wait(replies, timeout=1)
        early = [json.loads(r.result()) for r in done]
        codes = [m["data"]["code"] for m in early if m["type"] == "error"]
        assert all(m["type"] in ("error", "observation") for m in early), early
        assert set(codes) == {"CAPACITY_REACHED"} and len(codes) in (3, 4), early
        # A generation past its deadline is stopped and its caller told so. Seeds' boards take
        # from under a second to minutes: one that finishes in time is answered with its game.
        # The flood's generations run one after another (its share is one worker), 4 s at most.
        give_up_at = time.monotonic() + 30
        while time.monotonic() < give_up_at:
            done, _ = await asyncio.wait(replies, timeout=0.5)
            messages = [json.loads(r.result())["data"] for r in done]
            timeouts = [m for m in messages if m.get("code") == "TIMEOUT"]
            if timeouts:
                break
        assert timeouts and "did not finish within 4s" in timeouts[0]["message"], messages
        assert all("observation" in m or m.get("code") in ("TIMEOUT", "CAPACITY_REACHED") for m in messages), messages
    finally:
        for ws in sockets:  # the clients leave without waiting for the rest
            await ws.close()
    stateless = httpx.post(server.url + "/reset", json={"env_id": "GuessTheNumber-v0", "seed": 5}, timeout=30)
    assert stateless.status_code == 200 and stateless.json()["done"] is False
    assert honest.worst() < 5.0, honest.latencies


def test_the_launcher_serves_a_game_that_runs_offline_by_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEXTARENA_")}
    server = start_server("", tmp_path / "server.log", module="servers.textarena", env=env, timeout_s=60)
    try:
        reply = httpx.post(server.url + "/reset", json={"seed": 1}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert "Guess" in reply.json()["observation"]["prompt"]
    finally:
        stop_server(server)


def test_the_wordle_refusal_names_every_missing_nltk_resource(tmp_path: Path) -> None:
    env = {**os.environ, "NLTK_DATA": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "servers.textarena", "--env-id", "Wordle-v0", "--port", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    err = done.stderr.strip()
    assert "NLTK data not installed: averaged_perceptron_tagger_eng, words" in err, err
    assert "\n" not in err


_REPO = Path(__file__).resolve().parents[2]


def _run_server(module: str, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m module --port <free> flags``, waited for (a server that serves is killed at 90 s)."""
    return subprocess.run(
        [sys.executable, "-m", module, "--port", str(free_port()), *flags], cwd=_REPO, env={**os.environ, "ENVSDK_WEB": "0", **(env or {})},
        capture_output=True, text=True, timeout=90, check=False,
    )


def _usage_error(done: subprocess.CompletedProcess[str], module: str) -> str:
    """The one error line of a usage error (exit 2, no traceback)."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"python -m {module}: error: "), done.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena", "servers.coding"])
def test_an_unknown_log_level_is_a_usage_error_naming_where_it_came_from(module: str) -> None:
    """LOG_LEVEL=loud started the game workers, then failed in uvicorn with a KeyError traceback."""
    line = _usage_error(_run_server(module, env={"LOG_LEVEL": "loud"}), module)
    assert "LOG_LEVEL='loud'" in line and "critical, error, warning, info, debug, trace" in line, line
    line = _usage_error(_run_server(module, "--log-level", "loud"), module)
    assert "--log-level" in line and "'loud'" in line and "LOG_LEVEL=" not in line, line
    assert _run_server(module, "--log-level", "DEBUG", "--help").returncode == 0  # any case is a level
    assert _run_server(module, "--log-level", "WARN", "--help").returncode == 0  # as Python's logging takes it


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena"])
@pytest.mark.parametrize("replicas", ["0", "-2", "two"])
def test_a_replica_count_below_one_is_a_usage_error(module: str, replicas: str) -> None:
    line = _usage_error(_run_server(module, "--replicas", replicas), module)
    assert "--replicas" in line and replicas in line, line


_EXIT_SCRIPT = """
import atexit, sys
seen = {}
# Registered first, so it runs last: after every exit handler the pools registered.
atexit.register(lambda: print("stopped", seen["boards"]._stopped, seen["games"]._stopped, flush=True))
from servers.sudoku.environment import default_board_pool
from servers.textarena.pool import default_game_pool
seen["boards"], seen["games"] = default_board_pool(), default_game_pool()
board = seen["boards"].board("Sudoku-v0", 3, timeout_s=60)
assert len(board.puzzle) == 9
print("generated", flush=True)
"""


def test_the_process_wide_game_pools_stop_their_workers_when_the_interpreter_exits() -> None:
    """A default pool left running at exit could spawn a replacement worker while the
    interpreter finalises (the child then dies reading its start-up data: an EOFError
    traceback on the parent's stderr); each default pool stops itself at exit."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT], cwd=Path(__file__).resolve().parents[2],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["generated", "stopped", "True", "True"], (done.stdout, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


_THREAD_START_SCRIPT = """
import os, signal, threading, time
from servers.textarena.pool import WorkerPool

pool = WorkerPool(workers=2)
started = threading.Thread(target=pool.warm)  # a server's startup runs in a thread of its own
started.start()
started.join()
pids = [worker.process.pid for worker in pool._pool]
# Ctrl-C at a terminal, or SIGTERM to the process group (`kill -TERM -PGID`, a job runner),
# reaches every process of it: here each worker, while it still imports its start-up code,
# again and again for a second.
until = time.monotonic() + 1.0
while time.monotonic() < until:
    for pid in pids:
        os.kill(pid, getattr(signal, os.environ["SIGNAL"]))
    time.sleep(0.02)
print(pool.generate("k", "kind", os.getpid, timeout_s=60) != os.getpid(), flush=True)
print(sorted(w.process.pid for w in pool._pool if w.process.is_alive()) == sorted(pids), flush=True)
pool.shutdown()
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_workers_started_from_any_thread_ignore_ctrl_c_from_their_first_instruction(signame: str) -> None:
    """A server starts its game workers in its own thread (an embedded server, a replacement
    worker): they must not die of a Ctrl-C or a SIGTERM meant for the parent's process group
    while they start or run (a KeyboardInterrupt traceback from the worker's start-up imports, a
    worker lost, and the server's 'game worker process died' traceback mid-step); the parent
    stops them (it kills them) as it stops itself."""
    done = subprocess.run(
        [sys.executable, "-c", _THREAD_START_SCRIPT], cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "SIGNAL": signame},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"], (done.stdout, done.stderr[-3000:])
    assert "KeyboardInterrupt" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize(("module", "flag", "variable"), [
    ("servers.sudoku", "--board-workers", "SUDOKU_BOARD_WORKERS"),
    ("servers.textarena", "--game-workers", "TEXTARENA_GAME_WORKERS"),
])
def test_a_worker_count_past_the_bound_is_refused_before_any_worker_starts(module: str, flag: str, variable: str) -> None:
    """--board-workers 100000 started 100000 interpreters (tens of MB each) with the server, and a
    SIGTERM meanwhile waited for them all."""
    line = _usage_error(_run_server(module, flag, "100000"), module)
    assert flag in line and "100000" in line and "64" in line, line
    line = _usage_error(_run_server(module, env={variable: "65"}), module)
    assert flag in line and "65" in line, line


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena", "servers.coding"])
@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_a_port_past_the_port_range_is_a_usage_error(module: str, port: str) -> None:
    """--port 70000 got as far as the bind: an OverflowError traceback, exit 1."""
    line = _usage_error(_run_server(module, "--port", port), module)
    assert "--port" in line and port in line and "0-65535" in line, line


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena"])
def test_replicas_whose_ports_would_pass_65535_are_refused_in_one_line(module: str) -> None:
    """--replicas 2 --port 65535 (the second on 65536) was an OverflowError traceback from the
    supervisor's port check."""
    done = _run_server(module, "--replicas", "2", "--port", "65535")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--replicas 2" in lines[0] and "--port 65535" in lines[0] and "65536" in lines[0], lines[0]


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena"])
def test_a_replica_count_past_the_bound_is_a_usage_error(module: str) -> None:
    """--replicas 100000 (each a server process) reached the port check's traceback; within the
    port range it would have started that many servers."""
    line = _usage_error(_run_server(module, "--replicas", "100000"), module)
    assert "--replicas" in line and "100000" in line and "64" in line, line
    line = _usage_error(_run_server(module, "--replicas", "65", "--port", "18800"), module)
    assert "--replicas" in line and "65" in line, line


@pytest.mark.parametrize(("flags", "env", "needles"), [
    (["--warm", "-1"], {}, ["--warm", "-1"]),
    ([], {"SANDBOX_WARM": "abc"}, ["--warm", "abc"]),
    (["--warm", "17"], {}, ["--warm 17", "--max-concurrent-envs 16"]),
    (["--warm", "9", "--max-concurrent-envs", "8"], {}, ["--warm 9", "--max-concurrent-envs 8"]),
])
def test_a_warm_sandbox_count_outside_zero_to_the_session_bound_is_a_usage_error(
    flags: list[str], env: dict[str, str], needles: list[str]
) -> None:
    """--warm -1 and SANDBOX_WARM=abc were tracebacks (the second before --help could be read);
    --warm 100000 would have started that many sandbox processes, about 20 MB each, where no
    more than --max-concurrent-envs can ever be taken at once."""
    line = _usage_error(_run_server("servers.coding", "--sandbox", "process", *flags, env=env), "servers.coding")
    assert all(n in line for n in needles), line


@pytest.mark.parametrize("module", ["servers.sudoku", "servers.textarena", "servers.coding"])
@pytest.mark.parametrize(("variable", "value"), [
    ("ENVSDK_WEB", "maybe"),
    ("ENVSDK_MAX_BODY_BYTES", "lots"),
    ("ENVSDK_LANE_WAIT_S", "-1"),
])
def test_a_bad_server_variable_is_a_usage_error_naming_it(module: str, variable: str, value: str) -> None:
    """ENVSDK_WEB=maybe (the Sudoku README's switch for the page) started the game workers, then
    ended in a ServerEnvironmentError or pydantic ValidationError traceback, exit 1."""
    line = _usage_error(_run_server(module, env={variable: value}), module)
    assert variable in line and value in line, line


@pytest.mark.parametrize(("env_id", "needle"), [
    ("GuessWho-v0", "OPENROUTER_API_KEY"),  # its constructor asks for an API key
    ("UsedCarNegotiation-v0", "blue_book.txt"),  # textarena 0.7.4's wheel lacks its data file
])
def test_a_game_that_cannot_be_built_here_is_refused_at_start_in_one_line(env_id: str, needle: str) -> None:
    """TEXTARENA_ENV_ID=GuessWho-v0 (no OPENROUTER_API_KEY) or UsedCarNegotiation-v0 ended in a
    ValueError / FileNotFoundError traceback, exit 1: only missing NLTK data was refused in one
    line."""
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "servers.textarena", "--port", str(free_port())],
        cwd=_REPO, env={**env, "TEXTARENA_ENV_ID": env_id}, capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    err = done.stderr.strip()
    assert "\n" not in err and err.startswith(f"error: {env_id} is unavailable"), err
    assert needle in err, err
