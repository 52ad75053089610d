"""``envsdk rollout --resume``: a run killed at random moments, resumed each time, ends with
exactly the records of an uninterrupted run, each (example, index) once."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from envsdk import evaluate
from envsdk.evaluate import _put_aside, recover_torn_tail
from envsdk.testing import stop_process
from tests.cli.conftest import ENVSDK, ServeFn, assert_one_line_error, envsdk, start_interruptible, user_env
from tests.eval.conftest import by_pair, comparable, grow_to_64_mb, peak_rss_kb, records

pytestmark = pytest.mark.timeout(300)

EXAMPLES, ROLLOUTS = 4, 3
PAIRS = sorted((f"seed-{n}", i) for n in range(EXAMPLES) for i in range(ROLLOUTS))


def _rollout_args(url: str, out: str) -> list[str]:
    return [
        "rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes", str(EXAMPLES),
        "--rollouts-per-example", str(ROLLOUTS), "--concurrency", "2", "--no-progress", "--out", out,
    ]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _kill_when(proc: subprocess.Popen[str], out: Path, after_lines: int, extra_s: float, how: int) -> None:
    """Send `how` once `out` holds `after_lines` records (plus `extra_s`), or when it exits first."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and _lines(out) < after_lines and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(extra_s)
    if proc.poll() is None:
        proc.send_signal(how)
    proc.wait(timeout=60)


