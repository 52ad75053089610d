"""Instructions the rollout process executes per episode in each arm of `bench.eval_overhead`.

    .venv/bin/python -m bench.eval_instructions [--episodes 64] [--arms bare,bare_text,scheduler,harness] [--server]

CPU time on a shared machine moves by several percent between two runs of the same work (the
Sudoku server's CPU time for identical episodes differs that much between the arms of one
`bench.eval_overhead` run), which is as large as the harness's overhead itself. An instruction
count does not: valgrind's callgrind counts what the client process executes, the same on every
run. It needs valgrind (Debian: ``apt install valgrind``).

One Sudoku server (its own process, not counted) holds the boards of seeds 0…N-1. Each arm runs
in a child process under callgrind twice, for one round and for two rounds of `--episodes`
episodes, all at once, the oracle playing; the difference over `--episodes` is the arm's
instructions per episode, without start-up, imports and first-call caches. Instructions are not
time (a cache miss costs more than an add; system calls are not counted), and the server's
share of an episode is not in them: compare them with each other, arm against arm.

With ``--server`` the Sudoku server's own instructions are counted too (a second server, under
callgrind, serving the bare_text arm's rounds, one and two, played from this process): an
episode's whole cost is its client's and its server's, and each arm's extra is then also given
as a share of the bare_text loop's whole (client + server), the server's work being the same in
every arm (the same seeds, the same moves).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.eval_overhead import bare_round, play_round, start_server, warm_boards
from envsdk.rollout import _set_up_collector
from envsdk.testing import free_port, stop_process

ARMS = ("bare", "bare_text", "scheduler", "harness")
CHILD_TIMEOUT_S = 1800  # one arm's rounds under callgrind: about 2 minutes each on 2 cores
_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def play(arm: str, url: str, rounds: int, episodes: int) -> None:
    """The arm's rounds, as `bench.eval_overhead` plays them, on seeds 0…episodes-1."""
    _set_up_collector()  # as `envsdk rollout` and `bench.eval_overhead` do
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            play_round(arm, url, episodes, 0, episodes, Path(folder) / f"c{r}.jsonl")


def counted(arm: str, url: str, rounds: int, episodes: int) -> int:
    """Instructions of a child process playing `rounds` rounds of the arm under callgrind."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, "-m", "bench.eval_instructions", "--child", arm, url, str(rounds), str(episodes),
        ]
        # A fixed hash seed: dict and set orders, and so the work done, are the same on every run.
        done = subprocess.run(
            command, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
        if done.returncode != 0:
            raise SystemExit(f"the {arm} arm failed under callgrind:\n{done.stderr[-2000:]}")
        found = _TOTALS.search(out.read_text())
        if found is None:
            raise SystemExit(f"no instruction total in callgrind's output for the {arm} arm")
        return int(found.group(1))


# The Sudoku server, with its game's step limits raised: under callgrind a step takes about fifty
# times as long, and past 0.5 s the server stops a game step as looping.
_SLOW_SERVER = (
    "import runpy; from servers.sudoku.environment import SudokuEnvironment as E; "
    "E.step_limit_s = E.step_timeout_s = 600.0; runpy.run_module('servers.sudoku', run_name='__main__')"
)


def server_counted(rounds: int, episodes: int) -> int:
    """Instructions of a Sudoku server process (under callgrind) serving `rounds` rounds of the
    bare_text arm, after its boards are generated and one round warmed it."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", _SLOW_SERVER,
             "--port", str(port), "--max-concurrent-envs", str(2 * episodes)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0", "ENVSDK_WEB": "0"},
        )
        try:
            deadline = time.monotonic() + CHILD_TIMEOUT_S
            while True:
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the Sudoku server under callgrind did not start")
                time.sleep(1)
            asyncio.run(warm_boards(url, list(range(episodes)), episodes))
            for _ in range(1 + rounds):  # a first round fills first-call caches
                asyncio.run(bare_round(url, episodes, 0, episodes, text=True))
            server.send_signal(signal.SIGTERM)  # a graceful exit: callgrind writes its counts
            server.wait(CHILD_TIMEOUT_S)
        finally:
            stop_process(server)
        found = _TOTALS.search(out.read_text())
        if found is None:
            raise SystemExit("no instruction total in callgrind's output for the server")
        return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64, help="episodes a round, all at once")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--jobs", type=int, default=2, help="counted processes at once (the counts do not change)")
    parser.add_argument("--server", action="store_true", help="count the server's instructions too (bare_text rounds)")
    parser.add_argument("--child", nargs=4, metavar=("ARM", "URL", "ROUNDS", "EPISODES"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        arm, url, rounds, episodes = opts.child
        play(arm, url, int(rounds), int(episodes))
        return 0
    arms = opts.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; the arms are {', '.join(ARMS)}")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt install valgrind)")
    server, url = start_server(opts.episodes)
    per_episode: dict[str, float] = {}
    try:
        asyncio.run(warm_boards(url, list(range(opts.episodes)), opts.episodes))
        with ThreadPoolExecutor(max(1, opts.jobs)) as pool:
            runs = {(arm, rounds): pool.submit(counted, arm, url, rounds, opts.episodes) for arm in arms for rounds in (1, 2)}
            served = [pool.submit(server_counted, rounds, opts.episodes) for rounds in (1, 2)] if opts.server else []
            for arm in arms:
                per_episode[arm] = (runs[arm, 2].result() - runs[arm, 1].result()) / opts.episodes
                print(f"{arm}: {per_episode[arm] / 1e6:.2f} M instructions per episode", file=sys.stderr)
            server_per_episode = (served[1].result() - served[0].result()) / opts.episodes if served else None
    finally:
        stop_process(server)
    print(f"\n{opts.episodes} Sudoku-v0 oracle episodes a round, all at once; instructions of the rollout process\n")
    print("| arm | instructions per episode | over bare | over bare_text |")
    print("|---|---|---|---|")
    for arm, count in per_episode.items():
        cells = [
            f"{(count - per_episode[loop]) / 1e6:+.2f} M ({count / per_episode[loop] - 1:+.1%})" if loop in per_episode else "-"
            for loop in ("bare", "bare_text")
        ]
        print(f"| {arm} | {count / 1e6:.2f} M | {cells[0]} | {cells[1]} |")
    if server_per_episode is not None:
        print(f"\nserver: {server_per_episode / 1e6:.2f} M instructions per bare_text episode")
        if "bare_text" in per_episode:
            whole = per_episode["bare_text"] + server_per_episode
            for arm, count in per_episode.items():
                extra = count - per_episode["bare_text"]
                print(f"{arm} over bare_text: {extra / 1e6:+.2f} M = {extra / whole:+.1%} of the bare_text loop's whole "
                      f"episode ({whole / 1e6:.2f} M: its client + the server)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
