"""What an env author sees when their code misbehaves: an exception names the env method and
its type (to the client) and leaves a bounded traceback (in the log, `--log-level debug`
included); a correct env is not warned about; an ``async def`` method that blocks the event
loop is named in the log and in /metrics."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from envsdk.client import EnvClient
from envsdk.errors import ServerError
from envsdk.server import create_app
from envsdk.testing import (
    EchoAction,
    EchoObservation,
    free_port,
    running_server,
    stop_process,
)

from .envs import BlockingAsyncEnvironment, GuessEnv, MissingKeyEnvironment

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def _server_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("envsdk.server")]


async def test_an_exception_in_env_code_names_the_method_and_type_and_logs_a_bounded_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="envsdk")
    with running_server(create_app(MissingKeyEnvironment, EchoAction, EchoObservation)) as url:
        async with EnvClient(url) as env:
            await env.reset()
            with pytest.raises(ServerError) as info:
                await env.step({"message": "missing"})
            assert info.value.code == "EXECUTION_ERROR"
            assert info.value.message == "MissingKeyEnvironment.step raised KeyError: 'missing_key'"
            with pytest.raises(ServerError) as long:
                await env.step({"message": "long"})
            assert long.value.message.startswith("MissingKeyEnvironment.step raised ValueError: xxx")
            assert len(long.value.message) < 400 and "more characters" in long.value.message
    logged = "\n".join(r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else "")
                       for r in _server_records(caplog))
    assert "Traceback (most recent call last)" in logged
    assert "self._table[\"missing_key\"]" in logged  # the env's own line, where it failed
    assert "MissingKeyEnvironment.step raised KeyError" in logged
    assert max(len(r.getMessage()) for r in _server_records(caplog)) < 2_000  # 100,000 x's not logged


def test_serve_log_level_debug_reaches_the_envsdk_loggers() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "serve", "tests.server.envs:MissingKeyEnvironment",
         "--port", str(port), "--log-level", "debug"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "the server exited during startup"
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not start within 30 s"
                time.sleep(0.1)

        async def play() -> None:
            async with EnvClient(f"http://127.0.0.1:{port}") as env:
                await env.reset()
                with pytest.raises(ServerError):
                    await env.step({"message": "missing"})

        asyncio.run(play())
    finally:
        stop_process(proc)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "session" in err and "opened" in err, err[-2000:]  # an envsdk.server DEBUG line
    assert "Traceback (most recent call last)" in err and "KeyError: 'missing_key'" in err, err[-2000:]


async def test_a_readme_shaped_env_is_not_warned_about_on_connect(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="envsdk")
    with running_server(create_app(GuessEnv, EchoAction, EchoObservation)) as url:
        for _ in range(3):
            async with EnvClient(url) as env:
                assert env.session is not None and env.session.episode_id is None
                await env.reset(episode_id="e1")
                assert (await env.step({"message": "42"})).done is True
    warnings = [r.getMessage() for r in _server_records(caplog) if r.levelno >= logging.WARNING]
    assert warnings == []
    assert not any("state" in r.getMessage() and "raised" in r.getMessage() for r in _server_records(caplog))


async def test_an_async_method_that_blocks_the_loop_is_named_in_the_log_and_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="envsdk")
    with running_server(create_app(BlockingAsyncEnvironment, EchoAction, EchoObservation)) as url:
        async with EnvClient(url) as env:
            await env.reset()
            await env.step({"message": "await:0.5"})  # awaits: holds the loop for no time
            before = (await asyncio.to_thread(httpx.get, url + "/metrics", timeout=10)).text
            assert 'envsdk_loop_stalls_total{method="BlockingAsyncEnvironment.step"}' not in before
            for _ in range(3):
                await env.step({"message": "block:0.4"})
        metrics = (await asyncio.to_thread(httpx.get, url + "/metrics", timeout=10)).text
    assert 'envsdk_loop_stalls_total{method="BlockingAsyncEnvironment.step"} 3' in metrics
    held = next(line for line in metrics.splitlines()
                if line.startswith('envsdk_loop_stall_seconds_total{method="BlockingAsyncEnvironment.step"}'))
    assert float(held.split()[-1]) >= 1.1
    stalls = [r.getMessage() for r in _server_records(caplog) if "BlockingAsyncEnvironment.step" in r.getMessage()]
    assert stalls and "event loop" in stalls[0]
    assert len(stalls) < 3  # bounded: not one line per stall
