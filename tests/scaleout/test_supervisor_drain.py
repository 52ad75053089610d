"""The ``--replicas`` supervisor stops as a single server does: on SIGTERM every replica drains
(its steps in flight are answered, its envs closed) before anything is killed, and a second
SIGINT stops waiting. Real supervisor and replica processes, real clients."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability.envs import CLOSE_LOG_ENV

from envsdk.client import EnvClient, Keepalive, Retry
from envsdk.errors import SessionLostError

from .test_replicas import _alive, supervisor_process

TESTS_DIR = Path(__file__).resolve().parent.parent

#: Longer than the 10 s after which the supervisor used to kill its replicas whatever they were
#: doing, well within a replica's default drain timeout (20 s).
LONG_STEP_S = 12.0


@contextlib.contextmanager
def close_logging_supervisor(
    tmp_path: Path,
) -> Iterator[tuple[subprocess.Popen[bytes], list[dict[str, Any]], Path, Path]]:
    """``envsdk serve reliability.envs:CloseLoggingEnvironment --replicas 2``, once its replicas
    serve: (the supervisor, the replicas its file lists, the file each env close writes a line
    to, the supervisor's and replicas' output). Whatever is left of them is killed on the way
    out."""
    urls_file, close_log, log = tmp_path / "urls.json", tmp_path / "closes.txt", tmp_path / "supervisor.log"
    close_log.touch()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "MAX_CONCURRENT_ENVS")},
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        CLOSE_LOG_ENV: str(close_log),
        "ENVSDK_WEB": "0",
    }
    with supervisor_process(
        urls_file, target="reliability.envs:CloseLoggingEnvironment", env=env, output=log,
    ) as (proc, replicas):
        yield proc, replicas, close_log, log


async def _stepping(replicas: list[dict[str, Any]], step_s: float) -> tuple[list[EnvClient], list[asyncio.Task[Any]]]:
    """One episode on each replica, each with a step of `step_s` seconds in flight (a client
    whose replica is gone gives up after one reconnect attempt)."""
    clients = [
        EnvClient(r["base_url"], keepalive=Keepalive.disabled(), retry=Retry(max_attempts=1)) for r in replicas
    ]
    for i, client in enumerate(clients):
        await client.reset(episode_id=f"episode-{i}")
    steps = [asyncio.ensure_future(c.step({"message": f"sleep:{step_s}"})) for c in clients]
    await asyncio.sleep(1.0)  # each step is sleeping in its replica's lane thread
    return clients, steps


@pytest.mark.timeout(120)
async def test_sigterm_lets_every_replica_answer_its_steps_in_flight_and_close_its_envs(tmp_path: Path) -> None:
    """The supervisor killed its replicas 10 s after SIGTERM: both 12 s steps were lost and
    neither env was closed, where a single server answers them within its drain timeout."""
    with close_logging_supervisor(tmp_path) as (proc, replicas, close_log, log):
        clients, steps = await _stepping(replicas, LONG_STEP_S)
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), LONG_STEP_S + 30)
        assert [getattr(r, "observation", r) for r in results] == [
            {"metadata": {"step": 1}, "echoed_message": f"sleep:{LONG_STEP_S}", "message_length": 10}
        ] * 2
        # Generous: a replica's own bound (drain 20 s, env closes 5 s) and the supervisor's margin.
        assert await asyncio.to_thread(proc.wait, 40) == 143
        assert sorted(close_log.read_text().splitlines()) == ["closed episode-0", "closed episode-1"]
        assert not [r["pid"] for r in replicas if _alive(r["pid"])]
        assert "Traceback" not in log.read_text()
        for client in clients:
            await client.close()


@pytest.mark.timeout(90)
async def test_a_second_sigint_stops_waiting_for_the_drain(tmp_path: Path) -> None:
    """A second Ctrl-C did nothing: the supervisor waited its 10 s whatever, where a server
    stops draining at once."""
    with close_logging_supervisor(tmp_path) as (proc, replicas, _, log):
        clients, steps = await _stepping(replicas, 60.0)
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(1.0)
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        status = await asyncio.to_thread(proc.wait, 40)
        # The replicas stop draining at once, and are killed a few seconds later if they have
        # not exited: bounded generously for a busy machine (before, it took 9 s).
        assert time.monotonic() - second < 7.0
        assert status == 130
        for step in steps:
            with pytest.raises(SessionLostError):
                await asyncio.wait_for(step, 30)
        assert not [r["pid"] for r in replicas if _alive(r["pid"])]
        assert "Traceback" not in log.read_text()
        for client in clients:
            await client.close()
