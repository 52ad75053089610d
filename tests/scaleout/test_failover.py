"""Runs over several servers that survive a bad one: a replica killed mid-run, a member of
``--base-url A B C`` that is down, a wedged replica (``/health`` answers, every step misses its
deadline), a replica whose ``/health`` hangs, and records that name the server that played them.

Real servers on 127.0.0.1 (``envsdk serve`` processes where one is killed, uvicorn threads
otherwise), the real rollout API and CLI, a scripted policy with a little latency."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.client.pool import EnvPool, PoolSettings, shared_pool
from envsdk.errors import EnvTimeoutError
from envsdk.records import check_record
from envsdk.rollout import run_rollouts
from envsdk.server import create_app
from envsdk.testing import (
    EchoAction,
    EchoEnvironment,
    EchoObservation,
    free_port,
    running_server,
    stop_process,
    wait_healthy,
)
from tests.cli.conftest import assert_one_line_error, envsdk

from .conftest import echo_app


class _Replies:
    """Says "hello" every turn, after `latency_s` (a model's think time)."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s

    async def act(self, messages: list[dict[str, Any]]) -> str:
        await asyncio.sleep(self.latency_s)
        return "hello"


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _active_sessions(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/health", timeout=2) as reply:
        return int(json.loads(reply.read())["active_sessions"])


@contextlib.contextmanager
def _served_echo_processes(count: int, tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """`count` ``envsdk serve envsdk.testing:EchoEnvironment`` processes, each on its own port."""
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for i in range(count):
            port = free_port()
            log = (tmp_path / f"serve-{i}.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment", "--port", str(port),
                 "--log-level", "warning", "--max-concurrent-envs", "32"],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
            )
            log.close()
            started.append((proc, f"http://127.0.0.1:{port}"))
        for proc, url in started:
            wait_healthy(proc, url, 60, f"envsdk serve at {url}")
        yield started
    finally:
        for proc, _ in started:
            stop_process(proc, timeout_s=5)


@pytest.mark.timeout(120)
async def test_one_replica_of_three_killed_mid_run_loses_no_episode_and_the_run_plays_on(tmp_path: Path) -> None:
    """Finding 1: the killed replica's episodes in flight (6 or so) are played again on the
    other two; the run used to stop at 5 lost episodes in a row with many episodes unplayed."""
    with _served_echo_processes(3, tmp_path) as servers:
        urls = [url for _, url in servers]
        victim, victim_url = servers[0]

        finished: list[Any] = []

        async def kill_mid_run() -> None:
            # Once the run is in its stride (a round of episodes done) and 6 of them are open
            # there: killed under episodes in flight, not between them.
            while len(finished) < 24 or await asyncio.to_thread(_active_sessions, victim_url) < 6:
                await asyncio.sleep(0.01)
            victim.send_signal(signal.SIGKILL)

        killer = asyncio.ensure_future(kill_mid_run())
        out = tmp_path / "completions.jsonl"
        try:
            report = await run_rollouts(
                "echo", _Replies(0.05), episodes=96, concurrency=24, max_turns=4, base_url=urls, out=out,
                progress=False, finished=finished,
            )
        finally:
            killer.cancel()
        assert victim.wait(5) == -signal.SIGKILL
    assert report.stopped is None
    records = _records(out)
    assert len(records) == 96 and len({r["uuid"] for r in records}) == 96  # each episode once
    assert Counter(r["status"] for r in records) == {"max_turns": 96}, Counter(r["error_kind"] for r in records)
    replayed = [r for r in records if r["infos"].get("lost_attempts")]
    assert replayed, "no episode was in flight on the killed replica"
    for record in replayed:
        (lost,) = record["infos"]["lost_attempts"]
        assert lost["server"] == victim_url and lost["error_kind"] in ("SessionLostError", "ConnectError")
        assert record["server"] in urls[1:]
    assert report.summary.replayed == {victim_url: len(replayed)}


@pytest.mark.timeout(120)
def test_base_urls_with_one_member_down_play_on_the_others_and_resume_and_none_answering_is_refused(
    tmp_path: Path, echo_servers: Any
) -> None:
    """Finding 2: ``--base-url A B C`` is a pool, checked as the pool plays it."""
    a, b = echo_servers(8, 8)
    down = f"http://127.0.0.1:{free_port()}"
    base = ["rollout", "--env", "echo", "--base-url", a, down, b, "--episodes", "6", "--max-turns", "1",
            "--no-progress", "--out", "out.jsonl"]
    played = envsdk(*base, cwd=tmp_path, timeout=60)
    assert played.returncode == 0, played
    warnings = [line for line in played.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and down in warnings[0] and "1 of the 3" in warnings[0], played.stderr
    records = _records(tmp_path / "out.jsonl")
    assert len(records) == 6 and "error" not in {r["status"] for r in records}

    # A run cut short (a rollout killed after 3 records) is resumed with the member still down.
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "out.jsonl").write_text("".join(lines[:3]), encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--out", "out.jsonl", "--no-progress", cwd=tmp_path, timeout=60)
    assert resumed.returncode == 0, resumed
    assert sum("warning" in line.lower() and down in line for line in resumed.stderr.splitlines()) == 1, resumed.stderr
    records = _records(tmp_path / "out.jsonl")
    assert len(records) == 6 and len({r["uuid"] for r in records}) == 6

    gone = f"http://127.0.0.1:{free_port()}"
    refused = envsdk("rollout", "--env", "echo", "--base-url", down, gone, "--episodes", "2", "--no-progress",
                     "--out", "none.jsonl", cwd=tmp_path, timeout=60)
    assert refused.returncode == 1, refused
    assert_one_line_error(refused, "envsdk rollout: error:", "none of the 2", down, "--base-url")
    assert not (tmp_path / "none.jsonl").exists()


class _WedgedEnvironment(EchoEnvironment):
    """Resets as the echo env does; every step hangs past the server's step deadline."""

    def step(self, action: EchoAction) -> EchoObservation:
        time.sleep(2.0)
        return super().step(action)


@pytest.mark.timeout(120)
async def test_a_wedged_replica_ends_at_most_a_quarter_of_the_episodes_and_is_ejected(
    echo_servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 3: its episodes fail fastest, so by load alone it got most of them."""
    a, b = echo_servers(16, 16)
    wedged_app = create_app(
        _WedgedEnvironment, EchoAction, EchoObservation, max_concurrent_envs=16, step_timeout_s=0.2,
        close_timeout_s=0.5,
    )
    episodes = 40
    with running_server(wedged_app) as wedged, caplog.at_level(logging.WARNING, logger="envsdk.client.pool"):
        urls = [a, wedged, b]
        # A healthy episode (8 turns of 0.05 s) outlasts a wedged one (its first step's 0.2 s).
        report = await run_rollouts(
            "echo", _Replies(0.05), episodes=episodes, concurrency=8, max_turns=8, base_url=urls, progress=False,
        )
        (view,) = [s for s in shared_pool(urls).servers() if s.base_url == wedged]
    errors = [t for t in report.trajectories if t.status == "error"]
    assert len(errors) <= episodes // 4, Counter(t.error_kind for t in errors)
    ended_there = [t for t in report.trajectories if t.server == wedged]
    assert ended_there == errors and all(t.error_kind == "EnvTimeoutError" for t in errors)
    # How it shows: the pool's view, the warning it logs, the summary's line per server.
    assert view.ejected and view.ejections >= 1 and view.episode_failures >= 3
    ejections = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"ejecting {wedged}")]
    assert ejections and "EnvTimeoutError" in ejections[0], caplog.text
    (line,) = [line for line in report.summary.render().splitlines() if line.startswith("servers")]
    assert wedged in line and "played again after their server failed them" in line, line


class _SometimesWedgedEnvironment(EchoEnvironment):
    """Every step hangs while `wedged` is set (a replica stuck for a while, then well again)."""

    wedged = threading.Event()

    def step(self, action: EchoAction) -> EchoObservation:
        if self.wedged.is_set():
            time.sleep(1.0)
        return super().step(action)


@pytest.mark.timeout(60)
async def test_an_ejected_server_gets_one_probe_episode_and_is_back_when_it_ends_well(
    echo_servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    (a,) = echo_servers(8)
    app = create_app(_SometimesWedgedEnvironment, EchoAction, EchoObservation, step_timeout_s=0.2, close_timeout_s=0.5)
    _SometimesWedgedEnvironment.wedged.set()
    settings = PoolSettings(eject_after_failures=2, ejection_base_s=0.5)

    async def one_episode(pool: EnvPool) -> str:
        async with pool.session() as env:
            await env.reset()
            with contextlib.suppress(EnvTimeoutError):
                await env.step({"message": "hello"})
            return env.base_url

    with running_server(app) as flaky, caplog.at_level(logging.WARNING, logger="envsdk.client.pool"):
        pool = EnvPool([flaky, a], settings=settings)
        placed = [await one_episode(pool) for _ in range(8)]
        assert placed.count(flaky) == 2  # two failures there in a row, then none placed there
        (view,) = [s for s in pool.servers() if s.base_url == flaky]
        assert view.ejected and view.ejections == 1 and not view.available
        _SometimesWedgedEnvironment.wedged.clear()
        await asyncio.sleep(view.ejected_in_s + 0.05)
        # On probation: one episode at a time goes there; it ends well, and the server is back.
        clients = [await pool.acquire() for _ in range(4)]
        (probe,) = [c for c in clients if c.base_url == flaky]
        others = [c for c in clients if c is not probe]
        await probe.reset()
        await probe.step({"message": "hello"})
        await probe.close()
        for client in others:
            await client.close()
        (view,) = [s for s in pool.servers() if s.base_url == flaky]
        assert (view.ejected, view.ejections, view.episode_failures, view.available) == (False, 0, 0, True)
    assert any("back in rotation" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.timeout(120)
async def test_a_run_stops_soon_once_every_server_of_its_pool_is_gone(tmp_path: Path) -> None:
    """The pool waits up to ``acquire_timeout_s`` (60 s) for a server to take an episode; a run
    whose servers are all dead stops once its lost episodes say so, not after that wait."""
    with _served_echo_processes(2, tmp_path) as servers:
        urls = [url for _, url in servers]
        finished: list[Any] = []

        async def kill_all() -> None:
            while len(finished) < 8:
                await asyncio.sleep(0.01)
            for proc, _ in servers:
                proc.send_signal(signal.SIGKILL)

        killer = asyncio.ensure_future(kill_all())
        started = time.monotonic()
        try:
            report = await run_rollouts(
                "echo", _Replies(0.05), episodes=200, concurrency=8, max_turns=4, base_url=urls,
                out=tmp_path / "out.jsonl", progress=False, finished=finished,
            )
        finally:
            killer.cancel()
        elapsed = time.monotonic() - started
    assert report.stopped is not None and "no server of its pool could play" in report.stopped, report.stopped
    assert len(report.trajectories) < 200
    assert elapsed < 40, elapsed  # the resume attempts (3 s) and a replay, not acquire_timeout_s (60 s)


def _hung_health(app: Any, hang_s: float) -> Any:
    """`app` with a ``GET /health`` that answers only after `hang_s` (its ``/ws`` as it was)."""

    async def hung(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            await asyncio.sleep(hang_s)
        await app(scope, receive, send)

    return hung


@pytest.mark.timeout(120)
async def test_a_hung_health_check_does_not_hold_up_placement(echo_servers: Any) -> None:
    """Finding 4: every placement waited for every due health poll, a hung one for its whole
    timeout. With a 10 s health timeout, 12 short episodes took over 10 s; they now take about
    a second (bound at 6 s: the margin a busy 2-core machine needs, still well below 10 s)."""
    a, b = echo_servers(8, 8)
    with running_server(_hung_health(echo_app(8), 15.0), timeout_graceful_shutdown=1) as slow:
        pool = EnvPool([slow, a, b], settings=PoolSettings(health_timeout_s=10.0, health_interval_s=0.1))
        started = time.monotonic()
        for i in range(12):
            async with pool.session() as env:
                await env.reset(seed=i)
                await env.step({"message": "hello"})
                await asyncio.sleep(0.02)
        elapsed = time.monotonic() - started
        assert elapsed < 6.0, elapsed
        assert {s.base_url: s.failures for s in pool.servers()}[a] == 0
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()  # the hung poll: its thread ends when the server goes


@pytest.mark.timeout(60)
async def test_records_name_the_server_that_played_them(echo_servers: Any, tmp_path: Path) -> None:
    """Finding 6: which server played an episode is in its record; older records, without the
    field, still read."""
    urls = echo_servers(8, 8)
    out = tmp_path / "pool.jsonl"
    await run_rollouts("echo", _Replies(), episodes=4, concurrency=4, max_turns=1, base_url=urls, out=out,
                       progress=False)
    assert Counter(r["server"] for r in _records(out)) == {urls[0]: 2, urls[1]: 2}
    single = tmp_path / "single.jsonl"
    await run_rollouts("echo", _Replies(), episodes=1, max_turns=1, base_url=urls[1], out=single, progress=False)
    (record,) = _records(single)
    assert record["server"] == urls[1]
    del record["server"]
    assert check_record(record, "an older record") is record


def test_the_ejection_settings_refuse_values_they_cannot_take() -> None:
    for bad in ({"eject_after_failures": -1}, {"ejection_base_s": 0}, {"max_ejected_fraction": 1.5},
                {"health_wait_s": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PoolSettings(**bad)
