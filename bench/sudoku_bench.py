"""Sudoku server benchmarks (not tests): hard-reset isolation and full games per second.

    .venv/bin/python bench/sudoku_bench.py [--seconds 8] [--clients 8]

Each server runs in its own process (uvicorn on 127.0.0.1), the clients in this one, speaking
raw WebSocket frames. Two measurements:

1. isolation: 16 sessions play Sudoku-v0 (solver moves, one step at a time) while 4 other
   sessions on the *same server* keep resetting ``Sudoku-v0-hard`` (reset option ``env_id``,
   fresh seeds, so nothing is cached); the 16 sessions' step latency p50/p99 is reported, with a
   baseline run without the hard resets.
2. throughput: `--clients` concurrent clients play full solver-driven Sudoku-v0 games (reset
   with a fresh seed, read the board from the observation text, solve, send every move) against
   this server (cumulative and compact forms) and against the OpenEnv-style server (openenv's
   create_app serving the same TextArena game the OpenEnv way); games/s and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import websockets

from envsdk.games.sudoku import parse_board, solve
from envsdk.testing import free_port, stop_process, wait_healthy

_SEEDS = itertools.count(1_000_000)


@contextmanager
def server_process(kind: str, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Start a server subprocess ("envsdk" or "openenv"); yield its ws:// URL; stop it."""
    port = free_port()
    if kind == "envsdk":
        cmd = [sys.executable, "-m", "servers.sudoku", "--port", str(port), "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "--host", "127.0.0.1", "--port",
               str(port), "--log-level", "warning", "--ws-max-size", str(100 * 2**20),
               "servers.sudoku.openenv_style:create_openenv_style_app"]
    env = {**os.environ, "MAX_CONCURRENT_ENVS": "64", **(extra_env or {})}
    proc = subprocess.Popen(cmd, env=env)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", 60, f"{kind} server")
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        stop_process(proc, 15)


async def call(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(frame))
    reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=120))
    if reply["type"] == "error":
        raise RuntimeError(reply["data"])
    return reply


def board_from_text(observation: dict[str, Any]) -> list[list[int]]:
    text = "\n".join(m["content"] for m in observation["messages"])
    board = parse_board(text)
    assert board is not None, "no board in the observation text"
    return board


async def play_games(url: str, until: float, reset_data: dict[str, Any],
                     latencies: list[float] | None = None) -> int:
    """Play full games until `until`; return how many finished. Step latencies are recorded."""
    games = 0
    async with websockets.connect(url, max_size=None) as ws:
        while time.monotonic() < until:
            reply = await call(ws, {"type": "reset", "data": {"seed": next(_SEEDS), **reset_data}})
            board = board_from_text(reply["data"]["observation"])
            solution = solve(board)
            assert solution is not None
            for r in range(9):
                for c in range(9):
                    if board[r][c]:
                        continue
                    start = time.perf_counter()
                    reply = await call(ws, {"type": "step",
                                            "data": {"message": f"[{r + 1} {c + 1} {solution[r][c]}]"}})
                    if latencies is not None:
                        latencies.append(time.perf_counter() - start)
            assert reply["data"]["done"] and reply["data"]["reward"] == 1.0
            games += 1
    return games


async def reset_hard_forever(url: str, until: float, durations: list[float]) -> None:
    async with websockets.connect(url, max_size=None) as ws:
        while time.monotonic() < until:
            start = time.perf_counter()
            await call(ws, {"type": "reset", "data": {"seed": next(_SEEDS), "env_id": "Sudoku-v0-hard",
                                                      "observation_form": "compact"}})
            durations.append(time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def isolation(url: str, seconds: float, hard: bool) -> dict[str, float]:
    until = time.monotonic() + seconds
    latencies: list[float] = []
    hard_resets: list[float] = []
    hard_tasks = [asyncio.ensure_future(reset_hard_forever(url, until, hard_resets))
                  for _ in range(4 if hard else 0)]
    await asyncio.gather(*(play_games(url, until, {"observation_form": "compact"}, latencies)
                           for _ in range(16)))
    for task in hard_tasks:  # a -hard reset can outlast the window; closing its socket ends it
        task.cancel()
    await asyncio.gather(*hard_tasks, return_exceptions=True)
    return {"steps": len(latencies), "p50_ms": 1000 * pct(latencies, 0.5),
            "p99_ms": 1000 * pct(latencies, 0.99), "max_ms": 1000 * max(latencies),
            "hard_resets": len(hard_resets), "hard_reset_p50_s": pct(hard_resets, 0.5),
            "hard_reset_max_s": max(hard_resets, default=float("nan"))}


async def throughput(url: str, seconds: float, clients: int, reset_data: dict[str, Any]) -> float:
    await play_games(url, time.monotonic() + 1.0, reset_data)  # warm-up, not counted
    start = time.monotonic()
    counts = await asyncio.gather(*(play_games(url, start + seconds, reset_data) for _ in range(clients)))
    return sum(counts) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measurement")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients for games/s")
    parser.add_argument("--board-workers", default="1",
                        help="SUDOKU_BOARD_WORKERS of the envsdk server (default 1)")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} seconds={args.seconds} clients={args.clients} "
          f"board_workers={args.board_workers}", flush=True)
    with server_process("envsdk", {"SUDOKU_BOARD_WORKERS": args.board_workers}) as url:
        asyncio.run(play_games(url, time.monotonic() + 1.0, {}))  # warm-up
        for hard in (False, True):
            r = asyncio.run(isolation(url, args.seconds, hard))
            label = "16 v0 sessions + 4 resetting -hard" if hard else "16 v0 sessions alone       "
            print(f"isolation {label}: steps={r['steps']} p50={r['p50_ms']:.1f}ms "
                  f"p99={r['p99_ms']:.1f}ms max={r['max_ms']:.1f}ms hard_resets_done={r['hard_resets']} "
                  f"(p50 {r['hard_reset_p50_s']:.2f}s, max {r['hard_reset_max_s']:.2f}s)", flush=True)
        ours = {form: asyncio.run(throughput(url, args.seconds, args.clients, {"observation_form": form}))
                for form in ("cumulative", "compact")}
    with server_process("openenv") as url:
        theirs = asyncio.run(throughput(url, args.seconds, args.clients, {}))
    for form, rate in ours.items():
        print(f"games/s envsdk {form:10s}: {rate:6.1f}   ({rate / theirs:.2f}x OpenEnv-style)")
    print(f"games/s OpenEnv-style      : {theirs:6.1f}", flush=True)


if __name__ == "__main__":
    main()
