"""The run file beside the records says what the run played: a command refused before it plays
leaves it as it was, a hand edit is not taken for the run's options, and what it planned is read
from it wherever the records are read from."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from envsdk.runfile import read_run_file
from envsdk.testing import stop_process
from tests.cli.conftest import ENVSDK, assert_one_line_error, envsdk, start_interruptible, user_env
from tests.eval.conftest import by_pair

pytestmark = pytest.mark.timeout(240)

FROZEN = ("rollout", "--env", "frozen_lake", "--policy", "random", "--rollouts-per-example", "2", "--max-turns", "8",
          "--no-progress")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_run_refused_by_its_preflight_leaves_the_run_it_would_replace(tmp_path: Path) -> None:
    """--overwrite wrote its run file before the pre-flight found no server: the earlier run's
    records then lay beside another run's file, and every --resume refused them as foreign."""
    assert envsdk(*FROZEN, "--episodes", "2", "--out", "c.jsonl", cwd=tmp_path).returncode == 0
    before = _files(tmp_path)
    refused = envsdk("rollout", "--env", "sudoku", "--base-url", "http://127.0.0.1:9", "--policy", "random",
                     "--episodes", "2", "--no-progress", "--out", "c.jsonl", "--overwrite", cwd=tmp_path)
    assert refused.returncode == 1
    assert_one_line_error(refused, "http://127.0.0.1:9")
    assert _files(tmp_path) == before
    again = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "nothing left to play" in again.stdout


_FAST_THEN_SLOW = (
    "import asyncio\n\n"
    "class FastThenSlow:\n"
    "    episodes = 0\n\n"
    "    async def act(self, messages):\n"
    "        open('acting', 'w').close()\n"
    "        if sum(m['role'] == 'assistant' for m in messages) == 0:\n"
    "            FastThenSlow.episodes += 1\n"
    "        if FastThenSlow.episodes > 1:\n"
    "            await asyncio.sleep(60)\n"
    "        return 'left'\n"
)


