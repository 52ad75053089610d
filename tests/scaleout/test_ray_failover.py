"""A rollout over `envsdk.ray` replicas survives a replica killed mid-run: ``envsdk rollout
--base-url urls.json`` (the file the replicas' monitor keeps up to date) records every planned
episode, those lost with the dead replica once each as an error, ``--resume`` plays them again,
and Ray's replacement (a new process on a new port) takes episodes once it serves.

One local Ray runtime for the module (slow to start on a busy 2-core machine); the rollouts are
the real command in a child process, the servers real Sudoku servers in Ray actors."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from envsdk.ray import RayReplicas, start_replicas
from envsdk.rollout import CONNECTION_ERRORS

EPISODES = 48

#: The oracle with a model's latency per reply, so that episodes are in flight on both
#: replicas when one is killed (the oracle alone ends a game in well under a second).
SLOW_ORACLE = '''
import asyncio

from envsdk.policies import SudokuOraclePolicy


class SlowOracle(SudokuOraclePolicy):
    async def act(self, messages):
        await asyncio.sleep(0.1)
        return await super().act(messages)
'''


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _active_sessions(base_url: str) -> int:
    try:
        return int(json.loads(_get(f"{base_url}/health"))["active_sessions"])
    except (OSError, http.client.HTTPException):
        return -1


def _sessions_opened(base_url: str) -> int:
    line = next(x for x in _get(f"{base_url}/metrics").splitlines() if x.startswith("envsdk_sessions_opened_total "))
    return int(float(line.split()[1]))


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rollout(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "rollout", *args, "--no-progress"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output


def _kill_busiest(replicas: RayReplicas) -> tuple[int, str]:
    """Kill (as a crash would: Ray restarts it) the replica with the most sessions open; its
    index and URL once its server no longer answers."""
    live = [r for r in replicas.replicas() if r.base_url is not None]
    victim = max(live, key=lambda r: _active_sessions(str(r.base_url)))
    url = str(victim.base_url)
    ray.kill(replicas.actors[victim.index], no_restart=False)
    deadline = time.monotonic() + 60
    while _active_sessions(url) >= 0:
        assert time.monotonic() < deadline, f"the killed replica {url} still answers"
        time.sleep(0.1)
    return victim.index, url


def _replacement(replicas: RayReplicas, index: int, old_url: str, urls_file: Path, timeout: float) -> str:
    """The URL of the process Ray started in place of replica `index`, once the replicas file
    (what the rollout reads) names it."""
    deadline = time.monotonic() + timeout
    while True:
        status = replicas.replicas()[index]
        if status.restarts >= 1 and status.base_url is not None and status.base_url != old_url:
            listed = json.loads(urls_file.read_text())["base_urls"]
            if status.base_url in listed and old_url not in listed:
                return status.base_url
        assert time.monotonic() < deadline, f"replica {index} was not replaced within {timeout} s: {status}"
        time.sleep(0.2)


@pytest.mark.slow  # a local Ray runtime: ~15 s to start on a busy 2-core machine
@pytest.mark.timeout(300)
def test_a_rollout_survives_a_killed_ray_replica_and_its_resume_plays_on_the_replacement(
    ray_runtime: None, tmp_path: Path
) -> None:
    urls_file, out = tmp_path / "urls.json", tmp_path / "run" / "completions.jsonl"
    (tmp_path / "slow_oracle.py").write_text(SLOW_ORACLE)
    replicas = start_replicas(
        "servers.sudoku.app:create_sudoku_app", 2, num_cpus=1, factory_kwargs={"max_concurrent_envs": 64},
        max_restarts=2, monitor_interval_s=0.3, startup_timeout_s=120, replicas_file=urls_file,
    )
    run: subprocess.Popen[str] | None = None
    try:
        assert sorted(json.loads(urls_file.read_text())["base_urls"]) == sorted(replicas.base_urls())
        run = _rollout(
            tmp_path, "--env", "sudoku", "--base-url", str(urls_file), "--policy", "slow_oracle.py:SlowOracle",
            "--episodes", str(EPISODES), "--concurrency", "16", "--out", str(out),
        )
        deadline = time.monotonic() + 120
        while not (out.exists() and len(_records(out)) >= 4):  # under way: episodes in flight on both
            assert run.poll() is None, run.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no episode ended within 120 s"
            time.sleep(0.1)
        victim, victim_url = _kill_busiest(replicas)
        status, output = _finish(run, 180)

        records = _records(out)
        # Every planned episode ended once: played, or lost with the dead replica.
        assert sorted(r["seed"] for r in records) == list(range(EPISODES)), output[-3000:]
        # Those in flight on the killed replica were played again on the other (naming the
        # server they lost), or recorded once as errors there (which --resume plays again).
        replayed = [r for r in records if victim_url in str((r.get("infos") or {}).get("lost_attempts"))]
        lost = [r for r in records if r["status"] != "done"]
        assert replayed or lost, f"no episode was in flight on the killed replica: {output[-3000:]}"
        for record in lost:
            assert record["status"] == "error" and record["error_kind"] in CONNECTION_ERRORS, record
            assert record["server"] == victim_url, record
        assert all(r["server"] != victim_url for r in replayed), replayed
        assert status == 0, output[-3000:]

        new_url = _replacement(replicas, victim, victim_url, urls_file, timeout=90)
        resumed, output = _finish(_rollout(tmp_path, "--resume", "--out", str(out)), 180)
        assert resumed == 0, output[-3000:]
        records = _records(out)
        assert sorted(r["seed"] for r in records) == list(range(EPISODES)), output[-3000:]
        assert [r["seed"] for r in records if r["status"] != "done"] == [], output[-3000:]
        # A later run through the same replicas file plays on Ray's replacement too.
        again = tmp_path / "again" / "completions.jsonl"
        status, output = _finish(_rollout(
            tmp_path, "--env", "sudoku", "--base-url", str(urls_file), "--policy", "slow_oracle.py:SlowOracle",
            "--episodes", "16", "--concurrency", "16", "--out", str(again),
        ), 180)
        assert status == 0, output[-3000:]
        assert new_url in {r["server"] for r in _records(again)}, output[-3000:]
        assert _sessions_opened(new_url) >= 1
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.communicate()
        replicas.shutdown()
    assert not urls_file.exists()


@pytest.mark.timeout(30)
def test_a_replicas_file_that_cannot_be_written_is_refused_before_any_replica_starts(tmp_path: Path) -> None:
    """Needs no Ray runtime: the path is checked before any actor is asked for."""
    with pytest.raises(ValueError, match="does not exist"):
        start_replicas("servers.sudoku.app:create_sudoku_app", 2, replicas_file=tmp_path / "missing" / "urls.json")
    with pytest.raises(ValueError, match="is a folder"):
        start_replicas("servers.sudoku.app:create_sudoku_app", 2, replicas_file=tmp_path)
