"""Game server benchmarks (not tests): games/s of the Sudoku and TextArena servers against
OpenEnv's TextArena server, and each game's step time per move length.

    .venv/bin/python -m bench.games throughput [--seconds 8] [--clients 8] [--before DIR]
    .venv/bin/python -m bench.games moves [--chars 4000 16000]

``throughput``: `--clients` concurrent clients play full solver-driven Sudoku-v0 games (see
`bench.sudoku_bench.play_games`) against, in one run, each in its own process: the Sudoku server
(``python -m servers.sudoku``), the TextArena server serving Sudoku-v0 (``python -m
servers.textarena``), both from this checkout, and OpenEnv's TextArena server (openenv's
``create_app`` serving the game the OpenEnv way, `servers.sudoku.openenv_style`). With
``--before DIR`` (a checkout of another commit, e.g. ``git worktree add DIR <commit>``) the two
envsdk servers are measured from that checkout as well, alternating with this one's, so the
cost of a change (here: game code moved from the event loop to the sessions' lanes) is read
from one run. Each server is measured `--rounds` times; the medians are reported, of games/s
and of the serving process's CPU time per game (user + system, from /proc; the figure that
load from elsewhere on the machine disturbs least).

``moves``: every game that runs offline, reset with seed 1, then stepped once with each of a
set of move shapes known to be slow to parse (``"[" * n``, ``"[ " * n``, ...) of `--chars`
characters; the worst step time of each game is printed. This is how the per-game move caps
(`servers.textarena.environment.MAX_MOVE_CHARS`) were chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envsdk.testing import free_port, stop_process, wait_healthy

REPO = Path(__file__).resolve().parent.parent

#: Two-player games measured by ``moves`` besides the offline single-player ones.
TWO_PLAYER_GAMES = (
    "ConnectFour-v0", "TicTacToe-v0", "ColonelBlotto-v0", "LinesOfAction-v0", "Othello-v0",
    "Battleship-v0", "Nim-v0", "Snake-v0", "Stratego-v0", "WildTicTacToe-v0", "UltimateTicTacToe-v0",
    "Breakthrough-v0", "KuhnPoker-v0", "IteratedPrisonersDilemma-v0", "Poker-v0", "LiarsDice-v0",
    "SimpleNegotiation-v0", "Tak-v0",
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(kind: str, tree: Path) -> Iterator[tuple[str, int]]:
    """Start a server subprocess from checkout `tree`; yield its ws:// URL and process id
    (the serving process: game workers are its children); stop it."""
    port = free_port()
    common = ["--port", str(port), "--log-level", "warning"]
    if kind == "sudoku":
        cmd = [sys.executable, "-m", "servers.sudoku", *common]
    elif kind == "textarena":
        cmd = [sys.executable, "-m", "servers.textarena", "--env-id", "Sudoku-v0", "--game-workers", "1", *common]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning", "--ws-max-size", str(100 * 2**20),
               "servers.sudoku.openenv_style:create_openenv_style_app"]
    env = {**os.environ, "PYTHONPATH": str(tree), "MAX_CONCURRENT_ENVS": "64", "SUDOKU_BOARD_WORKERS": "1"}
    proc = subprocess.Popen(cmd, env=env, cwd=tree)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", 90, f"the {kind} server of {tree}")
        yield f"ws://127.0.0.1:{port}/ws", proc.pid
    finally:
        stop_process(proc, 15)


def run_throughput(args: argparse.Namespace) -> None:
    trees = {"after": REPO}
    if args.before:
        trees["before"] = Path(args.before).resolve()
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    print(f"cpus={os.cpu_count()} seconds={args.seconds} clients={args.clients} rounds={args.rounds}", flush=True)

    def measure(name: str, kind: str, tree: Path) -> None:
        with server(kind, tree) as (url, pid):
            rate, seconds = asyncio.run(_timed(url, pid, args))
        runs.setdefault(name, []).append(rate)
        cpu.setdefault(name, []).append(seconds)
        print(f"{name:18s} {rate:6.1f} games/s, server CPU {seconds * 1000:6.1f} ms/game", flush=True)

    for _ in range(args.rounds):
        for kind in ("sudoku", "textarena"):
            for label, tree in trees.items():
                measure(f"{kind} {label}", kind, tree)
        measure("openenv", "openenv", REPO)
    theirs = statistics.median(runs["openenv"])
    print("\nmedians (Sudoku-v0, cumulative observations, solver moves):")
    for name, rates in runs.items():
        rate = statistics.median(rates)
        print(f"  {name:18s} {rate:6.1f} games/s ({rate / theirs:.2f}x OpenEnv), "
              f"server CPU {statistics.median(cpu[name]) * 1000:6.1f} ms/game")
    if "before" in trees:
        for kind in ("sudoku", "textarena"):
            before, after = statistics.median(cpu[f"{kind} before"]), statistics.median(cpu[f"{kind} after"])
            print(f"  {kind}: server CPU per game after/before {after / before:.3f} ({100 * (after / before - 1):+.1f}%)")


async def _timed(url: str, pid: int, args: argparse.Namespace) -> tuple[float, float]:
    """Games/s over `args.seconds` and the server's CPU seconds per game meanwhile."""
    from bench.sudoku_bench import play_games

    await play_games(url, time.monotonic() + 1.0, {})  # warm-up, not counted
    used, start = cpu_seconds(pid), time.monotonic()
    counts = await asyncio.gather(*(play_games(url, start + args.seconds, {}) for _ in range(args.clients)))
    games = sum(counts)
    return games / (time.monotonic() - start), (cpu_seconds(pid) - used) / max(games, 1)