def test_resume_after_kills_at_random_moments_writes_every_pair_exactly_once(workdir: Path, serve: ServeFn) -> None:
    # Steps slow enough (a run takes about a second) that a kill lands while episodes are in flight.
    url = serve("graded:app", cwd=workdir, env={**user_env(), "GRADED_STEP_S": "0.15"})
    straight = envsdk(*_rollout_args(url, "straight.jsonl"), cwd=workdir)
    assert straight.returncode == 0, straight.stderr
    expected = {pair: comparable(r) for pair, r in by_pair(workdir / "straight.jsonl").items()}
    assert sorted(expected) == PAIRS

    rng = random.Random(27)
    out = workdir / "killed.jsonl"
    attempts = 0
    for trial in range(10):
        # Kill (SIGKILL, or Ctrl-C or a job scheduler's SIGTERM for one trial in four each) after a
        # random number of new records, a random moment later: before the first record, between
        # records, or while one is being written.
        how = (signal.SIGKILL, signal.SIGKILL, signal.SIGINT, signal.SIGTERM)[trial % 4]
        args = _rollout_args(url, out.name) + (["--resume"] if trial else [])
        proc = start_interruptible([str(ENVSDK), *args], cwd=workdir, env=user_env(), text=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        had = _lines(out)
        try:
            # after 0 to all-but-one of the records still missing
            _kill_when(proc, out, had + rng.randrange(max(len(PAIRS) - had, 1)), rng.uniform(0, 0.15), how)
        finally:
            stop_process(proc)
        attempts += 1
        if out.is_file():
            by_pair(out)  # never a pair twice, even mid-run
    final = envsdk(*_rollout_args(url, out.name), "--resume", cwd=workdir)
    assert final.returncode == 0, final.stderr
    got = by_pair(out)
    assert sorted(got) == PAIRS
    assert {pair: comparable(r) for pair, r in got.items()} == expected
    # The summary of all attempts' records (the earlier ones read from the file, the last
    # attempt's from its writer) is the uninterrupted run's.
    assert json.loads((workdir / "killed.eval.json").read_text()) == json.loads((workdir / "straight.eval.json").read_text())
    # Each record names its run (one for all attempts) and the attempt that wrote it.
    assert len({r["eval"]["run"] for r in got.values()}) == 1
    assert all(1 <= r["eval"]["attempt"] <= attempts + 1 for r in got.values())
    assert len({r["eval"]["attempt"] for r in got.values()}) >= 2  # the kills did land mid-run
    again = envsdk(*_rollout_args(url, out.name), "--resume", cwd=workdir)
    assert again.returncode == 0 and "nothing left to play" in again.stdout
    assert by_pair(out) == got


def test_a_torn_last_line_is_cut_and_its_episode_played_again(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "c.jsonl"), cwd=workdir).returncode == 0
    out = workdir / "c.jsonl"
    whole = out.read_bytes()
    last_start = whole.rstrip(b"\n").rfind(b"\n") + 1
    lost = json.loads(whole[last_start:])
    out.write_bytes(whole[: last_start + 40])  # the writer died 40 bytes into the last record
    resumed = envsdk(*_rollout_args(url, "c.jsonl"), "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    got = by_pair(out)
    assert sorted(got) == PAIRS
    pair = (lost["eval"]["example"], lost["eval"]["index"])
    assert got[pair]["eval"]["attempt"] == 2 and comparable(got[pair]) == comparable(lost)


def test_records_of_a_server_that_went_away_are_played_again_on_resume(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    down = "http://127.0.0.1:9"  # nothing listens: every episode ends in an error
    failed = envsdk(*_rollout_args(down, "r.jsonl"), cwd=workdir)
    assert failed.returncode == 1
    errors = records(workdir / "r.jsonl") if (workdir / "r.jsonl").is_file() else []
    resumed = envsdk(*_rollout_args(url, "r.jsonl"), "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    got = by_pair(workdir / "r.jsonl")
    assert sorted(got) == PAIRS and all(r["status"] == "done" for r in got.values())
    if errors:  # kept aside, not lost
        assert len(records(workdir / "r.replaced.jsonl")) == len(errors)


def test_a_compaction_cut_short_neither_repeats_nor_tears_the_replaced_file(workdir: Path, serve: ServeFn) -> None:
    """A resume killed while it compacts (after it put the records it replaces aside, before it
    rewrote the records file, here part-way through the last one) left them in both files: the
    next resume put them aside a second time, after a torn line."""
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "r.jsonl"), cwd=workdir).returncode == 0
    out = workdir / "r.jsonl"
    # Two records written twice (what compaction moves aside, as it moves those of errors).
    twice = out.read_bytes().splitlines(keepends=True)[:2]
    with out.open("ab") as handle:
        handle.writelines(twice)
    (workdir / "r.replaced.jsonl").write_bytes(twice[0] + twice[1][:40])
    resumed = envsdk(*_rollout_args(url, "r.jsonl"), "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(by_pair(out)) == PAIRS
    moved = sorted(json.loads(line)["uuid"] for line in twice)
    assert sorted(r["uuid"] for r in records(workdir / "r.replaced.jsonl")) == moved


def test_putting_records_aside_reads_the_replaced_file_line_by_line_not_whole(tmp_path: Path) -> None:
    """The replaced-records file grows with every resumed run that replays errors (a Sudoku
    record is a few hundred KB): a compaction held all of it in memory, as one string and then
    as a set of its lines, to find which of the lines it moves were there already."""
    aside = tmp_path / "r.replaced.jsonl"
    old = [json.dumps({"uuid": f"old-{n}", "pad": "x" * 200_000}) + "\n" for n in range(320)]  # 64 MB
    with aside.open("w") as handle:
        handle.writelines(old)
        handle.write('{"uuid": "torn')
    moving = [old[7], json.dumps({"uuid": "new-0"}) + "\n", json.dumps({"uuid": "new-1"}), old[7]]
    tracemalloc.start()
    try:
        _put_aside(aside, lambda: moving)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000, f"{peak / 1e6:.0f} MB held to put 4 lines aside in a 64 MB file"
    kept = aside.read_text().splitlines(keepends=True)
    # What was there stays, the torn line is cut, and each new line is added once.
    assert kept == [*old, json.dumps({"uuid": "new-0"}) + "\n", json.dumps({"uuid": "new-1"}) + "\n"]
    before = aside.stat()
    _put_aside(aside, lambda: moving)  # nothing new: the file is left as it is
    assert (aside.stat().st_ino, aside.stat().st_size) == (before.st_ino, before.st_size)


def test_putting_aside_matches_lines_a_crlf_file_holds_and_replaces_what_is_no_file(tmp_path: Path) -> None:
    """A replaced-records file with "\\r\\n" line ends got a second copy of a line it held; a pipe
    in its place hung the resume (reading it waited for a writer) and a link to /dev/zero read
    without end. A link is to a pipe of the test's own, never to a device of the machine: the
    link to /dev/zero this test had made the write replace /dev/zero itself, for every process
    on a machine whose tests ran as root."""
    line = json.dumps({"uuid": "u1"}) + "\n"
    aside = tmp_path / "r.replaced.jsonl"
    aside.write_bytes(line.encode()[:-1] + b"\r\n")
    _put_aside(aside, lambda: [line])
    assert aside.read_bytes() == line.encode()[:-1] + b"\r\n"  # nothing new: left as it was
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "elsewhere").mkdir()
    os.mkfifo(tmp_path / "elsewhere" / "device")
    (tmp_path / "linked.jsonl").symlink_to(tmp_path / "elsewhere" / "device")
    for name in ("fifo.jsonl", "linked.jsonl"):
        _put_aside(tmp_path / name, lambda: [line])
        assert (tmp_path / name).read_text() == line and (tmp_path / name).is_file()
    assert stat.S_ISFIFO((tmp_path / "elsewhere" / "device").lstat().st_mode)  # what the link led to is left


@pytest.mark.parametrize("command", ["resume", "rescore"])
def test_temporary_files_a_killed_write_left_are_removed_by_the_next_holder(
    workdir: Path, serve: ServeFn, command: str
) -> None:
    """A resume killed while it rewrote the records file (a compaction of a large file takes
    seconds) left its temporary file, as large as the records, and none was ever removed."""
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "r.jsonl"), cwd=workdir).returncode == 0
    target = "r.jsonl" if command == "resume" else "s.jsonl"
    stem = target.split(".")[0]
    stale = [f".{target}.k2x_9q1z.envsdk-tmp", f".{stem}.replaced.jsonl.aaaaaaaa.envsdk-tmp"]
    kept = [f".{target}.notes", f".{target}.k2x_9q1z.tmp", ".other.jsonl.k2x_9q1z.envsdk-tmp"]
    for name in stale + kept:
        (workdir / name).write_text("left\n")
    if command == "resume":
        done = envsdk(*_rollout_args(url, "r.jsonl"), "--resume", cwd=workdir)
        assert done.returncode == 0 and "removed 2 temporary file(s)" in done.stderr, done.stderr
    else:
        done = envsdk("rescore", "r.jsonl", "--weights", "nosuch=0", "--out", "s.jsonl", cwd=workdir)
        assert done.returncode == 2  # refused before it holds --out: nothing is removed yet
        assert all((workdir / name).exists() for name in stale)
        (workdir / "score.py").write_text("def score(record):\n    return 1.0\n", encoding="utf-8")
        done = envsdk("rescore", "r.jsonl", "--score", "score.py:score", "--out", "s.jsonl", cwd=workdir)
        assert done.returncode == 0, done.stderr
        stale = stale[:1]  # rescore writes no replaced-records file: that one is not its own
    assert not [name for name in stale if (workdir / name).exists()]
    assert all((workdir / name).read_text() == "left\n" for name in kept)


