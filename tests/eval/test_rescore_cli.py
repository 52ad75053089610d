"""``envsdk rescore``: new rewards and pass@k from saved records, without playing again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envsdk.evaluate import pass_at_k
from envsdk.testing import stop_process
from tests.cli.conftest import ENVSDK, ServeFn, assert_one_line_error, envsdk, user_env
from tests.eval.conftest import by_pair, grow_to_64_mb, peak_rss_kb, records

pytestmark = pytest.mark.timeout(240)

# A changed rubric: an answer is right when it is "wrong" (the opposite of the env's verdict),
# and the number of turns no longer matters.
INVERTED = """\
def inverted(record):
    replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    return {"reward": 2.0 if replies[-1] == "wrong" else 0.0, "success": replies[-1] == "wrong"}
"""


def test_rescore_recomputes_rewards_and_pass_at_k_from_saved_records(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    played = envsdk(
        "rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes", "4",
        "--rollouts-per-example", "2", "--no-progress", cwd=workdir,
    )
    assert played.returncode == 0, played.stderr
    (workdir / "inverted.py").write_text(INVERTED, encoding="utf-8")
    before = (workdir / "completions.jsonl").read_bytes()
    result = envsdk("rescore", "completions.jsonl", "--score", "inverted.py:inverted", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "completions.jsonl").read_bytes() == before  # the saved records are left as they were
    old, new = by_pair(workdir / "completions.jsonl"), by_pair(workdir / "completions.rescored.jsonl")
    assert sorted(old) == sorted(new)
    for pair, record in new.items():
        odd = int(pair[0].split("-")[1]) % 2 == 1  # Parity answers "wrong" to odd questions
        assert record["success"] is odd and record["total_reward"] == (2.0 if odd else 0.0)
        assert record["rescored_from"] == {"total_reward": old[pair]["total_reward"], "success": old[pair]["success"]}
        assert record["messages"] == old[pair]["messages"]
    # Two of four examples now pass in both rollouts: pass@1 = pass@2 = 0.5.
    assert f"pass@1={pass_at_k(2, 2, 1) / 2:.3f}" in result.stdout and "pass@2=0.500" in result.stdout


def test_rescore_neither_holds_the_records_file_nor_its_records_whole(workdir: Path, serve: ServeFn) -> None:
    """Re-scoring held every record parsed, a deep copy of each and the whole output text at once:
    several times the file in memory, for a file of any size."""
    url = serve("graded:app", cwd=workdir)
    played = envsdk("rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes",
                    "4", "--no-progress", "--out", "small.jsonl", cwd=workdir)
    assert played.returncode == 0, played.stderr
    (workdir / "inverted.py").write_text(INVERTED, encoding="utf-8")
    (workdir / "large.jsonl").write_bytes((workdir / "small.jsonl").read_bytes())
    grow_to_64_mb(workdir / "large.jsonl")
    rescore = [str(ENVSDK), "rescore", "--score", "inverted.py:inverted"]
    large = peak_rss_kb([*rescore, "large.jsonl"], workdir)
    assert len(records(workdir / "large.rescored.jsonl")) == 4 + 64
    small = peak_rss_kb([*rescore, "small.jsonl"], workdir)
    assert large - small < 24_000, f"re-scoring a 64 MB file took {(large - small) / 1000:.0f} MB more"


def test_rescore_by_weights_over_the_recorded_components(tmp_path: Path) -> None:
    played = envsdk(
        "rollout", "--env", "sudoku", "--policy", "random", "--episodes", "2", "--rollouts-per-example", "2",
        "--max-turns", "3", "--no-progress", cwd=tmp_path,
    )
    assert played.returncode == 0, played.stderr
    result = envsdk("rescore", "completions.jsonl", "--weights", "valid_move=-2,empty_cell=-2,correct=10", "--out", "w.jsonl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for old, new in zip(records(tmp_path / "completions.jsonl"), records(tmp_path / "w.jsonl")):
        parts = old["reward_components"]
        expected = -2 * parts["valid_move"]["value"] - 2 * parts["empty_cell"]["value"] + 10 * parts["correct"]["value"]
        # A positive sum is not a win: success stays what the record stated (a lost game stays lost).
        assert new["total_reward"] == pytest.approx(expected) and new["success"] is old["success"]
    lost = [r for r in records(tmp_path / "w.jsonl") if r["rescored_from"]["success"] is False and r["total_reward"] > 0]
    assert lost, "no lost game with a positive weighted sum: the check above proved nothing"


def test_rescore_does_not_replace_a_runs_records_unless_told(workdir: Path, serve: ServeFn) -> None:
    """``--out`` naming another run's records replaced them without a word: the run was lost,
    and its run file then described records that were not its own."""
    url = serve("graded:app", cwd=workdir)
    for out, episodes in (("keep.jsonl", "4"), ("other.jsonl", "2")):
        played = envsdk("rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity",
                        "--episodes", episodes, "--no-progress", "--out", out, cwd=workdir)
        assert played.returncode == 0, played.stderr
    (workdir / "inverted.py").write_text(INVERTED, encoding="utf-8")
    kept = (workdir / "keep.jsonl").read_bytes()
    refused = envsdk("rescore", "other.jsonl", "--score", "inverted.py:inverted", "--out", "keep.jsonl", cwd=workdir)
    assert refused.returncode == 2
    assert_one_line_error(refused, "keep.jsonl", "--overwrite")
    assert (workdir / "keep.jsonl").read_bytes() == kept
    # A re-scoring is replaced by the next one: that is what re-scoring again means.
    for _ in range(2):
        again = envsdk("rescore", "other.jsonl", "--weights", "nosuch=1", cwd=workdir)
        assert again.returncode == 2  # (a refused weight writes nothing)
        again = envsdk("rescore", "other.jsonl", "--score", "inverted.py:inverted", cwd=workdir)
        assert again.returncode == 0, again.stderr
    assert len(records(workdir / "other.rescored.jsonl")) == 2
    forced = envsdk("rescore", "other.jsonl", "--score", "inverted.py:inverted", "--out", "keep.jsonl", "--overwrite",
                    cwd=workdir)
    assert forced.returncode == 0, forced.stderr
    assert [r["rescored_from"] is not None for r in records(workdir / "keep.jsonl")] == [True, True]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--score", "nowhere.py:f"], ["nowhere.py"]),
        (["--score", "bad_score.py:returns_text"], ["returned 'yes'", "expected a number"]),
        # An int no float can hold raised OverflowError out of the command: a traceback.
        (["--score", "bad_score.py:huge"], ["record u", "not a finite number"]),
        # Taken as bool(), the string "false" was a success.
        (["--score", "bad_score.py:says_false"], ["success 'false'", "expected true, false or None"]),
        (["--weights", "correct"], ["name=number"]),
        # A misspelt key was dropped without a word, the record keeping the success it had.
        (["--score", "bad_score.py:misspelt"], ["'sucess'", "'reward' and optionally 'success'"]),
        # inf was taken, and the sums came out as "the score ... is not a finite number: nan".
        (["--weights", "correct=inf"], ["'correct=inf'", "a weight is a finite number"]),
        # The last weight of a name won without a word.
        (["--weights", "correct=1,correct=5"], ["'correct' is weighted twice"]),
        # A name no record has would zero every reward: refused, naming the components there are.
        (["--weights", "correct=1,nosuch=1"], ["nosuch", "correct", "valid_move"]),
    ],
)
def test_rescore_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    (tmp_path / "bad_score.py").write_text(
        "def returns_text(record):\n    return 'yes'\n\ndef huge(record):\n    return {'reward': 10**400}\n\n"
        "def says_false(record):\n    return {'reward': 0.0, 'success': 'false'}\n\n"
        "def misspelt(record):\n    return {'reward': 0.0, 'sucess': False}\n", encoding="utf-8"
    )
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 1.0, "success": True,
            "reward_components": {"correct": {"value": 1.0, "steps": []}, "valid_move": {"value": 0.5, "steps": []}}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    result = envsdk("rescore", "c.jsonl", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "c.rescored.jsonl").exists()


#: What an earlier ``envsdk rescore`` left in --out: the next re-scoring may replace it.
EARLIER = json.dumps({"schema": "envsdk.completions/1", "uuid": "u0", "total_reward": 1.0, "success": True,
                      "reward_components": {},
                      "rescored_from": {"total_reward": 0.0, "success": False}}) + "\n"


def test_a_score_that_fails_part_way_leaves_out_as_it_was(tmp_path: Path) -> None:
    """Records are re-scored and written one at a time: a score that raises on the third record
    leaves an earlier --out whole (and no temporary file), as when all were scored first."""
    (tmp_path / "third.py").write_text(
        "def score(record):\n    if record['uuid'] == 'u2':\n        raise KeyError('tests')\n    return 1.0\n",
        encoding="utf-8",
    )
    lines = [{"schema": "envsdk.completions/1", "uuid": f"u{n}", "total_reward": 0.0, "success": False,
              "reward_components": {}} for n in range(5)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "out.jsonl").write_text(EARLIER, encoding="utf-8")
    result = envsdk("rescore", "c.jsonl", "--score", "third.py:score", "--out", "out.jsonl", cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line_error(result, "KeyError", "u2")
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == EARLIER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "out.jsonl", "third.py"]


def test_a_score_that_raises_a_long_message_of_many_lines_is_named_in_one_bounded_line(tmp_path: Path) -> None:
    """A score that runs a test set raises with the tests' output: its message went to stderr
    whole, over many lines (100 KB here), the record it failed on said only after all of it."""
    (tmp_path / "tests_fail.py").write_text(
        "def score(record):\n    raise AssertionError('test_add failed:\\n  expected 3\\n  got 4\\n' + 'x' * 100_000)\n",
        encoding="utf-8",
    )
    _plain_records(tmp_path / "c.jsonl", 2)
    result = envsdk("rescore", "c.jsonl", "--score", "tests_fail.py:score", cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line_error(result, "AssertionError", "on record u0", "test_add failed: expected 3 got 4")
    assert len(result.stderr) < 1_000, f"{len(result.stderr)} characters on stderr"
    assert not (tmp_path / "c.rescored.jsonl").exists()


@pytest.mark.parametrize("given", ["", ".", "/"])
def test_a_folder_of_no_name_given_as_the_records_is_named_not_a_traceback(tmp_path: Path, given: str) -> None:
    """The default --out is made from the records file's name: "." (what "" is) and "/" have
    none, and the command ended in pathlib's ValueError traceback."""
    result = envsdk("rescore", given, "--weights", "a=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "not a file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stderr", ["2>/dev/full", "2>&-"])
def test_a_refusal_whose_stderr_cannot_be_written_keeps_its_status_and_stdout(tmp_path: Path, stderr: str) -> None:
    """The error line went to a stderr that could not take it (a full disk): the write raised
    out of the command, exit 1 and not the refusal's 2; a closed one got it on stdout."""
    done = subprocess.run(["bash", "-c", f'exec "$@" {stderr}', "bash", str(ENVSDK), "rescore", "missing.jsonl",
                           "--weights", "a=1"], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert (done.returncode, done.stdout) == (2, "")


def test_a_component_of_more_digits_than_a_float_holds_is_refused_as_no_finite_number(tmp_path: Path) -> None:
    """--weights over a 401-digit component value was reported as a failure of the score
    "weighted_score.<locals>.score" (OverflowError), exit 1, where a NaN or infinite one is
    refused as not a finite number, exit 2."""
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 1.0, "success": True,
            "reward_components": {"correct": {"value": 10**400, "steps": []}}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    result = envsdk("rescore", "c.jsonl", "--weights", "correct=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "record u", "not a finite number")
    assert "<locals>" not in result.stderr
    assert not (tmp_path / "c.rescored.jsonl").exists()


def _plain_records(path: Path, count: int) -> None:
    path.write_text("".join(json.dumps({"schema": "envsdk.completions/1", "uuid": f"u{n}", "total_reward": 0.0,
                                        "success": False, "reward_components": {}}) + "\n" for n in range(count)),
                    encoding="utf-8")


def test_rescore_stopped_by_sigterm_while_it_writes_leaves_nothing_behind(tmp_path: Path) -> None:
    """The temporary file is there for as long as the scoring takes: a `kill` left it, as large
    as what was written so far, and nothing ever removed it."""
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n"
        "def score(record):\n"
        "    pathlib.Path('scoring').touch()\n"
        "    time.sleep(0.05)\n"
        "    return 1.0\n",
        encoding="utf-8",
    )
    _plain_records(tmp_path / "c.jsonl", 2000)
    (tmp_path / "out.jsonl").write_text(EARLIER, encoding="utf-8")
    proc = subprocess.Popen([str(ENVSDK), "rescore", "c.jsonl", "--score", "slow.py:score", "--out", "out.jsonl"],
                            cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "scoring").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert (tmp_path / "scoring").exists(), "the score was never called"
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    assert proc.returncode == 143, stderr
    assert stderr.strip() == "envsdk rescore: terminated", stderr
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == EARLIER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "out.jsonl", "scoring", "slow.py"]


def test_rescore_scores_the_file_as_it_was_when_it_began(tmp_path: Path) -> None:
    """The records are read twice (checked, then scored and written): what another process adds
    in between, here a record and a torn one, is not part of this re-scoring."""
    (tmp_path / "grow.py").write_text(
        "import json\n"
        "def score(record):\n"
        "    if record['uuid'] == 'u0':\n"
        "        with open('c.jsonl', 'a') as f:\n"
        "            f.write(json.dumps({**record, 'uuid': 'late'}) + '\\n' + '{\"torn')\n"
        "    return 1.0\n",
        encoding="utf-8",
    )
    _plain_records(tmp_path / "c.jsonl", 5)
    result = envsdk("rescore", "c.jsonl", "--score", "grow.py:score", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [r["uuid"] for r in records(tmp_path / "c.rescored.jsonl")] == [f"u{n}" for n in range(5)]


def test_rescore_names_a_line_that_is_not_utf8_in_one_line(tmp_path: Path) -> None:
    """It raised UnicodeDecodeError from the middle of reading: a traceback, status 1."""
    _plain_records(tmp_path / "c.jsonl", 3)
    lines = (tmp_path / "c.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "c.jsonl").write_bytes(lines[0] + lines[1].replace(b'"u1"', b'"u\xff1"') + lines[2])
    result = envsdk("rescore", "c.jsonl", "--weights", "a=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "c.jsonl:2: not UTF-8 text")
    assert not (tmp_path / "c.rescored.jsonl").exists()


@pytest.mark.timeout(120)
def test_rescore_into_a_file_another_process_is_writing_is_refused_and_leaves_it(tmp_path: Path) -> None:
    """`--out` of a run still writing: replacing it would send the run's later records to a file
    that no longer has a name."""
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 1.0, "success": True,
            "reward_components": {"correct": {"value": 1.0, "steps": []}}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    live = tmp_path / "live.jsonl"
    live.write_text("a record being written\n", encoding="utf-8")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from envsdk.records import hold_records\n"
         "with hold_records(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()", str(live)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = envsdk("rescore", "c.jsonl", "--weights", "correct=2", "--out", live.name, cwd=tmp_path)
        assert result.returncode == 2
        assert_one_line_error(result, "live.jsonl", f"pid {holder.pid}")
        assert live.read_text(encoding="utf-8") == "a record being written\n"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder's cue to let go
        stop_process(holder)
    # Free again once the holder is gone (its records are a run's: replaced only when told).
    result = envsdk("rescore", "c.jsonl", "--weights", "correct=2", "--out", live.name, "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert records(live)[0]["total_reward"] == 2.0


def test_rescore_with_a_folder_where_its_lock_file_goes_says_so_in_one_line(tmp_path: Path) -> None:
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 1.0, "success": True,
            "reward_components": {"correct": {"value": 1.0, "steps": []}}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    (tmp_path / "out.envsdk.lock").mkdir()
    result = envsdk("rescore", "c.jsonl", "--weights", "correct=2", "--out", "out.jsonl", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "out.envsdk.lock is a folder", "remove it")
    assert not (tmp_path / "out.jsonl").exists()
    # A file where the output's folder should be: one line too, not a traceback.
    result = envsdk("rescore", "c.jsonl", "--weights", "correct=2", "--out", "c.jsonl/x/o.jsonl", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "cannot write --out c.jsonl/x/o.jsonl there")


def test_a_torn_last_line_and_a_folder_are_named_for_what_they_are(tmp_path: Path) -> None:
    """A torn last line was refused with "only a torn last line is repaired" (it was one, and
    rescore repairs nothing) and json's message cut at "…character at"; a folder was "no such file"."""
    _plain_records(tmp_path / "c.jsonl", 2)
    with (tmp_path / "c.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"sch')
    result = envsdk("rescore", "c.jsonl", "--weights", "a=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "c.jsonl:3", "cut off", "column 6", "--resume")
    assert "only a torn last line is repaired" not in result.stderr
    (tmp_path / "d.jsonl").mkdir()
    result = envsdk("rescore", "d.jsonl", "--weights", "a=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "d.jsonl", "not a file")


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_reward_of_more_digits_than_a_float_holds_is_named_in_one_line(tmp_path: Path, digits: int) -> None:
    """A 400-digit int raised OverflowError, a 5000-digit one Python's digit limit: tracebacks."""
    _plain_records(tmp_path / "c.jsonl", 2)
    lines = (tmp_path / "c.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = lines[1].replace('"total_reward": 0.0', f'"total_reward": {"9" * digits}')
    (tmp_path / "c.jsonl").write_text("".join(lines), encoding="utf-8")
    result = envsdk("rescore", "c.jsonl", "--weights", "a=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "c.jsonl:2")


def test_a_success_that_is_not_true_false_or_null_is_refused_not_counted(tmp_path: Path) -> None:
    """pass@k counted a record as correct by bool() of its success: "false" and [0] passed."""
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 0.0, "success": "false",
            "reward_components": {"correct": {"value": 0.0, "steps": []}}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    for command in (("report", "c.jsonl"), ("rescore", "c.jsonl", "--weights", "correct=1")):
        refused = envsdk(*command, cwd=tmp_path)
        assert refused.returncode == 2
        assert_one_line_error(refused, "c.jsonl:1", "'success' must be true, false or null", '"false"')
    # A score's None says nothing of success: null, not false.
    (tmp_path / "unsaid.py").write_text("def score(record):\n    return {'reward': 1.0, 'success': None}\n",
                                        encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(json.dumps({**line, "success": True}) + "\n", encoding="utf-8")
    assert envsdk("rescore", "c.jsonl", "--score", "unsaid.py:score", cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / "c.rescored.jsonl").read_text(encoding="utf-8"))["success"] is None


def test_what_a_score_prints_goes_to_stderr_not_into_the_table(tmp_path: Path) -> None:
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 0.0, "success": True,
            "reward_components": {}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    (tmp_path / "chatty.py").write_text("def score(record):\n    print('scoring', record['uuid'])\n    return 1.0\n",
                                        encoding="utf-8")
    done = envsdk("rescore", "c.jsonl", "--score", "chatty.py:score", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scoring u" in done.stderr and "scoring" not in done.stdout
    assert "pass@1" in done.stdout
    # A score that calls sys.exit fails as one that raises does (status 1), in one line: it went
    # past the handler, and the command ended with status 0, nothing written, nothing said.
    (tmp_path / "exits.py").write_text("def score(record):\n    raise SystemExit(0)\n", encoding="utf-8")
    failed = envsdk("rescore", "c.jsonl", "--score", "exits.py:score", "--out", "x.jsonl", cwd=tmp_path)
    assert failed.returncode == 1
    assert_one_line_error(failed, "called sys.exit(0)", "record u")
    assert not (tmp_path / "x.jsonl").exists()


def test_a_file_of_no_records_is_said_to_be_one(tmp_path: Path) -> None:
    """It was refused for its weights: "no record has such a reward component; the records have: none"."""
    (tmp_path / "c.jsonl").write_text("\n\n", encoding="utf-8")
    refused = envsdk("rescore", "c.jsonl", "--weights", "correct=1", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "c.jsonl: no records to re-score")


def test_rewards_near_the_largest_float_are_printed_in_exponent_form(tmp_path: Path) -> None:
    """Printed with three decimals, a mean of 1.7e308 ran to 309 digits in the tables."""
    from envsdk.rollout import Stat

    assert Stat.of([1.7e308, 1.7e308]).mean == 1.7e308  # not inf
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 0.0, "success": True,
            "reward_components": {}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    (tmp_path / "big.py").write_text("def score(record):\n    return 1.7e308\n", encoding="utf-8")
    done = envsdk("rescore", "c.jsonl", "--score", "big.py:score", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1.7e+308" in done.stdout
    assert not any(len(word) > 30 for word in done.stdout.split())


def test_a_score_may_answer_in_numpy_types(tmp_path: Path) -> None:
    """A score built on numpy (np.all over test results) returns np.bool_ and np.float64: its
    success was refused as not true, false or None."""
    pytest.importorskip("numpy", reason="numpy comes with the test extra's torch; without it there is no numpy score")
    line = {"schema": "envsdk.completions/1", "uuid": "u", "total_reward": 0.0, "success": False,
            "reward_components": {}}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    (tmp_path / "np_score.py").write_text(
        "import numpy as np\n\ndef score(record):\n    return {'reward': np.float64(0.5), 'success': np.all([True, True])}\n"
        "\ndef flat(record):\n    return np.bool_(True)\n",
        encoding="utf-8",
    )
    for func, reward in (("score", 0.5), ("flat", 1.0)):
        done = envsdk("rescore", "c.jsonl", "--score", f"np_score.py:{func}", "--out", f"{func}.jsonl", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        rescored = json.loads((tmp_path / f"{func}.jsonl").read_text(encoding="utf-8"))
        assert (rescored["total_reward"], rescored["success"]) == (reward, True)