def run_moves(args: argparse.Namespace) -> None:
    import textarena as ta
    from textarena.core import Wrapper

    from servers.textarena.nltk_data import forbid_downloads
    from tests.servers.textarena_games import OFFLINE_GAMES

    forbid_downloads()
    games = {env_id: players for env_id, (players, _) in OFFLINE_GAMES.items()}
    games.update({env_id: 2 for env_id in TWO_PLAYER_GAMES})
    for n in args.chars:
        shapes = ["[" * n, "[ " * (n // 2), "[1 " * (n // 3), "a" * n, "[" + "a" * n, "] [" * (n // 3),
                  "[col " * (n // 5), " " * n, "1" * n, "[[" + "0 " * (n // 2)]
        for env_id, players in games.items():
            try:
                game = ta.make(env_id)
                game.reset(num_players=players, seed=1)
            except Exception as exc:  # a game that does not run here
                print(f"{env_id:30s} n={n}: skipped ({type(exc).__name__})", flush=True)
                continue
            while isinstance(game, Wrapper):
                game = game.env
            blob = pickle.dumps(game)
            worst = 0.0
            for move in shapes:
                fresh = pickle.loads(blob)
                started = time.perf_counter()
                try:
                    fresh.step(move)
                except Exception:  # a refusal is as good as a step here: only its time counts
                    pass
                worst = max(worst, time.perf_counter() - started)
            print(f"{env_id:30s} n={n}: worst step {worst * 1000:9.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.games", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    games = commands.add_parser("throughput", help="games/s against OpenEnv's TextArena server")
    games.add_argument("--seconds", type=float, default=8.0)
    games.add_argument("--clients", type=int, default=8)
    games.add_argument("--rounds", type=int, default=3)
    games.add_argument("--before", help="a checkout of another commit to measure alongside this one")
    moves = commands.add_parser("moves", help="each game's worst step time per move length")
    moves.add_argument("--chars", type=int, nargs="+", default=[4000, 16000])
    args = parser.parse_args()
    if args.command == "throughput":
        run_throughput(args)
    else:
        run_moves(args)


if __name__ == "__main__":
    main()
