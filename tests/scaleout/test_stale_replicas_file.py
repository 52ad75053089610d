"""A replicas file left by a supervisor killed with SIGKILL (its replicas die with it; the file
stays) named as ``envsdk rollout --base-url FILE``: the pre-flight skipped pool specs, so every
episode waited ``acquire_timeout_s`` (60 s) for a server and ended in ``NoServerAvailableError``.
The pre-flight now reads the file: none of its servers answering is refused at once, in one
line; some of them answering plays on those, with a one-line warning."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envsdk.client.pool import PoolSettings, pools
from envsdk.preflight import PreflightError, check_env_servers
from envsdk.testing import free_port, free_ports, running_server
from tests.cli.conftest import assert_one_line_error, envsdk

from .conftest import echo_app
from .test_replicas import kill_supervisor, supervisor_process


@pytest.fixture
def stale_replicas_file(tmp_path: Path) -> Iterator[Path]:
    """A replicas file whose supervisor was killed with SIGKILL and whose replicas are gone."""
    urls_file = tmp_path / "u2.json"
    with supervisor_process(urls_file, "--port", str(free_ports(2))) as (proc, replicas):
        kill_supervisor(proc, replicas)
        assert urls_file.exists()
        yield urls_file


#: How long each episode waited for a server before the pre-flight read the file: the pool's
#: ``acquire_timeout_s`` (`PoolSettings`), which the rollout command does not change.
ACQUIRE_WAIT_S = PoolSettings().acquire_timeout_s
#: The refusal takes the command's start-up and one /health per listed server (about 1 s here):
#: half the old wait leaves a loaded machine 30 times that, and still tells the two apart.
REFUSED_WITHIN_S = 30


@pytest.mark.timeout(360)
def test_a_replicas_file_whose_servers_are_all_gone_is_refused_by_the_preflight(
    tmp_path: Path, stale_replicas_file: Path
) -> None:
    # As a server given by URL that does not answer: exit status 1, one line.
    dead = envsdk("rollout", "--env", "echo", "--base-url", f"http://127.0.0.1:{free_port()}", "--episodes", "1",
                  "--no-progress", "--out", "dead.jsonl", cwd=tmp_path, timeout=30)
    assert dead.returncode == 1 and "no environment server answers" in dead.stderr, dead.stderr

    # The command may run past the old wait (its timeout is well above it), so that a regression
    # is told by its own symptom, the wait, not cut short by the timeout.
    assert ACQUIRE_WAIT_S is not None and REFUSED_WITHIN_S < ACQUIRE_WAIT_S
    started = time.monotonic()
    result = envsdk("rollout", "--env", "echo", "--base-url", stale_replicas_file.name, "--episodes", "2",
                    "--no-progress", "--out", "out.jsonl", cwd=tmp_path, timeout=2 * ACQUIRE_WAIT_S)
    elapsed = time.monotonic() - started
    assert elapsed < REFUSED_WITHIN_S, (
        f"refused after {elapsed:.0f} s: the pre-flight refuses at once; the episodes waiting "
        f"acquire_timeout_s={ACQUIRE_WAIT_S} s for a server is the bug\n{result}"
    )
    assert result.returncode == 1, result
    assert_one_line_error(result, "envsdk rollout: error:", "u2.json", "none of the 2", "answers", "supervisor that was stopped")
    assert not (tmp_path / "out.jsonl").exists()

    # The same file named by a dataset row's env_config.base_url gets the same pre-flight.
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"env_config": {"name": "echo", "seed": s, "base_url": str(stale_replicas_file)}}) + "\n"
                for s in (1, 2)),
        encoding="utf-8",
    )
    started = time.monotonic()
    result = envsdk("rollout", "--dataset", str(rows), "--no-progress", "--out", "rows_out.jsonl", cwd=tmp_path,
                    timeout=2 * ACQUIRE_WAIT_S)
    elapsed = time.monotonic() - started
    assert elapsed < REFUSED_WITHIN_S, (
        f"refused after {elapsed:.0f} s: the pre-flight refuses at once; the episodes waiting "
        f"acquire_timeout_s={ACQUIRE_WAIT_S} s for a server is the bug\n{result}"
    )
    assert result.returncode == 1, result
    assert_one_line_error(result, "envsdk rollout: error:", "u2.json", "none of the 2")
    assert not (tmp_path / "rows_out.jsonl").exists()


@pytest.mark.timeout(120)
def test_a_replicas_file_with_some_servers_gone_plays_on_those_that_answer_with_a_warning(tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    with running_server(echo_app(8)) as alive:
        urls_file = tmp_path / "urls.json"
        urls_file.write_text(json.dumps({"base_urls": [gone, alive]}), encoding="utf-8")
        started = time.monotonic()
        result = envsdk("rollout", "--env", "echo", "--base-url", "urls.json", "--episodes", "2", "--no-progress",
                        "--out", "out.jsonl", cwd=tmp_path, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode == 0, result
    assert elapsed < 30, elapsed
    warnings = [line for line in result.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and gone in warnings[0] and "urls.json" in warnings[0], result.stderr
    assert "error" not in result.stderr.lower(), result.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines() if line.strip()]
    assert len(records) == 2


def test_the_preflight_checks_the_servers_of_a_pool_name_and_a_replicas_file(tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    urls_file = tmp_path / "urls.json"
    urls_file.write_text(json.dumps({"base_urls": [gone]}), encoding="utf-8")
    pools["gone-pool"] = [gone]
    try:
        for spec in ("gone-pool", str(urls_file)):
            with pytest.raises(PreflightError, match="none of the 1"):
                check_env_servers([spec], 1)
        empty = tmp_path / "empty.json"
        empty.write_text('{"base_urls": []}', encoding="utf-8")
        with pytest.raises(PreflightError, match="no environment server is listed"):
            check_env_servers([str(empty)], 1)
        with running_server(echo_app(2)) as alive:
            pools["gone-pool"] = [gone, alive]
            notes: list[str] = []
            check_env_servers(["gone-pool"], 2, warn=notes.append)
            assert len(notes) == 1 and gone in notes[0] and alive not in notes[0]
            # The servers that answer are counted for --concurrency.
            with pytest.raises(PreflightError, match="--concurrency is 3"):
                check_env_servers(["gone-pool"], 3, warn=notes.append)
    finally:
        del pools["gone-pool"]
