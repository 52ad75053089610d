"""`envsdk serve` as a real subprocess, reached by the real OpenEnv client and by envsdk's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from envsdk.cli import main
from envsdk.client import OpenEnvWrapper
from envsdk.testing import free_port


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.stderr.read() if proc.stderr else ''}")
        try:
            return httpx.get(url + "/health", timeout=1).json()
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("server did not become healthy")


@pytest.mark.timeout(60)
def test_envsdk_serve_runs_an_environment_class_both_clients_can_use():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "MAX_CONCURRENT_ENVS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment",
         "--port", str(port), "--max-concurrent-envs", "3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_healthy(url, proc)
        assert health["max_sessions"] == 3
        client = GenericEnvClient(base_url=url).sync()
        try:
            assert client.reset().observation["echoed_message"] == "ready"
            assert client.step({"message": "via cli"}).observation["echoed_message"] == "via cli"
            assert client.state()["step_count"] == 1
        finally:
            client.close()
        with OpenEnvWrapper(url) as ours:
            assert ours.reset(seed=3).observation["echoed_message"] == "ready"
            assert ours.step({"message": "ours"}).reward == pytest.approx(0.4)
            assert ours.state()["step_count"] == 1
    finally:
        proc.terminate()
        try:
            _, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate(timeout=5)
    assert "Traceback" not in stderr, stderr


def test_serve_refuses_a_factory_whose_types_it_cannot_tell(capsys):
    # free_port is callable but neither an Environment class nor annotated to return one.
    assert main(["serve", "envsdk.testing:free_port"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("envsdk serve: error:") and "--action" in err


def test_serve_names_a_missing_module(capsys):
    assert main(["serve", "no_such_module_xyz:Env"]) == 2
    assert re.search("no module named .no_such_module_xyz. in ", capsys.readouterr().err)


@pytest.mark.timeout(30)
def test_serve_takes_logging_names_for_a_level_and_refuses_an_unknown_one_before_binding():
    """`serve(app, log_level="loud")` was a KeyError from inside uvicorn, and `log_level="WARN"`
    (a name Python's logging takes) the same; the command line had accepted both spellings."""
    from envsdk.server import create_app, serve
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    app = create_app(EchoEnvironment, EchoAction, EchoObservation)
    with pytest.raises(ValueError, match=r"'loud' is not a log level: use one of critical, error, warning"):
        serve(app, port=free_port(), log_level="loud")
    # A known level in another case or logging's alias gets past the check: it then serves until
    # stopped, so it is run in a child and stopped once it answers.
    port = free_port()
    code = (
        "from envsdk.server import create_app, serve\nfrom envsdk.testing import EchoAction, EchoEnvironment, EchoObservation\n"
        f"serve(create_app(EchoEnvironment, EchoAction, EchoObservation), port={port}, log_level='WARN')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert child.poll() is None, child.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
    finally:
        child.terminate()
        child.communicate(timeout=20)