@pytest.mark.parametrize("where", ["records", "replaced"])
def test_a_line_that_is_not_utf8_is_named_in_one_line(workdir: Path, serve: ServeFn, where: str) -> None:
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "r.jsonl"), cwd=workdir).returncode == 0
    out = workdir / "r.jsonl"
    lines = out.read_bytes().splitlines(keepends=True)
    bad = lines[1].replace(b'"seed-', b'"seed-\xff', 1)
    if where == "records":
        out.write_bytes(b"".join([lines[0], bad, *lines[2:]]))
        named = "r.jsonl:2: not UTF-8 text"
    else:
        out.write_bytes(b"".join([*lines, lines[0]]))  # a pair twice: compaction moves one aside
        (workdir / "r.replaced.jsonl").write_bytes(lines[3] + bad)
        named = "r.replaced.jsonl:2: not UTF-8 text"
    before = out.read_bytes()
    resumed = envsdk(*_rollout_args(url, "r.jsonl"), "--resume", cwd=workdir)
    assert resumed.returncode == 2
    assert_one_line_error(resumed, named)
    assert out.read_bytes() == before  # refused before any repair


def test_a_resume_neither_holds_its_records_file_nor_its_records_whole(workdir: Path, serve: ServeFn) -> None:
    """A resume's compaction held the whole records file as lines and as parsed records, and its
    summary parsed every earlier record at once: about three times the file in memory, for a file
    of tens of KB per episode (more with a model's text and token ids) and any number of them."""
    url = serve("graded:app", cwd=workdir)
    args = _rollout_args(url, "r.jsonl")
    assert envsdk(*args, cwd=workdir).returncode == 0
    out = workdir / "r.jsonl"
    grow_to_64_mb(out)  # a pair written again 64 times: what compaction moves aside
    resume = [str(ENVSDK), *args, "--resume"]
    large = peak_rss_kb(resume, workdir)
    assert sorted(by_pair(out)) == PAIRS and len(records(workdir / "r.replaced.jsonl")) == 1
    small = peak_rss_kb(resume, workdir)  # the same resume over the compacted 12 records
    assert large - small < 24_000, f"a resume over a 64 MB file took {(large - small) / 1000:.0f} MB more"


