"""A newcomer's first hour, one test per stumbling block: the real ``envsdk`` command in a
temporary folder with no PYTHONPATH, against real servers started as a user would start them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import (
    ENVSDK,
    REPO,
    ServeFn,
    assert_one_line_error,
    envsdk,
    start_interruptible,
    user_env,
)

pytestmark = pytest.mark.timeout(240)

POLICY_PLUGIN = """\
from envsdk.policies import Policy

class AlwaysDown(Policy):
    async def act(self, messages):
        return "<action>down</action>"
"""

ENV_PLUGIN = """\
from envsdk.env import Env
from envsdk.registry import envs

class CountEnv(Env):
    '''Ends after three replies; reward 1 for each non-empty one.'''
    def __init__(self, env_config):
        self.turn = 0
    async def reset(self, config):
        self.turn = 0
        return "say anything", {}, None
    async def step(self, messages):
        self.turn += 1
        reply = messages[-1]["content"]
        return f"turn {self.turn}", float(bool(reply)), self.turn >= 3, {}
    async def close(self):
        pass

class BrokenEnv(CountEnv):
    async def reset(self, config):
        raise RuntimeError("the reset is broken")

envs["my_env"] = CountEnv
envs["broken_env"] = BrokenEnv
"""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# 1 ------------------------------------------------------------------------------------------


def test_1_targets_policies_and_files_import_from_the_users_folder(folder: Path, serve: ServeFn) -> None:
    (folder / "my_policy.py").write_text(POLICY_PLUGIN, encoding="utf-8")
    checked = envsdk("check-env", "my_env:MyEnv", cwd=folder)
    assert checked.returncode == 0, checked.stderr
    for target in ("my_env:MyEnv", "my_env.py:MyEnv"):
        url = serve(target, cwd=folder)
        assert httpx.get(url + "/metadata", timeout=5).json()["name"] == "MyEnv"
    rolled = envsdk(
        "rollout", "--env", "frozen_lake", "--policy", "my_policy:AlwaysDown", "--episodes", "2",
        "--max-turns", "3", "--no-progress", cwd=folder,
    )
    assert rolled.returncode == 0, rolled.stderr
    assert all(r["messages"][-1]["content"] == "<action>down</action>" or r["status"] != "done"
               for r in _records(folder / "completions.jsonl"))


# 2 ------------------------------------------------------------------------------------------


def test_2_mistakes_on_the_rollout_line_answer_in_one_line(folder: Path) -> None:
    # The README's own line without --api-base.
    no_api = envsdk("rollout", "--env", "sudoku", "--base-url", "http://127.0.0.1:9", "--policy", "openai",
                    "--model", "X", cwd=folder)
    assert_one_line_error(no_api, "--api-base")
    assert no_api.returncode == 2
    no_model = envsdk("rollout", "--env", "frozen_lake", "--policy", "transformers", cwd=folder)
    assert_one_line_error(no_model, "--model")
    missing_plugin = envsdk("rollout", "--env", "my_env", "--external-plugins", "nope.py", cwd=folder)
    assert_one_line_error(missing_plugin, "plugin file not found: nope.py")
    bad_policy = envsdk("rollout", "--env", "frozen_lake", "--policy", "nope:Policy", cwd=folder)
    assert_one_line_error(bad_policy, "no module named 'nope'")


# 3 ------------------------------------------------------------------------------------------


def test_3_a_plugin_env_rolls_out_with_the_default_policy(folder: Path) -> None:
    (folder / "my_plugin.py").write_text(ENV_PLUGIN, encoding="utf-8")
    result = envsdk("rollout", "--env", "my_env", "--external-plugins", "my_plugin.py", "--episodes", "4",
                    "--no-progress", cwd=folder)
    assert result.returncode == 0, result.stderr
    records = _records(folder / "completions.jsonl")
    assert len(records) == 4 and {r["status"] for r in records} == {"done"}
    assert all(r["turns"] == 3 for r in records)


# 4 ------------------------------------------------------------------------------------------


def test_4_nothing_ran_means_a_non_zero_exit_and_one_line_saying_what_to_do(
    folder: Path, serve: ServeFn
) -> None:
    from envsdk.testing import free_port

    down = envsdk("rollout", "--env", "sudoku", "--base-url", f"http://127.0.0.1:{free_port()}", "--episodes", "4",
                  "--no-progress", cwd=folder)
    assert_one_line_error(down, "no environment server answers", "start it")
    assert down.returncode == 1

    small = serve("my_env:MyEnv", "--max-concurrent-envs", "2", cwd=folder)
    full = envsdk("rollout", "--env", "my_env", "--base-url", small, "--concurrency", "8", "--no-progress", cwd=folder)
    assert_one_line_error(full, "MAX_CONCURRENT_ENVS=8", "--concurrency")

    env = {**user_env(), "ENVSDK_TOKEN": "s3cret"}
    locked = serve("my_env:MyEnv", cwd=folder, env=env)
    no_token = envsdk("rollout", "--env", "my_env", "--base-url", locked, "--no-progress", cwd=folder)
    assert_one_line_error(no_token, "requires a token", "ENVSDK_TOKEN")
    with_token = envsdk("rollout", "--env", "my_env", "--base-url", locked, "--episodes", "2", "--no-progress",
                        cwd=folder, env=env)
    assert with_token.returncode == 0, with_token.stderr

    open_url = serve("my_env:MyEnv", cwd=folder)
    no_inference = envsdk("rollout", "--env", "my_env", "--base-url", open_url, "--policy", "openai", "--model", "m", "--overwrite",
                          "--api-base", f"http://127.0.0.1:{free_port()}/v1", "--no-progress", cwd=folder)
    assert_one_line_error(no_inference, "no inference server answers", "--api-base")

    (folder / "my_plugin.py").write_text(ENV_PLUGIN, encoding="utf-8")
    broken = envsdk("rollout", "--env", "broken_env", "--external-plugins", "my_plugin.py", "--episodes", "3", "--overwrite",
                    "--no-progress", cwd=folder)
    assert broken.returncode == 1
    assert "no episode ran: all 3 ended in an error" in broken.stderr and "the reset is broken" in broken.stderr


# 5 ------------------------------------------------------------------------------------------


INFO_IGNORES_SEED = ENV_PLUGIN.replace(
    'return "say anything", {}, None', 'import random\n        return "say anything", {"target": random.Random().random()}, None'
)


def test_5_check_env_runs_every_rule_on_the_readme_env_and_compares_reset_info(folder: Path) -> None:
    checked = envsdk("check-env", "my_env:MyEnv", cwd=folder)
    assert checked.returncode == 0, checked.stderr
    assert "0 skipped" in checked.stdout and "skip " not in checked.stdout
    assert "ok    step.returns" in checked.stdout and "ok    step.after_done_refused" in checked.stdout
    (folder / "my_plugin.py").write_text(INFO_IGNORES_SEED, encoding="utf-8")
    bad = envsdk("check-env", "my_env", "--external-plugins", "my_plugin.py", cwd=folder)
    assert bad.returncode == 1
    assert "FAILED rule reset.seed_determinism" in bad.stderr and "infos" in bad.stderr


# 6 ------------------------------------------------------------------------------------------


def test_6_the_readme_installs_a_cpu_torch_and_names_the_report_extra() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    # The TRL line must not send a CPU user to `pip install -e ".[train]"` alone.
    train = readme.split("## Train with TRL", 1)[1].split("\n## ", 1)[0]
    assert "bash scripts/setup.sh train" in train and "download.pytorch.org/whl/cpu" in train
    assert '".[report]"' in (REPO / "docs" / "web.md").read_text(encoding="utf-8")


# 7 ------------------------------------------------------------------------------------------


async def test_7_a_validation_error_names_the_field(folder: Path, serve: ServeFn) -> None:
    from envsdk import EnvClient
    from envsdk.errors import ServerError

    url = serve("my_env:MyEnv", cwd=folder)
    async with EnvClient(url) as client:
        await client.reset(seed=1)
        with pytest.raises(ServerError) as caught:
            await client.step({"mesage": "typo"})
    assert caught.value.code == "VALIDATION_ERROR"
    assert "message: Field required" in str(caught.value)


# 8 ------------------------------------------------------------------------------------------


def test_8_http_step_says_it_is_stateless_and_the_readme_says_so(folder: Path, serve: ServeFn) -> None:
    url = serve("my_env:MyEnv", cwd=folder)
    assert httpx.post(url + "/reset", json={"seed": 1}, timeout=5).status_code == 200
    step = httpx.post(url + "/step", json={"action": {"message": "hi"}}, timeout=5)
    assert step.status_code == 500
    assert "HTTP /step is stateless" in step.json()["detail"]["message"]
    assert "`/reset`, `/step` and `/state` are stateless" in (REPO / "docs" / "serving.md").read_text(encoding="utf-8")


# 9 ------------------------------------------------------------------------------------------


def test_9_completions_records_are_lean_versioned_and_read_back_by_report(folder: Path) -> None:
    pytest.importorskip("matplotlib")
    result = envsdk("rollout", "--env", "sudoku", "--episodes", "8", "--no-progress", cwd=folder)
    assert result.returncode == 0, result.stderr
    path = folder / "completions.jsonl"
    records = _records(path)
    assert len(records) == 8
    for record in records:
        assert record["schema"] == "envsdk.completions/1"
        assert "steps" not in record and "data_dict" not in record and "rollout_infos" not in record
        components = record["reward_components"]
        assert set(components) == {"empty_cell", "valid_move", "repetition", "progress", "correct"}
        for name, component in components.items():
            assert set(component) == {"value", "steps"}
            assert isinstance(component["value"], float)
            assert component["steps"] == [] or len(component["steps"]) == len(record["step_rewards"]), name
        assert "cells_filled" in record["infos"] and "cells_filled" not in components
    full = envsdk("rollout", "--env", "sudoku", "--episodes", "8", "--record", "full", "--out", "full.jsonl",
                  "--no-progress", cwd=folder)
    assert full.returncode == 0, full.stderr
    full_records = _records(folder / "full.jsonl")
    # The full form keeps every step's observation (the lean run lets them go as it plays).
    assert all(isinstance(s["observation"], dict) and s["observation"] for r in full_records for s in r["steps"])
    # Lean: the same episodes in well under half the bytes of the full form.
    assert path.stat().st_size < 0.5 * (folder / "full.jsonl").stat().st_size
    summary = result.stdout
    assert "cells_filled" not in summary and "reward components (5), each episode's value:" in summary
    for line in summary.splitlines():
        if line.strip().startswith(("total_reward", "correct", "empty_cell")):
            assert line.split()[4] == "8", line  # n shown: every row over the 8 episodes
    correct_p90 = next(line for line in summary.splitlines() if line.strip().startswith("correct")).split()[3]
    assert correct_p90 in ("0.000", "1.000")  # nearest rank: an observed value
    report = envsdk("report", "completions.jsonl", cwd=folder)
    assert report.returncode == 0, report.stderr
    page = (folder / "completions_report" / "report.html").read_text(encoding="utf-8")
    assert "<td>valid_move</td>" in page and "<td>cells_filled</td>" not in page


# 10 -----------------------------------------------------------------------------------------


def _wait_for(ready: Callable[[], bool], failure: str) -> None:
    """Wait (at most 120 s, polling) until `ready()`; `failure` is the assertion's message."""
    deadline = time.monotonic() + 120
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready(), failure


