"""TextArena server benchmark (not a test): concurrent sessions stepping a game with random draws.

    .venv/bin/python -m bench.textarena_bench [--game 2048-v0] [--sessions 8 64] [--steps 50]

The server runs in this process (uvicorn on 127.0.0.1, two game workers); each session resets
with one of eight seeds and plays up to `--steps` random moves in the compact form, one request
at a time. Reported per concurrency: wall time, steps per second, step latency p50/p99. The
first line includes starting the worker processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import websockets

from envsdk.testing import running_server
from servers.textarena import create_textarena_app
from servers.textarena.pool import GamePool

MOVES = {"2048-v0": ["[Up]", "[Down]", "[Left]", "[Right]"], "Blackjack-v0": ["[Hit]", "[Stand]"]}


async def _session(url: str, game: str, index: int, steps: int, latencies: list[float]) -> None:
    async with websockets.connect(url, max_size=None) as ws:
        reset = {"env_id": game, "seed": index % 8, "observation_form": "compact"}
        await ws.send(json.dumps({"type": "reset", "data": reset}))
        await ws.recv()
        rng = random.Random(index)
        for _ in range(steps):
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "step", "data": {"message": rng.choice(MOVES[game])}}))
            reply = json.loads(await ws.recv())
            latencies.append(time.perf_counter() - start)
            if reply["type"] != "observation" or reply["data"]["done"]:
                break


async def _run(url: str, game: str, sessions: int, steps: int) -> None:
    latencies: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(*(_session(url, game, i, steps, latencies) for i in range(sessions)))
    wall = time.perf_counter() - start
    latencies.sort()
    print(
        f"{game} {sessions} sessions: wall {wall:.2f} s, {len(latencies)} steps, "
        f"{len(latencies) / wall:.0f} steps/s, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="2048-v0", choices=sorted(MOVES))
    parser.add_argument("--sessions", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    pool = GamePool(workers=2)
    try:
        app = create_textarena_app(args.game, game_pool=pool, max_concurrent_envs=max(args.sessions))
        with running_server(app) as base:
            url = base.replace("http://", "ws://") + "/ws"
            for sessions in args.sessions:
                asyncio.run(_run(url, args.game, sessions, args.steps))
    finally:
        pool.shutdown()


if __name__ == "__main__":
    main()