def test_a_run_that_replaces_another_removes_its_summary_once_it_starts(tmp_path: Path) -> None:
    """An --overwrite stopped mid-run left the replaced run's pass@k in <stem>.eval.json beside
    records that were no longer its own: once the new run's first episode is written, its run
    file, and no summary, lie beside its records."""
    assert envsdk(*FROZEN, "--episodes", "2", "--out", "c.jsonl", cwd=tmp_path).returncode == 0
    summary, run_file = tmp_path / "c.eval.json", tmp_path / "c.run.toml"
    assert summary.is_file()
    first = read_run_file(run_file)["run"]["id"]
    (tmp_path / "slow.py").write_text(_FAST_THEN_SLOW, encoding="utf-8")
    proc = subprocess.Popen(
        [str(ENVSDK), "rollout", "--env", "frozen_lake", "--policy", "slow.py:FastThenSlow", "--episodes", "2",
         "--max-turns", "4", "--concurrency", "1", "--no-progress", "--out", "c.jsonl", "--overwrite"],
        cwd=tmp_path, env=user_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while read_run_file(run_file)["run"]["id"] == first:
            assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
            time.sleep(0.05)
        assert not summary.exists()
        records = list(by_pair(tmp_path / "c.jsonl").values())
        assert [r["eval"]["run"] for r in records] == [read_run_file(run_file)["run"]["id"]]
    finally:
        stop_process(proc)


def test_an_overwrite_whose_every_episode_fails_keeps_the_run_it_would_replace(tmp_path: Path) -> None:
    """--overwrite with a reset option the server refuses (a misspelt key) played every episode
    into an error, and had cut the earlier run's records first: a good run was lost to a typo.
    The earlier run stays, whole, until an episode of the new one ends without an error."""
    sudoku = ("rollout", "--env", "sudoku", "--policy", "auto", "--episodes", "2", "--no-progress", "--out", "c.jsonl")
    assert envsdk(*sudoku, cwd=tmp_path).returncode == 0
    # Records the earlier run put aside when it was resumed: they go only with the run itself.
    (tmp_path / "c.replaced.jsonl").write_bytes((tmp_path / "c.jsonl").read_bytes().splitlines(keepends=True)[0])
    before = _files(tmp_path)
    failed = envsdk(*sudoku, "--overwrite", "--env-config", '{"reset_kwargs": {"error_alowance": 2}}', cwd=tmp_path)
    assert failed.returncode == 1
    assert "error_alowance" in failed.stderr
    assert "keeps the earlier run" in failed.stderr, failed.stderr
    assert "written to c.jsonl" not in failed.stdout
    assert _files(tmp_path) == before  # no temporary file left either
    again = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "nothing left to play" in again.stdout
    replaced = envsdk(*sudoku, "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert not (tmp_path / "c.replaced.jsonl").exists()


def test_an_overwrite_stopped_before_an_episode_ends_keeps_the_run_it_would_replace(tmp_path: Path) -> None:
    assert envsdk(*FROZEN, "--episodes", "2", "--out", "c.jsonl", cwd=tmp_path).returncode == 0
    before = _files(tmp_path)
    (tmp_path / "slow.py").write_text(_FAST_THEN_SLOW.replace("> 1", ">= 1"), encoding="utf-8")
    # Started with SIGINT handled, even where the test run ignores it (a background job).
    proc = start_interruptible(
        [str(ENVSDK), "rollout", "--env", "frozen_lake", "--policy", "slow.py:FastThenSlow", "--episodes", "2",
         "--no-progress", "--out", "c.jsonl", "--overwrite"],
        cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "acting").exists():  # past its reset, at its first turn
            assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
            time.sleep(0.05)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    assert proc.returncode == 130, err
    assert "keeps the earlier run" in err and "no episode of this run ended (" in err, err
    assert "--resume" not in err + out
    assert {k: v for k, v in _files(tmp_path).items() if k not in ("acting", "slow.py")} == before


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (lambda text: text.replace('policy = "random"', 'policy = "auto"'), "policy"),
        (lambda text: "".join(line for line in text.splitlines(keepends=True) if not line.startswith("max-turns")),
         "max-turns removed"),
        (lambda text: text.replace("seed = 0", "seed = 5"), "seed"),
        # Without its digest line no edit could be told apart: the digest goes, the seed changes.
        (lambda text: "".join(line for line in text.replace("seed = 0", "seed = 5").splitlines(keepends=True)
                              if not line.startswith("options_sha256")), "digest removed"),
    ],
)
def test_a_resume_refuses_a_run_file_edited_by_hand(tmp_path: Path, edit, what: str) -> None:
    """Nothing told the options a run wrote from ones edited into its file: a resume played the
    pairs left with another policy (or without the turn limit) and pooled both under one run."""
    assert envsdk(*FROZEN, "--episodes", "3", "--out", "c.jsonl", cwd=tmp_path).returncode == 0
    out, run_file = tmp_path / "c.jsonl", tmp_path / "c.run.toml"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:2]))  # as if stopped
    original = run_file.read_text(encoding="utf-8")
    edited = edit(original)
    assert edited != original, what
    run_file.write_text(edited, encoding="utf-8")
    before = _files(tmp_path)
    refused = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "c.run.toml", "options_sha256" if what == "digest removed" else "edited since the run")
    assert _files(tmp_path) == before
    # How it runs may change by hand, and a line of a default may go; the edit put back resumes.
    harmless = original.replace("concurrency = 8", "concurrency = 2").replace('record = "lean"\n', "")
    assert harmless != original and "record" not in harmless.split("[run]")[0]
    run_file.write_text(harmless, encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(by_pair(out)) == 6


def test_what_a_run_planned_is_read_from_its_run_file_wherever_the_report_runs(tmp_path: Path) -> None:
    """The planned size came from the dataset path in the run file, read from the folder the
    report ran in: a whole run was reported as cut short against another rows.jsonl there."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"env_config": {"name": "frozen_lake", "seed": s}}) + "\n" for s in range(4)),
                    encoding="utf-8")
    played = envsdk("rollout", "--dataset", "rows.jsonl", "--policy", "random", "--rollouts-per-example", "2",
                    "--max-turns", "3", "--no-progress", "--out", "sub/c.jsonl", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    table = read_run_file(tmp_path / "sub" / "c.run.toml")["run"]
    assert (table["examples"], table["rollouts"]) == (4, 2)
    other = tmp_path / "other"
    other.mkdir()
    (other / "rows.jsonl").write_text("{}\n" * 9, encoding="utf-8")
    reported = envsdk("report", "../sub/c.jsonl", "--out-dir", "rep", cwd=other)
    assert reported.returncode == 0, reported.stderr
    assert "cut short" not in reported.stdout + reported.stderr
    out = tmp_path / "sub" / "c.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:5]))
    reported = envsdk("report", "../sub/c.jsonl", "--out-dir", "rep", cwd=other)
    assert "cut short: the run planned 4 examples x 2 rollouts" in reported.stdout + reported.stderr


def test_a_resume_refused_by_its_preflight_repairs_nothing_yet(tmp_path: Path) -> None:
    """A resume cut the torn last line and moved the error records aside before its pre-flight
    found no server: a run refused before it plays had changed the records (the usual case: the
    server that left the error records is not back yet)."""
    assert envsdk(*FROZEN, "--episodes", "3", "--out", "c.jsonl", cwd=tmp_path).returncode == 0
    out = tmp_path / "c.jsonl"
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    failed = {**json.loads(lines[1]), "status": "error", "reason": "ConnectionError: gone"}
    out.write_text("".join([lines[0], json.dumps(failed) + "\n", *lines[2:4], lines[4][:40]]), encoding="utf-8")
    before = _files(tmp_path)
    refused = envsdk("rollout", "--resume", "--out", "c.jsonl", "--base-url", "http://127.0.0.1:9", "--no-progress",
                     cwd=tmp_path)
    assert refused.returncode == 1
    assert_one_line_error(refused, "http://127.0.0.1:9")
    assert "cut a torn last line" not in refused.stderr and "moved to" not in refused.stderr
    assert _files(tmp_path) == before
    resumed = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "cut a torn last line (40 bytes)" in resumed.stderr and "1 record(s) that ended in an error" in resumed.stderr
    assert len(by_pair(out)) == 6
    assert [json.loads(line)["status"] for line in (tmp_path / "c.replaced.jsonl").read_text().splitlines()] == ["error"]


def test_an_out_that_links_into_a_folder_not_made_yet_is_written_through(tmp_path: Path) -> None:
    """The writer made the link's folder, not its target's: a traceback, and a run file left
    beside no records."""
    (tmp_path / "d.jsonl").symlink_to(Path("nodir") / "x.jsonl")
    played = envsdk(*FROZEN, "--episodes", "2", "--out", "d.jsonl", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert (tmp_path / "d.jsonl").is_symlink()
    assert len(by_pair(tmp_path / "nodir" / "x.jsonl")) == 4


def test_a_run_file_that_links_to_a_pipe_or_device_replaces_the_link_not_what_it_leads_to(tmp_path: Path) -> None:
    """A file replaced whole through a link replaced what the link led to: a run file linked to
    /dev/null (a user's way to keep none) had the run's root process rename its temporary file
    over /dev/null itself; the test suite's own link to /dev/zero did that to /dev/zero. Here a
    pipe in another folder stands for the device."""
    (tmp_path / "elsewhere").mkdir()
    sink = tmp_path / "elsewhere" / "sink"
    os.mkfifo(sink)
    (tmp_path / "c.run.toml").symlink_to(Path("elsewhere") / "sink")
    played = envsdk(*FROZEN, "--episodes", "1", "--out", "c.jsonl", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert stat.S_ISFIFO(sink.lstat().st_mode), "the pipe the link led to was replaced by a file"
    # The link itself gave way to the run file, which repeats the run.
    assert not (tmp_path / "c.run.toml").is_symlink()
    assert read_run_file(tmp_path / "c.run.toml")["run"]["examples"] == 1
