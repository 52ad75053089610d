"""Sudoku replicas placed by a local Ray runtime (2 CPUs), one pool over them, and a replica
killed mid-run: it is replaced (new process, new URL, found by the pool) and only the episodes
that were on it end, each as an error with `SessionLostError`."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from collections import Counter
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from envsdk.client import EnvPool, PoolSettings, Retry
from envsdk.env import RolloutRequest
from envsdk.policies import SudokuOraclePolicy
from envsdk.policies.base import Message
from envsdk.ray import RayReplicas, start_replicas
from envsdk.schedulers import SudokuScheduler, Trajectory


def _rows(seeds: range) -> list[RolloutRequest]:
    return [RolloutRequest(messages=[], data_dict={"env_config": {"name": "sudoku", "seed": s}}) for s in seeds]


def _health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


def _server_of(trajectory: Trajectory) -> str:
    return str(trajectory.runtime.base_url)


class _Held(SudokuOraclePolicy):
    """The oracle, making each move only while `moving` is set."""

    def __init__(self, moving: asyncio.Event) -> None:
        super().__init__()
        self.moving = moving

    async def act(self, messages: list[Message]) -> str:
        await self.moving.wait()
        return await super().act(messages)


async def _wait_replaced(replicas: RayReplicas, index: int, old_url: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = replicas.replicas()[index]
        if status.restarts >= 1 and status.base_url is not None:
            assert status.base_url != old_url
            return status.base_url
        assert time.monotonic() < deadline, f"replica {index} was not replaced within {timeout} s: {status}"
        await asyncio.sleep(0.2)


@pytest.mark.slow  # a local Ray runtime: ~15 s to start on a busy 2-core machine, ~55 s in all
@pytest.mark.timeout(300)
async def test_ray_replicas_share_episodes_and_a_killed_one_is_replaced_without_silent_restarts(ray_runtime):
    replicas = await asyncio.to_thread(
        start_replicas,
        "servers.sudoku.app:create_sudoku_app",
        2,
        num_cpus=1,
        factory_kwargs={"max_concurrent_envs": 64},
        max_restarts=2,
        monitor_interval_s=0.3,
    )
    try:
        urls = replicas.base_urls()
        assert len(urls) == 2 and len(set(urls)) == 2
        pool = EnvPool(
            replicas,
            settings=PoolSettings(refresh_interval_s=0.5, health_interval_s=0.5, backoff_base_s=0.2),
            # A session on a dead replica is given up after ~1 s of reconnecting.
            retry=Retry(max_attempts=3, backoff_base=0.1),
        )
        scheduler = SudokuScheduler(base_url=pool, max_concurrent_envs=8)
        kill: list[asyncio.Task[int]] = []
        done: list[Trajectory] = []
        # Episodes stop before their next move while a replica is being killed, so that the
        # kill, which Ray carries out asynchronously, lands while they are in flight (an oracle
        # game is over in well under a second, the kill can take longer on a busy machine).
        moving = asyncio.Event()
        moving.set()

        async def kill_busiest() -> int:
            # Whatever happens here, the held episodes move again: a kill that fails must fail
            # the test (at `await kill[0]`), not leave every episode waiting for ever.
            try:
                await asyncio.sleep(0.5)  # every running episode is now held at its next move
                busiest = max(pool.servers(), key=lambda s: s.opened)
                index = next(r.index for r in replicas.replicas() if r.base_url == busiest.base_url)
                await asyncio.to_thread(ray.kill, replicas.actors[index], no_restart=False)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # until the process is gone
                    try:
                        await asyncio.to_thread(_health, busiest.base_url)
                    except (OSError, http.client.HTTPException):
                        # Refused, reset, or a reply cut off by the dying process (IncompleteRead).
                        break
                    await asyncio.sleep(0.1)
                return index
            finally:
                moving.set()

        def on_done(trajectory: Trajectory) -> None:
            done.append(trajectory)
            # Once a few episodes are done, others are in flight on both replicas: kill one.
            if len(done) == 6:
                moving.clear()
                kill.append(asyncio.ensure_future(kill_busiest()))

        trajectories = await scheduler.run(_rows(range(32)), _Held(moving), max_concurrency=8, on_done=on_done)
        assert kill, "the replica was never killed"
        victim = await kill[0]
        victim_url = urls[victim]

        by_status = Counter((_server_of(t), t.status, t.error_kind) for t in trajectories)
        used = {_server_of(t) for t in trajectories}
        assert set(urls) <= used, by_status  # both replicas took episodes
        for t in trajectories:
            if _server_of(t) == victim_url and t.status == "error":
                assert t.error_kind == "SessionLostError", t.reason  # lost, never resumed elsewhere
            else:
                assert (t.status, t.success) == ("done", True), (t.status, t.reason, by_status)
        lost = [t for t in trajectories if t.status == "error"]
        assert lost, f"no episode was in flight on the killed replica: {by_status}"
        assert len(lost) <= 8

        new_url = await _wait_replaced(replicas, victim, victim_url, timeout=90)
        assert _health(new_url)["status"] == "healthy"
        survivor_url = urls[1 - victim]
        assert sorted(replicas.base_urls()) == sorted([new_url, survivor_url])
        # The pool learns the new address: fresh episodes go to both live replicas again.
        again = await scheduler.run(_rows(range(100, 104)), SudokuOraclePolicy(), max_concurrency=4)
        assert [t.status for t in again] == ["done"] * 4
        assert {_server_of(t) for t in again} == {new_url, survivor_url}
    finally:
        await asyncio.to_thread(replicas.shutdown)
