"""`hold_records`: one process at a time writes a records file, holds nest within a process, and a
released hold leaves nothing behind."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envsdk.records import LockFileError, hold_records, lock_path, rehold, write_atomically
from envsdk.testing import stop_process

pytestmark = pytest.mark.timeout(120)

# A child that takes and releases the hold ROUNDS times, writing "<pid> in" and "<pid> out" to a
# shared log inside each hold: with holds exclusive, every "in" is followed by its own "out".
CONTENDER = """\
import os, sys, time
from envsdk.records import RecordsBusy, hold_records
records, log, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
taken = 0
while taken < rounds:
    try:
        with hold_records(records):
            with open(log, "a") as f:
                f.write(f"{os.getpid()} in\\n")
            time.sleep(0.001)
            with open(log, "a") as f:
                f.write(f"{os.getpid()} out\\n")
        taken += 1
    except RecordsBusy as busy:
        with open(log + ".refused", "a") as f:
            f.write(f"{busy}\\n")
"""


def _try_in_child(records: Path) -> str:
    """What another process gets when it asks for `records`: "held" or the error's text."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from envsdk.records import RecordsBusy, hold_records\n"
         "try:\n    with hold_records(sys.argv[1]): print('held')\nexcept RecordsBusy as e: print(e)", str(records)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_holds_nest_in_a_process_and_exclude_others_until_the_last_ends(tmp_path: Path) -> None:
    records = tmp_path / "runs" / "completions.jsonl"  # the folder does not exist yet
    with hold_records(records):
        with hold_records(records):
            assert lock_path(records).read_text() == f"{os.getpid()}\n"
        busy = _try_in_child(records)
        assert "completions.jsonl is being written by another process" in busy
        assert f"pid {os.getpid()}" in busy
    assert not lock_path(records).exists()
    assert _try_in_child(records) == "held"
    assert not lock_path(records).exists()


def test_a_stale_lock_file_of_a_killed_holder_is_taken_over(tmp_path: Path) -> None:
    records = tmp_path / "completions.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from envsdk.records import hold_records\n"
         "with hold_records(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)", str(records)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert f"pid {holder.pid}" in _try_in_child(records)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert lock_path(records).exists()  # SIGKILL: nothing removed it
    with hold_records(records):
        pass
    assert not lock_path(records).exists()


def test_holds_taken_and_released_in_a_race_never_overlap(tmp_path: Path) -> None:
    """Each release removes the lock file while another process may have it open: that process
    must see that the name now leads elsewhere and try again, or two would hold at once."""
    records, log = tmp_path / "c.jsonl", tmp_path / "log"
    script = tmp_path / "contender.py"
    script.write_text(CONTENDER, encoding="utf-8")
    children = [subprocess.Popen([sys.executable, str(script), str(records), str(log), "150"]) for _ in range(3)]
    try:
        for child in children:
            assert child.wait(timeout=100) == 0
    finally:
        for child in children:
            stop_process(child)
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * 3 * 150
    for entered, left in zip(lines[::2], lines[1::2]):
        pid = entered.split()[0]
        assert (entered, left) == (f"{pid} in", f"{pid} out"), "two processes held the file at once"
    assert not lock_path(records).exists()
    # Every refusal named its holder, even one that came while the holder was still writing its pid.
    refused = (tmp_path / "log.refused").read_text().splitlines() if (tmp_path / "log.refused").exists() else []
    assert all(re.search(r"\(pid \d+\)", line) for line in refused), [x for x in refused if "pid unknown" in x][:3]


def test_every_name_of_a_held_file_is_held(tmp_path: Path) -> None:
    """A symbolic link to the records file, a hard link to it, or a path through a linked folder
    name the same file: each is refused while it is held (a hard link by the file's own lock)."""
    folder = tmp_path / "run"
    folder.mkdir()
    records = folder / "c.jsonl"
    records.write_text("a record\n")
    (folder / "alias.jsonl").symlink_to("c.jsonl")
    os.link(records, folder / "hard.jsonl")
    (tmp_path / "linked").symlink_to(folder)
    with hold_records(records):
        for name in (folder / "alias.jsonl", folder / "hard.jsonl", tmp_path / "linked" / "c.jsonl", folder / ".." / "run" / "c.jsonl"):
            busy = _try_in_child(name)
            assert f"pid {os.getpid()}" in busy and name.name in busy, (name, busy)
    # A hold taken through the hard link holds the file against its first name too.
    with hold_records(folder / "hard.jsonl"):
        assert f"pid {os.getpid()}" in _try_in_child(records)
    assert _try_in_child(records) == "held"