def test_resume_refuses_options_that_change_what_the_run_plays(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "s.jsonl"), cwd=workdir).returncode == 0
    refused = envsdk(*_rollout_args(url, "s.jsonl"), "--resume", "--seed", "5", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, "--seed 5", "--resume")
    # The options stored with the run are enough to resume it.
    assert envsdk("rollout", "--resume", "--out", "s.jsonl", "--no-progress", cwd=workdir).returncode == 0


@pytest.mark.parametrize(
    "option",
    [["--max-turns", "1"], ["--env-config", '{"reset_kwargs": {"level": "hard"}}'], ["--temperature", "0.5"]],
    ids=["max-turns", "env-config", "temperature"],
)
def test_resume_refuses_an_option_the_run_left_unset(workdir: Path, serve: ServeFn, option: list[str]) -> None:
    """An option the first run did not set is not in its run file; giving it to the resume would
    play the pairs left under other rules than the records already there."""
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "u.jsonl"), cwd=workdir).returncode == 0
    out = workdir / "u.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:-1]))  # one pair left to play
    before, run_file = out.read_bytes(), (workdir / "u.run.toml").read_bytes()
    refused = envsdk("rollout", "--resume", "--out", "u.jsonl", "--no-progress", *option, cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, option[0], "not set")
    assert out.read_bytes() == before and (workdir / "u.run.toml").read_bytes() == run_file
    assert envsdk("rollout", "--resume", "--out", "u.jsonl", "--no-progress", cwd=workdir).returncode == 0
    assert sorted(by_pair(out)) == PAIRS


def test_resume_refuses_a_file_holding_another_runs_records(workdir: Path, serve: ServeFn) -> None:
    """Records of another run (a file copied over this one, or written through another name) are
    not this run's: counting them would skip its pairs and report the other run's results."""
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "mine.jsonl"), cwd=workdir).returncode == 0
    assert envsdk(*_rollout_args(url, "theirs.jsonl"), cwd=workdir).returncode == 0
    mine, theirs = records(workdir / "mine.jsonl"), records(workdir / "theirs.jsonl")
    other_run = theirs[0]["eval"]["run"]
    assert other_run != mine[0]["eval"]["run"]
    # With a torn last line too, which a resume repairs, but not one that is refused.
    (workdir / "mine.jsonl").write_bytes((workdir / "theirs.jsonl").read_bytes() + b'{"torn')
    before = (workdir / "mine.jsonl").read_bytes()
    refused = envsdk("rollout", "--resume", "--out", "mine.jsonl", "--no-progress", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, other_run, mine[0]["eval"]["run"])
    assert (workdir / "mine.jsonl").read_bytes() == before
    # One foreign record among the run's own is refused too, and nothing is moved aside.
    own = (workdir / "theirs.jsonl").read_bytes().splitlines(keepends=True)
    mixed = [*own[:-1], json.dumps({**mine[0], "eval": {**mine[0]["eval"]}}).encode() + b"\n"]
    (workdir / "theirs.jsonl").write_bytes(b"".join(mixed))
    refused = envsdk("rollout", "--resume", "--out", "theirs.jsonl", "--no-progress", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, mine[0]["eval"]["run"])
    assert (workdir / "theirs.jsonl").read_bytes() == b"".join(mixed)
    assert not (workdir / "theirs.replaced.jsonl").exists()


