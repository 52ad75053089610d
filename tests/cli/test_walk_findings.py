"""What a README walk from an empty folder found after issue 25's findings were fixed: one test
per finding, each through the real ``envsdk`` command (or the documented example) in a temporary
folder with no PYTHONPATH, against real servers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.testing import free_port, stop_process
from tests.cli.conftest import ENVSDK, start_interruptible, user_env

pytestmark = pytest.mark.timeout(240)


def _wait_healthy(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not start")


def test_ctrl_c_on_serve_drains_and_exits_130_without_a_traceback(folder: Path) -> None:
    """The README: the first SIGINT drains the server and the process exits, no traceback."""
    port = free_port()
    proc = start_interruptible(
        [str(ENVSDK), "serve", "my_env:MyEnv", "--port", str(port)], cwd=folder, env=user_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


def test_the_api_key_is_never_written_beside_the_records(folder: Path) -> None:
    """The run file lies beside records that get shared: a key given with --api-key must not be
    in it (nor anywhere else in the folder), and the run file still repeats the run."""
    from envsdk.testing import running_server
    from tests.cli.conftest import envsdk
    from tests.cli.test_user_path import _recording_inference_app

    seen: list[dict[str, Any]] = []
    # The key is read only by --policy openai (any other policy refuses it): a real endpoint.
    with running_server(_recording_inference_app(seen)) as base:
        first = envsdk("rollout", "--env", "frozen_lake", "--policy", "openai", "--api-base", base + "/v1", "--model",
                       "m", "--episodes", "2", "--max-turns", "2", "--api-key", "sk-SECRET-123", "--out", "a.jsonl",
                       "--no-progress", cwd=folder)
        assert first.returncode == 0, first.stderr
        assert seen and seen[-1]["auth"] == "Bearer sk-SECRET-123"
        for path in folder.rglob("*"):
            if path.is_file():
                assert "sk-SECRET-123" not in path.read_text(encoding="utf-8", errors="replace"), path
        assert "api-key: given, not written" in (folder / "a.run.toml").read_text(encoding="utf-8")
        again = envsdk("rollout", "--config", "a.run.toml", "--out", "b.jsonl", "--no-progress", cwd=folder,
                       env={**user_env(), "OPENAI_API_KEY": "k2"})
        assert again.returncode == 0, again.stderr
        assert seen[-1]["auth"] == "Bearer k2"  # not written, so taken from where the user keeps it
    assert sorted(_episodes(folder / "a.jsonl")) == sorted(_episodes(folder / "b.jsonl"))


def _episodes(path: Path) -> list[tuple[object, ...]]:
    import json

    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(r["total_reward"], r["turns"], json.dumps(r["messages"])) for r in records]


def test_resume_and_overwrite_together_are_refused(folder: Path) -> None:
    from tests.cli.conftest import assert_one_line_error, envsdk

    first = envsdk("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--out", "a.jsonl",
                   "--no-progress", cwd=folder)
    assert first.returncode == 0, first.stderr
    both = envsdk("rollout", "--resume", "--overwrite", "--out", "a.jsonl", "--no-progress", cwd=folder)
    assert both.returncode == 2
    assert_one_line_error(both, "--resume", "--overwrite")


def test_a_run_file_may_say_overwrite_but_not_resume(folder: Path) -> None:
    from tests.cli.conftest import assert_one_line_error, envsdk

    (folder / "run.toml").write_text(
        'env = "frozen_lake"\npolicy = "random"\nepisodes = 2\nout = "a.jsonl"\noverwrite = true\n', encoding="utf-8"
    )
    for _ in range(2):  # the second run replaces the first one's records, as the file says
        done = envsdk("rollout", "--config", "run.toml", "--no-progress", cwd=folder)
        assert done.returncode == 0, done.stderr
    assert len(_episodes(folder / "a.jsonl")) == 2
    assert "overwrite" not in (folder / "a.run.toml").read_text(encoding="utf-8")
    (folder / "resume.toml").write_text('env = "frozen_lake"\nresume = true\n', encoding="utf-8")
    refused = envsdk("rollout", "--config", "resume.toml", "--no-progress", cwd=folder)
    assert refused.returncode == 2
    assert_one_line_error(refused, "'resume' cannot come from a run file", "--resume")


def test_a_base_url_where_no_env_server_answers_is_refused_up_front(folder: Path) -> None:
    """A path under a live server (``/nope``) answers 404 at ``/nope/health``: the pre-flight must
    say so in one line, not let every episode fail with a raw WebSocket status dump."""
    from tests.cli.conftest import assert_one_line_error, envsdk

    port = free_port()
    proc = subprocess.Popen(
        [str(ENVSDK), "serve", "my_env:MyEnv", "--port", str(port)], cwd=folder, env=user_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")
        result = envsdk("rollout", "--env", "my_env", "--base-url", f"http://127.0.0.1:{port}/nope", "--episodes", "3",
                        "--no-progress", cwd=folder)
    finally:
        stop_process(proc)
    assert result.returncode == 1, result
    assert_one_line_error(result, "/nope/health answered HTTP 404", "fix --base-url")
    assert "episodes" not in result.stdout, result.stdout


@pytest.mark.parametrize("target", ["my_env:app", "my_env:MyAction"])
def test_check_env_on_something_that_is_not_an_environment_is_a_usage_error(folder: Path, target: str) -> None:
    """An app or an action class is an unusable target (exit 2, one line), not a broken rule."""
    from tests.cli.conftest import assert_one_line_error, envsdk

    result = envsdk("check-env", target, cwd=folder)
    assert result.returncode == 2, result
    assert_one_line_error(result, "not an environment")
    assert "FAILED rule" not in result.stderr


def test_the_tool_example_without_the_mcp_extra_says_how_to_install_it(folder: Path) -> None:
    """``python examples/ledger_tools.py`` as the README runs it, by a user without the [mcp]
    extra (a ``fastmcp`` folder that fails to import as a missing distribution does)."""
    import shutil
    import sys

    from tests.cli.conftest import REPO, Result, assert_one_line_error

    (folder / "fastmcp").mkdir()
    (folder / "fastmcp" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'fastmcp'\", name='fastmcp')\n", encoding="utf-8"
    )
    shutil.copy(REPO / "examples" / "ledger_tools.py", folder / "ledger_tools.py")
    done = subprocess.run([sys.executable, "ledger_tools.py", "--port", str(free_port())], cwd=folder, env=user_env(),
                          capture_output=True, text=True, timeout=60)
    result = Result(done.returncode, done.stdout, done.stderr)
    assert_one_line_error(result, "pip install -e '.[mcp]'")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