def _a_record_in(out: Path) -> bool:
    # Whole lines only: the run is writing the file while it is read here.
    return out.exists() and out.read_bytes().count(b"\n") >= 1


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Press Ctrl-C on `proc`, started in its own process group (SIGINT to the whole group, as
    from a terminal); its stdout and stderr once it ended (killed after 60 s)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_10_ctrl_c_prints_the_finished_episodes_summary_without_tracebacks(folder: Path) -> None:
    proc = start_interruptible(
        [str(ENVSDK), "rollout", "--env", "sudoku", "--episodes", "400", "--concurrency", "2", "--no-progress"],
        cwd=folder, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: SIGINT reaches it all, as from a terminal
    )
    try:
        _wait_for(lambda: _a_record_in(folder / "completions.jsonl"), "no episode finished in time")
    finally:
        stdout, stderr = _ctrl_c(proc)  # also when the wait failed: nothing is left running
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "interrupted:" in stderr and "of 400 episodes finished" in stderr
    assert "success rate" in stdout


def test_10_sigterm_stops_the_run_as_ctrl_c_does_and_lets_go_of_its_out_file(folder: Path) -> None:
    """A job scheduler (Slurm, Kubernetes) or `kill` stops a run with SIGTERM before it kills it:
    the run ends as on Ctrl-C (the finished episodes' summary, how to resume, no traceback), with
    the shell's status for SIGTERM, and its hold on --out is let go (no lock file is left)."""
    code, stdout, stderr = _stop_a_run(folder, [(0, signal.SIGTERM)])  # to the process alone, as `kill PID` does
    assert code == 128 + signal.SIGTERM, (code, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "terminated:" in stderr and "of 400 episodes finished" in stderr, stderr
    assert "success rate" in stdout and "envsdk rollout --resume --out c.jsonl" in stdout, stdout
    assert not (folder / "c.envsdk.lock").exists()
    written = (folder / "c.jsonl").read_bytes()
    assert written.endswith(b"\n") and len(written.splitlines()) >= 1
    assert all(json.loads(line)["status"] for line in written.splitlines())


def _stop_a_run(
    folder: Path, signals: list[tuple[float, signal.Signals]], *, ignore_ctrl_c: bool = False,
    program: tuple[str, ...] = (str(ENVSDK), "rollout"), stderr_gone: bool = False,
) -> tuple[int, str, str]:
    """Start a Sudoku run into ``c.jsonl``, wait for its first record, then send `signals` to the
    process, each after its delay in seconds; the run's exit status, stdout and stderr (with
    `stderr_gone`, a pipe whose reader has closed it, as a logger that died leaves it)."""
    start = start_interruptible if not ignore_ctrl_c else subprocess.Popen
    proc = start(
        [*program, "--env", "sudoku", "--episodes", "400", "--concurrency", "8", "--no-progress",
         "--out", "c.jsonl"],
        cwd=folder, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A run started with `nohup` or in a script's background ignores Ctrl-C from its start.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_ctrl_c else None,
    )
    if stderr_gone:
        assert proc.stderr is not None
        proc.stderr.close()
        proc.stderr = None
    try:
        _wait_for(lambda: _a_record_in(folder / "c.jsonl"), "no episode finished in time")
        for delay, signum in signals:
            time.sleep(delay)
            proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, stderr or ""


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("signals", "status"),
    [
        # `kill` twice in a row, Ctrl-C then `kill`, and a second `kill` while the first one's
        # episodes are being closed: the run stops once, as on the first, and says so.
        ([(0, signal.SIGTERM), (0.005, signal.SIGTERM)], 143),
        ([(0, signal.SIGINT), (0.005, signal.SIGTERM)], 130),
        ([(0, signal.SIGTERM), (0.1, signal.SIGTERM)], 143),
        ([(0, signal.SIGTERM), (0.2, signal.SIGINT)], 143),
    ],
    ids=["term-term", "int-term", "term-then-term-while-stopping", "term-then-int-while-stopping"],
)
def test_10_a_second_signal_while_a_run_stops_neither_hangs_nor_cuts_its_stop_short(
    folder: Path, signals: list[tuple[float, signal.Signals]], status: int
) -> None:
    """A second Ctrl-C or `kill` while a run stops (an impatient user, a script that signals
    twice) lets the stop finish: the summary, --out let go, no traceback. It had raised in the
    middle of closing the episodes' sessions and the embedded server, and the process then hung
    on a lock at exit or was killed by the default action with the lock file left."""
    code, stdout, stderr = _stop_a_run(folder, signals)
    # One that comes after the stop, as the interpreter ends (it resets the handlers then), takes
    # the signal's default action: for a shell or a job scheduler, the same status.
    assert code in (status, -signals[-1][1]), (code, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr and "Task was destroyed" not in stderr, stderr
    assert "of 400 episodes finished" in stderr and "success rate" in stdout, (stdout, stderr)
    assert not (folder / "c.envsdk.lock").exists()


def test_10_a_run_whose_stderr_is_gone_still_stops_with_its_summary_and_status(folder: Path) -> None:
    """With stderr a pipe nobody reads any more (``2>&1 | head``, a logger that died), the stop's
    notes cannot be written: the stop goes on without them (a second signal's note had raised
    in the middle of it, and the first one's line had cut the summary: status 1)."""
    code, stdout, _ = _stop_a_run(folder, [(0, signal.SIGTERM), (0.005, signal.SIGTERM)], stderr_gone=True)
    assert code in (143, -signal.SIGTERM), code
    assert "success rate" in stdout and "envsdk rollout --resume --out c.jsonl" in stdout, stdout
    assert not (folder / "c.envsdk.lock").exists()


def test_10_sigterm_stops_a_run_that_ignores_ctrl_c(folder: Path) -> None:
    """A run started with `nohup` or in a script's background ignores Ctrl-C; SIGTERM still stops
    it as Ctrl-C would have (it had raised KeyboardInterrupt wherever the loop stood)."""
    code, stdout, stderr = _stop_a_run(folder, [(0, signal.SIGTERM)], ignore_ctrl_c=True)
    assert code == 143, (code, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "terminated:" in stderr and "success rate" in stdout, (stdout, stderr)
    assert not (folder / "c.envsdk.lock").exists()


def test_10_the_rollout_module_run_on_its_own_stops_on_sigterm_too(folder: Path) -> None:
    """``python -m envsdk.rollout`` is the same command: SIGTERM stops it as it stops `envsdk
    rollout` (it had ended the process where it stood, leaving the lock file)."""
    code, stdout, stderr = _stop_a_run(folder, [(0, signal.SIGTERM)], program=(sys.executable, "-m", "envsdk.rollout"))
    assert code == 143, (code, stderr)
    assert "terminated:" in stderr and "success rate" in stdout, (stdout, stderr)
    assert not (folder / "c.envsdk.lock").exists()


def test_10_a_third_signal_ends_a_stop_that_hangs_at_once(folder: Path) -> None:
    """A stop waits for the episodes in flight; one that never ends (here a policy that blocks its
    process's event loop) is ended at once by a third Ctrl-C or `kill`, with the status of the
    first signal, and what was written stays for --resume."""
    marker = folder / "blocking"
    (folder / "stuck_policy.py").write_text(
        "import pathlib, time\n"
        "from envsdk.policies import SudokuOraclePolicy\n"
        "class Stuck(SudokuOraclePolicy):\n"
        "    async def act(self, messages):\n"
        f"        pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "        time.sleep(120)  # blocks the event loop: no cancel reaches it\n",
        encoding="utf-8",
    )
    proc = start_interruptible(
        [str(ENVSDK), "rollout", "--env", "sudoku", "--policy", "stuck_policy:Stuck", "--episodes", "2",
         "--no-progress", "--out", "c.jsonl"],
        cwd=folder, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_for(marker.exists, "the policy was never asked to act")
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGTERM):
            proc.send_signal(signum)
            time.sleep(0.3)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "already stopping (signal once more to end at once)" in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "envsdk rollout: interrupted: ended at once", stderr
    assert "Traceback" not in stderr, stderr


def test_10_ctrl_c_while_the_run_starts_up_says_so_without_a_traceback(folder: Path) -> None:
    """Ctrl-C before any episode starts (here while the user's policy module loads) ends the run
    in one line with status 130, as it does once episodes are playing."""
    marker = folder / "loading"
    (folder / "slow_policy.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "time.sleep(60)\n"
        "from envsdk.policies import SudokuOraclePolicy as Slow\n",
        encoding="utf-8",
    )
    code, stderr = _ctrl_c_once_written(
        folder, marker, "--env", "sudoku", "--policy", "slow_policy:Slow", "--episodes", "2", "--no-progress"
    )
    assert code == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "envsdk rollout: interrupted before any episode started", stderr
    assert not list(folder.glob("*.envsdk.lock"))


def _ctrl_c_once_written(folder: Path, marker: Path, *args: str) -> tuple[int, str]:
    """Start ``envsdk rollout ARGS`` in `folder` (in its own process group), press Ctrl-C once
    `marker` exists; its exit status and stderr."""
    proc = start_interruptible(
        [str(ENVSDK), "rollout", *args], cwd=folder, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        _wait_for(marker.exists, f"{marker.name} was never written")
    finally:
        _, stderr = _ctrl_c(proc)  # also when the wait failed: nothing is left running
    return proc.returncode, stderr


def test_10_ctrl_c_before_any_episode_finished_says_how_to_resume(folder: Path) -> None:
    """Ctrl-C while the first episodes play, none finished yet: --out keeps its run file (and the
    records of earlier attempts), so --resume continues the run; only a run with finished
    episodes had said so."""
    marker = folder / "acting"
    (folder / "slow_policy.py").write_text(
        "import asyncio, os, pathlib\n"
        "from envsdk.policies import SudokuOraclePolicy\n"
        "class Slow(SudokuOraclePolicy):\n"
        "    async def act(self, messages):\n"
        f"        pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "        await asyncio.sleep(float(os.environ.get('SLOW_S', '120')))\n"
        "        return await super().act(messages)\n",
        encoding="utf-8",
    )
    code, stderr = _ctrl_c_once_written(
        folder, marker, "--env", "sudoku", "--policy", "slow_policy:Slow", "--episodes", "2", "--no-progress",
        "--out", "c.jsonl",
    )
    assert code == 130, stderr
    assert "Traceback" not in stderr and "interrupted: 0 of 2 episodes finished" in stderr, stderr
    assert "`envsdk rollout --resume --out c.jsonl` plays the rest" in stderr, stderr
    resumed = envsdk("rollout", "--resume", "--out", "c.jsonl", cwd=folder, env={**user_env(), "SLOW_S": "0"})
    assert resumed.returncode == 0, resumed.stderr
    assert len(_records(folder / "c.jsonl")) == 2


@pytest.mark.parametrize(
    ("reader", "unbuffered"),
    [("head -1", True), ("gone", True), ("gone", False)],
    ids=["head-unbuffered", "gone-unbuffered", "gone-buffered"],
)
def test_10_a_run_whose_stdout_reader_went_away_ends_with_its_own_status(
    folder: Path, reader: str, unbuffered: bool
) -> None:
    """``envsdk rollout … | head -1``: once the reader has gone, the rest of the summary cannot be
    written; the run still ends as it would have (its summary files written, status 0), saying
    nothing more. A write to the closed pipe had cut it short with status 1 (in the middle of the
    summary with PYTHONUNBUFFERED, at the last flush otherwise)."""
    env = {k: v for k, v in user_env().items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [str(ENVSDK), "rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "2", "--no-progress"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    head: subprocess.Popen[str] | None = None
    assert proc.stdout is not None
    try:
        if reader == "head -1":
            head = subprocess.Popen(["head", "-1"], stdin=proc.stdout, stdout=subprocess.PIPE, text=True)
        proc.stdout.close()  # the reader's end is head's alone, or nobody's
        proc.stdout = None
        _, stderr = proc.communicate(timeout=120)
        first = head.communicate(timeout=30)[0] if head is not None else None
    finally:
        for started in (proc, head):
            if started is not None and started.poll() is None:
                started.kill()
                started.wait()
    assert (proc.returncode, stderr) == (0, ""), stderr
    assert first is None or first.startswith("policy          oracle"), first
    assert (folder / "completions.eval.json").exists()


# 12 -----------------------------------------------------------------------------------------


def test_12_unknown_env_names_the_env_and_a_close_match(folder: Path) -> None:
    result = envsdk("rollout", "--env", "frozen_lak", cwd=folder)
    assert_one_line_error(result, "unknown environment 'frozen_lak'", "Did you mean 'frozen_lake'?")


def test_12_serving_a_built_app_with_another_capacity_is_refused_not_ignored(folder: Path) -> None:
    result = envsdk("serve", "my_env:app", "--max-concurrent-envs", "8", cwd=folder, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "max_concurrent_envs=256" in result.stderr and "--max-concurrent-envs 8" in result.stderr


def test_12_metadata_describes_the_users_env_not_envsdks_base_class(folder: Path, serve: ServeFn) -> None:
    source = (folder / "my_env.py").read_text(encoding="utf-8")
    (folder / "my_env.py").write_text(
        source.replace("class MyEnv(Environment):\n", 'class MyEnv(Environment):\n    """Says back what it hears."""\n'),
        encoding="utf-8",
    )
    (folder / "plain_env.py").write_text(source, encoding="utf-8")
    described = serve("my_env:MyEnv", cwd=folder)
    assert httpx.get(described + "/metadata", timeout=5).json()["description"] == "Says back what it hears."
    plain = serve("plain_env:MyEnv", cwd=folder)
    assert httpx.get(plain + "/metadata", timeout=5).json()["description"] == "MyEnv environment"


def test_12_the_plain_openenv_warning_prints_once_per_server(folder: Path) -> None:
    from envsdk.testing import running_server
    from envsdk.testing.openenv_echo import make_openenv_app

    with running_server(make_openenv_app(max_concurrent_envs=8)) as url:
        result = envsdk("rollout", "--env", "echo", "--base-url", url, "--episodes", "5", "--max-turns", "1",
                        "--no-progress", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("does not support envsdk sessions") == 1, result.stderr


@pytest.mark.parametrize(
    ("module", "flags"),
    [("servers.sudoku", ["--board-workers", "1"]), ("servers.textarena", ["--game-workers", "1", "--env-id", "2048-v0"])],
)
def test_12_the_game_servers_take_no_web_and_token(folder: Path, serve: ServeFn, module: str, flags: list[str]) -> None:
    url = serve("--no-web", "--token", "s3cret", *flags, cwd=folder, module=module)
    assert httpx.get(url + "/metadata", timeout=5).status_code == 401
    headers = {"Authorization": "Bearer s3cret"}
    assert httpx.get(url + "/metadata", headers=headers, timeout=5).status_code == 200
    assert httpx.get(url + "/web", headers=headers, timeout=5).status_code == 404


def test_12_exports_help_and_docs_a_user_reads() -> None:
    import envsdk
    from envsdk.client.pool import EnvPool
    from envsdk.server import ServerConfig

    assert envsdk.EnvPool is EnvPool and "EnvPool" in envsdk.__all__
    assert "max_concurrent_envs: Most sessions" in (ServerConfig.__doc__ or "")
    assert "DESIGN.md" not in (REPO / "envsdk" / "protocol.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("stdout", "stderr", "progress"),
    [("closed", "pipe", False), ("full", "pipe", False), ("pipe", "closed", True)],
    ids=["stdout-closed", "stdout-full", "stderr-closed-with-progress"],
)
def test_10_a_run_whose_stdout_or_stderr_cannot_be_written_ends_with_its_own_status(
    folder: Path, stdout: str, stderr: str, progress: bool
) -> None:
    """``>&-``, ``> /dev/full`` and ``2>&-``: the run plays to its end, writes its summary
    files and exits 0, instead of a traceback and status 1 (with ``2>&-`` the progress bar's
    first write failed, and the run's summary file was never written)."""
    out = {"closed": "exec 1>&-; ", "full": "exec 1>/dev/full; ", "pipe": ""}[stdout]
    err = {"closed": "exec 2>&-; ", "pipe": ""}[stderr]
    command = " ".join([str(ENVSDK), "rollout", "--env", "frozen_lake", "--policy", "oracle", "--episodes", "2",
                        "--out", "c.jsonl", *([] if progress else ["--no-progress"])])
    done = subprocess.run(["bash", "-c", f"{out}{err}exec {command}"], cwd=folder, env=user_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 1, done.stderr
    assert len(_records(folder / "c.jsonl")) == 2
    assert (folder / "c.eval.json").exists()


@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_10_report_rescore_and_check_env_whose_stdout_cannot_be_written_end_with_their_own_status(
    folder: Path, stdout: str
) -> None:
    """``report``, ``rescore`` and ``check-env`` with ``>&-`` or ``> /dev/full``: their files are written and
    they exit 0 with at most one line on stderr, as ``rollout`` does (``> /dev/full`` was a
    traceback and status 1, after the files were written)."""
    play = envsdk("rollout", "--env", "sudoku", "--policy", "oracle", "--episodes", "2", "--out", "c.jsonl",
                  "--no-progress", cwd=folder)
    assert play.returncode == 0, play.stderr
    redirect = {"closed": "exec 1>&-; ", "full": "exec 1>/dev/full; "}[stdout]
    for argv, made in (
        (["report", "c.jsonl", "--out-dir", "r"], folder / "r" / "report.html"),
        (["rescore", "--weights", "correct=1", "c.jsonl", "--out", "s.jsonl"], folder / "s.jsonl"),
        (["check-env", "envsdk.envs.frozen_lake:FrozenLakeEnv"], None),
    ):
        done = subprocess.run(["bash", "-c", f"{redirect}exec {ENVSDK} {' '.join(argv)}"], cwd=folder,
                              env=user_env(), capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, (argv, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        if argv[0] != "report":  # their report is their stdout; report's is on stderr
            assert len(done.stderr.strip().splitlines()) <= 1, done.stderr
        assert made is None or made.exists(), argv


def test_10_a_resume_stopped_before_its_end_leaves_no_summary_of_records_it_changed(folder: Path) -> None:
    """A resume moves the records that ended in an error aside and plays them again: stopped
    before its end, it had left the summary of the records as they were (pass@1 0.5 over 4
    records, beside 2 records) where a stopped new run leaves none."""
    marker = folder / "acting"
    (folder / "flaky_policy.py").write_text(
        "import asyncio, os, pathlib\n"
        "from envsdk.policies import FrozenLakeOraclePolicy\n"
        "class Flaky(FrozenLakeOraclePolicy):\n"
        "    async def act(self, messages):\n"
        "        if os.environ.get('FAIL') and messages[-1]['content'].count('H') % 2:\n"
        "            raise RuntimeError('flaky')\n"
        "        if not os.environ.get('FAIL'):\n"
        f"            pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "            await asyncio.sleep(120)\n"
        "        return await super().act(messages)\n",
        encoding="utf-8",
    )
    first = envsdk("rollout", "--env", "frozen_lake", "--policy", "flaky_policy:Flaky", "--episodes", "8",
                   "--no-progress", "--out", "c.jsonl", cwd=folder, env={**user_env(), "FAIL": "1"})
    statuses = [r["status"] for r in _records(folder / "c.jsonl")]
    assert "error" in statuses and "done" in statuses, (statuses, first.stderr)
    assert (folder / "c.eval.json").exists()
    code, stderr = _ctrl_c_once_written(folder, marker, "--resume", "--out", "c.jsonl", "--no-progress")
    assert code == 130, stderr
    assert not (folder / "c.eval.json").exists()
