"""An attacker's findings on ``envsdk rollout --base-url``: a lost server's resume URL (with its
secret token) in stderr and records, and malformed base URLs answered with tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.client.sync import OpenEnvWrapper
from envsdk.errors import EnvSDKError, mask_secrets
from envsdk.testing import free_port, stop_process
from tests.cli.conftest import ENVSDK, REPO, assert_one_line_error, envsdk, user_env

pytestmark = pytest.mark.timeout(240)

# A resume token's value; a masked one reads ``resume_token=***``.
_TOKEN = re.compile(r"resume_token=(?!\*\*\*)[^&\s\"'\\)]+")


def _kill_the_server_mid_run(tmp_path: Path) -> tuple[list[dict[str, Any]], str, str]:
    """A real rollout whose Sudoku server is killed -9 once 8 records are written: (its records,
    the records file's text, the rollout's stderr)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "servers.sudoku", "--port", str(port)], cwd=REPO, env=user_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    rollout: subprocess.Popen[str] | None = None
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        out = tmp_path / "k.jsonl"
        rollout = subprocess.Popen(
            [str(ENVSDK), "rollout", "--env", "sudoku", "--base-url", url, "--episodes", "5000",
             "--concurrency", "4", "--no-progress", "--out", str(out)],
            cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        while not out.exists() or out.read_bytes().count(b"\n") < 8:  # episodes are being played
            assert rollout.poll() is None, rollout.communicate()
            time.sleep(0.05)
        server.kill()  # kill -9: the sessions in flight try to resume, and are lost
        _, stderr = rollout.communicate(timeout=180)
    finally:
        stop_process(server)
        if rollout is not None and rollout.poll() is None:
            stop_process(rollout)
    text = out.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()], text, stderr


@pytest.mark.timeout(600)
def test_a_server_killed_mid_run_leaks_no_resume_token_into_stderr_or_records(tmp_path: Path) -> None:
    # Which episodes were mid-session when the server died is timing: those starting then end in a
    # ConnectError, with no session to lose. Killed again until one lost its session (resume URL).
    for attempt in range(4):
        records, text, stderr = _kill_the_server_mid_run(tmp_path / str(attempt))
        assert not _TOKEN.search(stderr), stderr
        assert not _TOKEN.search(text)
        lost = [r for r in records if r["error_kind"] == "SessionLostError"]
        if lost:
            break
    assert lost, (stderr, [r["status"] for r in records])  # a session was lost mid-episode
    assert "resume_token=***" in lost[0]["reason"]  # the URL is still there, masked
    assert "envsdk rollout: error: stopped after 5 episodes in a row lost the connection" in stderr
    # One line per lost episode (the trajectory's error), not the client's warning besides. The
    # closing line quotes the last episode's error, which may be one of these (timing decides).
    lines = [line for line in stderr.splitlines() if not line.startswith("envsdk rollout: error: stopped after")]
    for record in lost:
        session = re.search(r"Session (\S+) lost", record["reason"])
        assert session is not None, record["reason"]
        assert sum(session[0] in line for line in lines) == 1, stderr


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("http://[::1", ["--base-url", "http://[::1", "IPv6"]),
        ("http://127.0.0.1:abc", ["--base-url", "port", "abc"]),
        ("http://127.0.0.1:99999", ["--base-url", "port", "99999", "65535"]),
        ("http://user:s3cret-pw@127.0.0.1:8010", ["--base-url", "user name or password", "ENVSDK_TOKEN"]),
        # A token is the user's own string: all of it up to the next `&` is masked, `)` included.
        ("http://127.0.0.1:99999/?token=pw)s3cret-pw", ["--base-url", "port", "99999", "token=***"]),
        # Without a scheme, or not a URL at all: the line still masks what the URL carries.
        ("localhost:8000/?token=s3cret-pw", ["--base-url", "no scheme", "token=***"]),
        ("not a url?token=s3cret-pw", ["--base-url", "neither a URL", "token=***"]),
        # A gateway's own query secrets, whatever the key is called.
        ("http://127.0.0.1:99999/?access_token=s3cret-pw", ["--base-url", "99999", "access_token=***"]),
        ("http://127.0.0.1:99999/?x=1&api_key=s3cret-pw&y=2", ["--base-url", "99999", "api_key=***&y=2"]),
    ],
)
def test_a_malformed_base_url_is_one_line_and_exit_2(tmp_path: Path, url: str, needles: list[str]) -> None:
    result = envsdk("rollout", "--env", "sudoku", "--base-url", url, "--episodes", "1", "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result
    assert_one_line_error(result, *needles)
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert not (tmp_path / "completions.jsonl").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1", "ws://u:s3cret-pw@h:1"])
def test_the_client_refuses_a_malformed_base_url_with_a_typed_error(url: str) -> None:
    with pytest.raises(EnvSDKError) as caught:
        OpenEnvWrapper(url)
    assert isinstance(caught.value, ValueError)  # as websocket_url's refusals were
    assert "s3cret-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("ws://h/ws?session_id=a&resume_token=s3cret-pw", "ws://h/ws?session_id=a&resume_token=***"),
        ("connect to http://h/?token=s3cret-pw failed", "connect to http://h/?token=*** failed"),
        ("http://h/?Access_Token=s3cret-pw&n=2", "http://h/?Access_Token=***&n=2"),
        ("http://h/?apikey=s3cret-pw", "http://h/?apikey=***"),
        ("http://h/?X-Amz-Signature=s3cret-pw", "http://h/?X-Amz-Signature=***"),
        ("http://h/?client_secret=s3cret-pw", "http://h/?client_secret=***"),
        ("http://h/?password=s3cret-pw", "http://h/?password=***"),
        ("http://u:s3cret-pw@h/", "http://***@h/"),
        # Not query secrets: an option's value in a message is left as it is.
        ("max_tokens=8 and monkey=1", "max_tokens=8 and monkey=1"),
        ("http://h/?tokens=8&keyboard=us", "http://h/?tokens=8&keyboard=us"),
    ],
)
def test_mask_secrets_masks_a_urls_secret_query_values_and_nothing_else(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked
