"""What the evaluation harness costs per episode, against a bare loop over the same env client.

    .venv/bin/python -m bench.eval_overhead [--episodes 128] [--concurrency 64] [--rounds 5] [--no-freeze]
        [--arms bare,bare_text,scheduler,harness[,harness_kept]]

One Sudoku server (``python -m servers.sudoku``, its own process) serves both arms, which take
turns round by round on the same seeds, `--concurrency` episodes at a time, the oracle playing:

* **bare**: per episode an `EnvClient` resets (compact observation, shaped rubric: what the
  scheduler asks for) and steps the oracle's move until the game ends — nothing else;
* **scheduler**: the same episodes through `run_batches` alone (the Sudoku scheduler and the
  oracle reading the board from the model's text), no records, no run file, no summary;
* **harness**: what ``envsdk rollout --rollouts-per-example 1`` runs after its pre-flight: the
  options parsed, `plan_run` tagging every rollout and writing the run file, the Sudoku
  scheduler (hints, shaped reward parts, messages), each record written to
  ``completions.jsonl``, and the pass@k summary (`finish_run`, given what the writer wrote).
  Its records are lean, so its steps let their observations go as it plays;
* **harness_kept** (only when named in ``--arms``): the same, with the scheduler given to
  `run_batches` by the caller, so that every step keeps its observation until the record is
  written (what the harness did before it let them go).

Reported per arm: wall time per episode (the batch's wall time over its episodes: what the
harness adds to a run), each episode's own latency (p50, p99), and CPU time per episode in
this process (client, scheduler, policy, records) and in the server process, and the garbage
collector's passes and time per episode in this process (part of its CPU time). The overhead is
the harness's wall time per episode over the bare loop's (median over the rounds' ratios, with a
95% bootstrap interval for that median: rounds on a shared machine swing by ±20%), and, less
sensitive to other load on a shared machine, the extra CPU each arm spends per episode over the
bare loop's whole CPU per episode (client + server). The server does the same work in every
arm, so its CPU time is taken as the arms' mean (how far the arms' own figures for it lie apart
is printed: the machine's noise on a CPU-time figure). Harness minus scheduler is what the
evaluation layer itself (tagging, records, run file, pass@k summary) costs. For a figure without
that noise, `bench.eval_instructions` counts the instructions of the same arms. The arms take turns
going first, round by round, and every round's boards are generated before any arm plays
(the server keeps them), so no arm pays for generation.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx

from bench.replicas import _cpu_seconds
from envsdk.client import EnvClient
from envsdk.evaluate import finish_run, plan_run
from envsdk.games.sudoku import parse_move
from envsdk.policies import SudokuOraclePolicy
from envsdk.records import quantile
from envsdk.rollout import Batch, _set_up_collector, add_rollout_parser, make_requests, make_scheduler, run_batches
from envsdk.schedulers import SudokuScheduler
from envsdk.testing import free_port, stop_process


async def bare_episode(
    url: str, seed: int, policy: SudokuOraclePolicy, gate: asyncio.Semaphore, render: Callable[[Any], str] | None
) -> tuple[float, int]:
    """One game through the client alone; (seconds, steps). With `render`, each observation is
    drawn as the text a model reads (board and hints) and the oracle reads the board back from it,
    as it does under the scheduler; else the oracle gets the structured board."""
    async with gate:
        started = time.perf_counter()
        steps = 0
        async with EnvClient(url) as env:
            result = await env.reset(seed=seed, observation_form="compact", rubric="shaped")
            while not result.done:
                observation: Any = result.observation
                if render is not None:
                    message = {"role": "user", "content": render(observation)}
                else:
                    message = {"role": "user", "content": "", "board": observation["board"]}
                reply = await policy.act([message])
                move = parse_move(reply)
                if move is None:
                    raise RuntimeError(f"the oracle gave no move: {reply!r}")
                result = await env.step({"message": f"[{move[0]} {move[1]} {move[2]}]"})
                steps += 1
        return time.perf_counter() - started, steps


async def warm_boards(url: str, seeds: list[int], concurrency: int) -> None:
    """Reset once on every seed (nothing measured), so the server holds their boards."""
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> None:
        async with gate, EnvClient(url) as env:
            await env.reset(seed=seed, observation_form="compact", rubric="shaped")

    await asyncio.gather(*(one(s) for s in seeds))


async def bare_round(
    url: str, episodes: int, seed: int, concurrency: int, text: bool = False
) -> tuple[float, list[float], int]:
    gate = asyncio.Semaphore(concurrency)
    policy = SudokuOraclePolicy()
    render = SudokuScheduler().format_observation if text else None
    started = time.perf_counter()
    done = await asyncio.gather(*(bare_episode(url, seed + i, policy, gate, render) for i in range(episodes)))
    return time.perf_counter() - started, [s for s, _ in done], sum(n for _, n in done)


async def harness_round(
    url: str, episodes: int, seed: int, concurrency: int, out: Path, keep_observations: bool = False
) -> tuple[float, list[float], int]:
    parser = argparse.ArgumentParser(prog="envsdk")
    add_rollout_parser(parser.add_subparsers(dest="command"))
    argv = ["rollout", "--env", "sudoku", "--base-url", url, "--policy", "oracle", "--episodes", str(episodes),
            "--seed", str(seed), "--concurrency", str(concurrency), "--out", str(out), "--no-progress"]
    started = time.perf_counter()
    args = parser.parse_args(argv)
    args.command_line = argv
    batch = Batch("sudoku", make_requests("sudoku", episodes, seed, url), SudokuOraclePolicy(), url)
    plan = plan_run(args, [batch])
    plan.start()
    # A scheduler of the caller's own is left as given: it keeps every step's observation.
    given = make_scheduler("sudoku", base_url=url, concurrency=concurrency) if keep_observations else None
    report = await run_batches(
        [batch], concurrency=concurrency, out=out, progress=False, append=plan.append, max_turns=None, release=True,
        scheduler=given,
    )
    if finish_run(out, report.written) is None:
        raise RuntimeError("no records were written")
    elapsed = time.perf_counter() - started
    bad = [t for t in report.trajectories if t.status != "done"]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes did not finish: {bad[0].reason}")
    # Released once written, as `envsdk rollout` does: the steps are counted in the facts.
    return elapsed, [t.timings["total_s"] for t in report.trajectories], sum(f.steps for f in report.facts)


async def scheduler_round(url: str, episodes: int, seed: int, concurrency: int) -> tuple[float, list[float], int]:
    batch = Batch("sudoku", make_requests("sudoku", episodes, seed, url), SudokuOraclePolicy(), url)
    started = time.perf_counter()
    report = await run_batches([batch], concurrency=concurrency, progress=False)
    elapsed = time.perf_counter() - started
    return elapsed, [t.timings["total_s"] for t in report.trajectories], sum(len(t.steps) for t in report.trajectories)


class CollectorTime:
    """The garbage collector's passes in this process and the time they took, while in its
    `with` block (through `gc.callbacks`): part of each arm's CPU time, and the part that
    `envsdk rollout`'s collector set-up cuts."""

    def __init__(self) -> None:
        self.passes = 0
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.passes += 1
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def median_interval(values: list[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval for the median of `values` (rounds' ratios): how far
    the median could lie from where this run put it, given the rounds' own spread."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _row(name: str, walls: list[float], latencies: list[float], episodes: int, steps: int) -> str:
    per_episode = statistics.median(walls) / episodes * 1000
    return (f"| {name} | {per_episode:.2f} ms | {quantile(latencies, 0.5) * 1000:.0f} ms | "
            f"{quantile(latencies, 0.99) * 1000:.0f} ms | {steps / episodes:.1f} |")


def play_round(
    arm: str, url: str, episodes: int, seed: int, concurrency: int, out: Path
) -> tuple[float, list[float], int]:
    """One round of an arm (`out`: the harness's records); (seconds, episode latencies, steps)."""
    if arm in ("bare", "bare_text"):
        return asyncio.run(bare_round(url, episodes, seed, concurrency, text=arm == "bare_text"))
    if arm == "scheduler":
        return asyncio.run(scheduler_round(url, episodes, seed, concurrency))
    return asyncio.run(harness_round(url, episodes, seed, concurrency, out, keep_observations=arm == "harness_kept"))


def start_server(concurrency: int) -> tuple[subprocess.Popen[bytes], str]:
    """A Sudoku server in its own process, once its /health answers; (process, base URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "servers.sudoku", "--port", str(port), "--max-concurrent-envs", str(2 * concurrency)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            stop_process(server)
            raise SystemExit("the Sudoku server did not start")
        time.sleep(0.2)


ARMS = ("bare", "bare_text", "scheduler", "harness")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-freeze", action="store_true",
                        help="leave the collector as CPython sets it: walking the whole heap, young passes every"
                        " 700 objects (what `envsdk rollout`'s set-up saves)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"the arms to play, comma-separated, among {', '.join(ARMS + ('harness_kept',))};"
                        " bare, bare_text and harness are always played")
    opts = parser.parse_args()
    arms = tuple(dict.fromkeys(("bare", "bare_text", *opts.arms.split(","), "harness")))
    unknown = [a for a in arms if a not in (*ARMS, "harness_kept")]
    if unknown:
        parser.error(f"unknown arm(s): {', '.join(unknown)}")
    server, url = start_server(opts.concurrency)
    try:
        # As `envsdk rollout` does before its episodes (its `_set_up_collector`), for every arm alike:
        # they share this process, so the heap the collector walks is the same for all of them.
        if not opts.no_freeze:
            _set_up_collector()
        results: dict[str, tuple[list[float], list[float], int]] = {name: ([], [], 0) for name in arms}
        ratios: list[float] = []
        text_ratios: list[float] = []
        cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}  # (this process, server) per round
        collector = {name: CollectorTime() for name in arms}
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(bare_round(url, opts.concurrency, 10_000, opts.concurrency))  # warm-up
            # The server generates each seed's board once (TextArena, in its worker processes) and
            # keeps it: generate every round's boards now, or the arm that goes first in a round
            # pays for them.
            asyncio.run(warm_boards(url, [1000 * r + i for r in range(opts.rounds) for i in range(opts.episodes)],
                                    opts.concurrency))
            for r in range(opts.rounds):
                seed = 1000 * r
                measured = {}
                # Each arm goes first in turn: the arm after another one finds the server warmer
                # (or busier), so a fixed order would favour one side.
                for name in arms[r % len(arms):] + arms[:r % len(arms)]:
                    mark = (time.process_time(), _cpu_seconds(server.pid))
                    out = Path(folder) / f"{name}{r}.jsonl"
                    with collector[name]:
                        measured[name] = play_round(name, url, opts.episodes, seed, opts.concurrency, out)
                    cpu[name].append((time.process_time() - mark[0], _cpu_seconds(server.pid) - mark[1]))
                bare, text, harness = measured["bare"], measured["bare_text"], measured["harness"]
                for name, (wall, lat, steps) in measured.items():
                    walls, lats, total = results[name]
                    walls.append(wall)
                    lats.extend(lat)
                    results[name] = (walls, lats, total + steps)
                ratios.append(harness[0] / bare[0] - 1)
                text_ratios.append(harness[0] / text[0] - 1)
                print(f"round {r}: bare {bare[0]:.2f} s, bare_text {text[0]:.2f} s, harness {harness[0]:.2f} s "
                      f"({ratios[-1]:+.1%}, {text_ratios[-1]:+.1%})", file=sys.stderr)
    finally:
        stop_process(server)
    n = opts.episodes
    print(f"{opts.rounds} rounds x {n} Sudoku-v0 oracle episodes, {opts.concurrency} at a time\n")
    print("| arm | wall time per episode (median round) | episode latency p50 | p99 | steps per episode "
          "| CPU per episode: this process | server | collector per episode: passes | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    per_episode_cpu = {
        name: (sum(c for c, _ in rounds) / (n * opts.rounds), sum(s for _, s in rounds) / (n * opts.rounds))
        for name, rounds in cpu.items()
    }
    for name, (walls, lats, steps) in results.items():
        mine, server_cpu = per_episode_cpu[name]
        passes, gc_seconds = collector[name].passes / (n * opts.rounds), collector[name].seconds / (n * opts.rounds)
        print(_row(name, walls, lats, n, steps // opts.rounds) + f" {mine * 1000:.2f} ms | {server_cpu * 1000:.2f} ms |"
              f" {passes:.2f} | {gc_seconds * 1000:.2f} ms |")
    print()
    for over, values in (("bare", ratios), ("bare_text", text_ratios)):
        low, high = median_interval(values)
        print(f"harness over {over}, wall time: {statistics.median(values):+.1%}, 95% interval of that median "
              f"{low:+.1%} to {high:+.1%} (rounds: {', '.join(f'{x:+.1%}' for x in values)})")
    # The server does the same work in every arm (the same seeds and moves): the spread of its CPU
    # time between arms is this machine's noise, so every loop is given the arms' mean server time.
    served = [server_cpu for _, server_cpu in per_episode_cpu.values()]
    server_mean = statistics.fmean(served)
    print(f"server CPU per episode, the same work in every arm: {min(served) * 1000:.2f} to {max(served) * 1000:.2f} ms "
          f"(this machine's noise); each loop below is given their mean, {server_mean * 1000:.2f} ms")
    pairs = (("bare_text", "bare"), ("scheduler", "bare"), ("harness", "bare"), ("scheduler", "bare_text"),
             ("harness", "bare_text"), ("harness", "scheduler"), ("harness_kept", "bare_text"),
             ("harness", "harness_kept"))
    for name, over in (pair for pair in pairs if set(pair) <= set(arms)):
        extra = per_episode_cpu[name][0] - per_episode_cpu[over][0]
        loop = over if over.startswith("bare") else "bare"
        base = per_episode_cpu[loop][0] + server_mean
        print(f"CPU, {name} over {over}: {extra * 1000:+.2f} ms per episode = {extra / base:+.1%} of the {loop} "
              f"loop's {base * 1000:.2f} ms (its client + the server)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
