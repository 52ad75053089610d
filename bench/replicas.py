"""Sudoku rollout throughput with 1, 2 and 4 server replicas on one machine (not a test).

    .venv/bin/python bench/replicas.py [--replicas 1 2 4] [--episodes 128] [--concurrency 32]

For each replica count N: ``python -m servers.sudoku --replicas N --replicas-file F`` starts N
server processes (one board worker each), and `envsdk.rollout.run_rollouts` plays Sudoku-v0
with the oracle policy through one `EnvPool` reading F (the full client path: SudokuScheduler,
EnvClient, compact observations). A warm-up batch runs first; the timed batch reports
episodes/s, steps/s, how the episodes were spread over the replicas, and the CPU time per
episode spent in this process (client, scheduler, oracle policy) and in the replica processes
(from /proc; Linux only; board worker processes not included). The client, the policy and the
scheduler run in this one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envsdk.policies import SudokuOraclePolicy
from envsdk.rollout import run_rollouts
from envsdk.server.replicas import ReplicaStartError, replica_ports
from envsdk.testing import free_port


@dataclass(frozen=True)
class Row:
    replicas: int
    episodes: int
    steps: int
    elapsed_s: float
    successes: int
    spread: list[int]
    client_cpu_s: float
    server_cpu_s: float

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.elapsed_s

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s


def _consecutive_free_ports(n: int) -> int:
    """A first port such that it and the next n-1 are free (the Sudoku CLI's --replicas uses
    consecutive ports)."""
    for _ in range(50):
        first = free_port()
        if first + n < 65536:
            try:
                replica_ports(n, first_port=first)
            except ReplicaStartError:
                continue
            return first
    raise RuntimeError(f"found no {n} consecutive free ports")


@contextmanager
def sudoku_replicas(n: int, workdir: Path) -> Iterator[Path]:
    """``python -m servers.sudoku --replicas n``; yield the replicas file; SIGTERM at the end."""
    urls_file = workdir / f"replicas-{n}.json"
    cmd = [
        sys.executable, "-m", "servers.sudoku", "--replicas", str(n), "--replicas-file", str(urls_file),
        "--port", str(_consecutive_free_ports(n)), "--board-workers", "1", "--log-level", "warning",
        "--max-concurrent-envs", "256",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not urls_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the replicas did not start: {' '.join(cmd)}")
            time.sleep(0.2)
        yield urls_file
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(urls_file: Path, n: int, episodes: int, concurrency: int, seed: int) -> Row:
    policy = SudokuOraclePolicy()
    common = {"concurrency": concurrency, "base_url": str(urls_file), "progress": False}
    await run_rollouts("sudoku", policy, episodes=max(8, concurrency), seed=seed + 10_000, **common)  # warm-up
    described = json.loads(urls_file.read_text())
    pids = [r["pid"] for r in described["replicas"]]
    server_before, client_before = sum(map(_cpu_seconds, pids)), time.process_time()
    report = await run_rollouts("sudoku", policy, episodes=episodes, seed=seed, **common)
    server_cpu, client_cpu = sum(map(_cpu_seconds, pids)) - server_before, time.process_time() - client_before
    placed = Counter(t.runtime.base_url for t in report.trajectories if t.runtime is not None)
    summary = report.summary
    return Row(
        n, summary.episodes, summary.steps, summary.elapsed_s, summary.successes,
        [placed[u] for u in described["base_urls"]], client_cpu, server_cpu,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.replicas:
            with sudoku_replicas(n, Path(tmp)) as urls_file:
                row = asyncio.run(measure(urls_file, n, args.episodes, args.concurrency, args.seed))
            rows.append(row)
            print(
                f"replicas={n}: {row.episodes_per_s:.1f} episodes/s, {row.steps_per_s:.0f} steps/s, "
                f"{row.successes}/{row.episodes} solved, episodes per replica {row.spread}; CPU per "
                f"episode: client {1000 * row.client_cpu_s / row.episodes:.1f} ms, servers "
                f"{1000 * row.server_cpu_s / row.episodes:.1f} ms",
                flush=True,
            )
    print(f"\nmachine: {os.cpu_count()} CPUs; {args.episodes} episodes, concurrency {args.concurrency}\n")
    print(
        "| replicas | episodes/s | steps/s | per replica (episodes/s) | episodes per replica "
        "| client CPU ms/episode | server CPU ms/episode (all replicas) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.replicas} | {row.episodes_per_s:.1f} | {row.steps_per_s:,.0f} | "
            f"{row.episodes_per_s / row.replicas:.1f} | {', '.join(map(str, row.spread))} | "
            f"{1000 * row.client_cpu_s / row.episodes:.1f} | {1000 * row.server_cpu_s / row.episodes:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