def test_resume_refuses_a_dataset_that_changed_since_the_run_began(tmp_path: Path) -> None:
    """The run file keeps only the dataset's path: rows edited between the runs were played as
    the same examples, one group holding two different games, without a word."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"env_config": {"name": "frozen_lake", "seed": s}}) + "\n" for s in (1, 2, 3)),
                    encoding="utf-8")
    args = ["rollout", "--dataset", "rows.jsonl", "--policy", "random", "--rollouts-per-example", "2", "--max-turns",
            "3", "--no-progress", "--out", "d.jsonl"]
    assert envsdk(*args, cwd=tmp_path).returncode == 0
    out = tmp_path / "d.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:-1]))
    with out.open("ab") as handle:
        handle.write(b'{"torn')  # what a resume repairs, but not a refused one
    before = out.read_bytes()
    original = rows.read_bytes()
    rows.write_bytes(original.replace(b'"seed": 3', b'"seed": 7'))
    refused = envsdk("rollout", "--resume", "--out", "d.jsonl", "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "rows.jsonl", "not the file the run began with")
    assert out.read_bytes() == before
    rows.write_bytes(original)  # the rows as they were: the run goes on
    resumed = envsdk("rollout", "--resume", "--out", "d.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(by_pair(out)) == 6


def test_resume_without_its_run_file_is_refused_while_records_are_there(workdir: Path, serve: ServeFn) -> None:
    """Without the run file nothing says which options played the records: continuing their run
    id under the options given now hid two sets of rules under one run."""
    url = serve("graded:app", cwd=workdir)
    assert envsdk(*_rollout_args(url, "n.jsonl"), cwd=workdir).returncode == 0
    out = workdir / "n.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:-1]))
    (workdir / "n.run.toml").rename(workdir / "kept.toml")
    before = out.read_bytes()
    refused = envsdk(*_rollout_args(url, "n.jsonl"), "--resume", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, "n.run.toml", "cannot be checked")
    assert out.read_bytes() == before
    (workdir / "kept.toml").rename(workdir / "n.run.toml")
    # A record whose tag names no run is named as such, not as "run None".
    lines = out.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    del first["eval"]["run"]
    out.write_bytes(json.dumps(first).encode() + b"\n" + b"".join(lines[1:]))
    refused = envsdk(*_rollout_args(url, "n.jsonl"), "--resume", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, "record 1", "no run id")
    assert "None" not in refused.stderr


def test_recover_torn_tail_keeps_a_whole_record_missing_only_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    assert recover_torn_tail(path) == 0 and path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    path.write_bytes(b'{"a": 1}\n{"b": ')
    assert recover_torn_tail(path) == len(b'{"b": ') and path.read_bytes() == b'{"a": 1}\n'
    path.write_bytes(b'{"b": ')
    assert recover_torn_tail(path) == 6 and path.read_bytes() == b""


def test_an_unfinished_last_line_of_many_megabytes_is_not_read_into_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every resume looks for a torn last line: the whole unfinished line was read back (in
    ever doubling windows) and handed to the JSON parser, so a records file ending in gigabytes
    without a newline was held in memory. Above the read limit (lowered here from 64 MB) it is
    cut unread, and its pair played again."""
    monkeypatch.setattr(evaluate, "TAIL_READ_LIMIT", 1 << 20, raising=False)
    path = tmp_path / "c.jsonl"
    head = json.dumps({"uuid": "kept"}) + "\n"
    with path.open("w") as handle:
        handle.write(head)
        handle.write(json.dumps({"uuid": "torn", "pad": "x" * (24 << 20)}))  # whole, but 24 MB long
    tracemalloc.start()
    try:
        start = evaluate.torn_start(path)
        cut = recover_torn_tail(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, f"{peak / 1e6:.0f} MB held to find a torn last line"
    assert start == len(head) and cut > 24 << 20 and path.read_text() == head
    # Under the limit, a whole record missing only its newline is still kept.
    path.write_text(head + json.dumps({"uuid": "whole", "pad": "x" * 1000}))
    assert evaluate.torn_start(path) is None and recover_torn_tail(path) == 0 and path.read_text().endswith("}\n")


def test_a_second_rollout_into_a_run_still_writing_is_refused_and_loses_nothing(workdir: Path, serve: ServeFn) -> None:
    """A second ``envsdk rollout`` into the --out of a run that is still writing (a scheduler that
    restarts a job it thinks hung, a second terminal) must not interleave with it: ``--resume``
    would compact the file under the first run (whose later records then go to the replaced
    file) and play the same missing pairs again, ``--overwrite`` would truncate its records."""
    url = serve("graded:app", cwd=workdir, env={**user_env(), "GRADED_STEP_S": "0.05"})
    out = workdir / "busy.jsonl"
    first = start_interruptible([str(ENVSDK), *_rollout_args(url, out.name)], cwd=workdir, env=user_env(), text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _lines(out) < 1 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert first.poll() is None and _lines(out) < len(PAIRS), "the first run ended before it could be held"
        # Held mid-run: its records file open, episodes in flight, none of it finished.
        first.send_signal(signal.SIGSTOP)
        try:
            # The file by its own name, through a symbolic link, and through a hard link.
            (workdir / "alias.jsonl").symlink_to(out.name)
            os.link(out, workdir / "hard.jsonl")
            for name, extra in (("busy.jsonl", "--resume"), ("busy.jsonl", "--overwrite"),
                                ("alias.jsonl", "--overwrite"), ("hard.jsonl", "--overwrite")):
                second = envsdk(*_rollout_args(url, name), extra, cwd=workdir, timeout=60)
                assert second.returncode == 2, second
                assert_one_line_error(second, name, f"pid {first.pid}")
        finally:
            first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=120) == 0
    finally:
        stop_process(first)
    got = by_pair(out)
    assert sorted(got) == PAIRS
    assert len({r["eval"]["attempt"] for r in got.values()}) == 1
    # Once the first run has ended, the run is free again.
    again = envsdk(*_rollout_args(url, out.name), "--resume", cwd=workdir)
    assert again.returncode == 0 and "nothing left to play" in again.stdout, again


def test_a_resume_through_a_symbolic_link_writes_the_file_it_points_at(tmp_path: Path) -> None:
    """Replacing a records file (moving error records aside) renamed a new file over the link
    itself: the link became a file holding the finished run, and the file it pointed at kept the
    run as it was before the resume."""
    (tmp_path / "t").mkdir()
    link, real = tmp_path / "link.jsonl", tmp_path / "t" / "real.jsonl"
    link.symlink_to(Path("t") / "real.jsonl")
    args = ["rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--rollouts-per-example", "2",
            "--max-turns", "4", "--no-progress", "--out", "link.jsonl"]
    assert envsdk(*args, cwd=tmp_path).returncode == 0
    lines = real.read_text(encoding="utf-8").splitlines(keepends=True)
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "status": "error", "reason": "RuntimeError: lost"}) + "\n"
    real.write_text("".join(lines), encoding="utf-8")
    resumed = envsdk("rollout", "--resume", "--out", "link.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert sorted(by_pair(real)) == [(f"seed-{s}", i) for s in range(2) for i in range(2)]
    assert all(r["status"] != "error" for r in records(real))
    assert [r["status"] for r in records(tmp_path / "link.replaced.jsonl")] == ["error"]