def test_a_busy_file_without_the_kernels_lock_list_is_still_refused_as_busy(tmp_path: Path) -> None:
    """Where the kernel's list of locks cannot be read (no /proc, or a container hiding it), the
    holder's pid comes from the lock file or is "unknown"; a file held under another name (whose
    own descriptor is open for writing only) is still refused as busy, not with an OS error."""
    records = tmp_path / "c.jsonl"
    records.write_text("a record\n")
    os.link(records, tmp_path / "hard.jsonl")
    child = (
        "import builtins, sys\n"
        "real = builtins.open\n"
        "def hidden(file, *a, **k):\n"
        "    if file == '/proc/locks': raise PermissionError(13, 'hidden', file)\n"
        "    return real(file, *a, **k)\n"
        "builtins.open = hidden\n"
        "from envsdk.records import RecordsBusy, hold_records\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        with hold_records(name): print('held')\n"
        "    except RecordsBusy as e: print(e)\n"
    )
    with hold_records(records):
        done = subprocess.run(
            [sys.executable, "-c", child, str(records), str(tmp_path / "hard.jsonl")],
            capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 0, done.stderr
    same_name, other_name = done.stdout.splitlines()
    assert f"c.jsonl is being written by another process (pid {os.getpid()})" in same_name  # from the lock file
    assert "hard.jsonl is being written by another process (pid unknown) under another name" in other_name


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "folder", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused_not_written_through(tmp_path: Path, kind: str) -> None:
    records = tmp_path / "c.jsonl"
    lock = lock_path(records)
    victim = tmp_path / "victim.txt"
    if kind == "symlink":
        victim.write_text("precious\n")
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(victim)
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    with pytest.raises(LockFileError, match=f"{lock.name} is .*remove it"), hold_records(records):
        pass
    if kind == "symlink":
        assert victim.read_text() == "precious\n"
    else:
        assert not victim.exists()
    assert lock.is_symlink() or lock.exists()  # left for the user to look at


def test_a_filesystem_without_locks_is_written_unheld_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    records = tmp_path / "c.jsonl"
    with caplog.at_level(logging.WARNING, logger="envsdk"), hold_records(records):
        records.write_text("written\n")
    assert "no file locks" in caplog.text and "c.jsonl" in caplog.text
    assert records.read_text() == "written\n"


def test_other_lock_errors_are_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(fd: int, operation: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", denied)
    with pytest.raises(OSError, match="Bad file descriptor"), hold_records(tmp_path / "c.jsonl"):
        pass


def test_a_foreign_file_where_the_lock_goes_is_neither_written_nor_removed(tmp_path: Path) -> None:
    records = tmp_path / "uv.jsonl"
    foreign = lock_path(records)
    foreign.write_text("version = 1\n")
    with pytest.raises(LockFileError, match="not a lock file of this package"), hold_records(records):
        pass
    assert foreign.read_text() == "version = 1\n"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_records_path_that_is_not_a_file_is_refused_before_anything_is_made(tmp_path: Path, kind: str) -> None:
    records = tmp_path / "out"
    records.mkdir() if kind == "folder" else os.mkfifo(records)
    with pytest.raises(LockFileError, match="out is (a folder|not a regular file)"), hold_records(records):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_hold_whose_folder_was_moved_leaves_the_next_runs_lock_alone(tmp_path: Path) -> None:
    """A run's folder moved while it runs, and a new run started at the old path: the first one's
    end must not remove the second one's lock file (which stands where its own used to)."""
    with hold_records(tmp_path / "g" / "c.jsonl"):
        (tmp_path / "g").rename(tmp_path / "g2")
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sys; from envsdk.records import hold_records\n"
             "with hold_records(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()", str(tmp_path / "g" / "c.jsonl")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # The first hold has ended (above): the second one's lock file is still there, and holds.
        assert lock_path(tmp_path / "g" / "c.jsonl").exists()
        assert f"pid {holder.pid}" in _try_in_child(tmp_path / "g" / "c.jsonl")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        stop_process(holder)


def test_rehold_locks_the_file_a_compaction_renamed_over_the_held_one(tmp_path: Path) -> None:
    records = tmp_path / "c.jsonl"
    records.write_text("old\n")
    with hold_records(records):
        write_atomically(records, "compacted\n")  # a new file under the held name
        os.link(records, tmp_path / "new.jsonl")
        assert _try_in_child(tmp_path / "new.jsonl") == "held"  # the gap: the new file was not locked
        rehold(records)
        assert f"pid {os.getpid()}" in _try_in_child(tmp_path / "new.jsonl")


def test_a_file_replaced_whole_keeps_its_permissions(tmp_path: Path) -> None:
    """A compaction or a re-score replaces the records file: it stays readable to whom it was."""
    kept, new = tmp_path / "kept.jsonl", tmp_path / "new.jsonl"
    kept.write_text("old\n")
    kept.chmod(0o640)
    write_atomically(kept, "compacted\n")
    write_atomically(new, "made\n")
    assert (kept.stat().st_mode & 0o777, kept.read_text()) == (0o640, "compacted\n")
    assert new.stat().st_mode & 0o777 == 0o644
