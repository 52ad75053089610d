"""Every finished episode's record is written, or the run stops and says why: a record with text
UTF-8 cannot hold, a file that cannot grow; and the lines of a records file are read as JSON
Lines says, one record per "\\n"."""

from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from envsdk.records import jsonl_lines
from tests.cli.conftest import ENVSDK, ServeFn, envsdk, user_env
from tests.eval.conftest import by_pair, records

pytestmark = pytest.mark.timeout(240)

#: A model whose text holds a lone surrogate: what a "\ud800" escape in a model server's JSON
#: reply decodes to.
SURROGATE = """\
from envsdk.policies import SudokuOraclePolicy

class Surrogate(SudokuOraclePolicy):
    async def act(self, messages):
        return (await super().act(messages)) + " \\ud800"
"""


def test_a_record_holding_a_lone_surrogate_is_written_and_reads_back_the_same(tmp_path: Path) -> None:
    """Its line could not be encoded: the writer raised, the record was dropped, and the run
    still said it had written its trajectories (an empty file, status 0). Sudoku reads the move
    out of the text, so the episodes play."""
    (tmp_path / "surrogate.py").write_text(SURROGATE, encoding="utf-8")
    result = envsdk("rollout", "--env", "sudoku", "--policy", "surrogate.py:Surrogate", "--episodes", "3",
                    "--max-turns", "2", "--no-progress", "--out", "s.jsonl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = records(tmp_path / "s.jsonl")
    assert len(saved) == 3 and not [r for r in saved if r["status"] == "error"]
    replies = [m["content"] for r in saved for m in r["messages"] if m["role"] == "assistant"]
    assert len(replies) == 6 and all(reply.endswith(" \ud800") for reply in replies)
    assert json.loads((tmp_path / "s.eval.json").read_text(encoding="utf-8"))["records"] == 3


def _limited(size: int) -> None:
    # The file size limit a job scheduler or a full quota sets: a write past it fails (EFBIG)
    # instead of killing the process (SIGXFSZ ignored, as the limit's soft form allows).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_run_that_cannot_write_a_record_stops_and_resumes(workdir: Path, serve: ServeFn) -> None:
    """A record that cannot be written (a full disk, a file size limit) was logged where nobody
    saw it and the run played on, losing every later record while it said it wrote them."""
    url = serve("graded:app", cwd=workdir, env={**user_env(), "GRADED_STEP_S": "0"})
    args = ["rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes", "40",
            "--concurrency", "2", "--no-progress", "--out", "c.jsonl"]
    limited = subprocess.run([str(ENVSDK), *args], cwd=workdir, env=user_env(), capture_output=True, text=True,
                             timeout=180, preexec_fn=lambda: _limited(6000), check=False)
    assert limited.returncode == 1, limited.stderr
    last = limited.stderr.strip().splitlines()[-1]
    assert last.startswith("envsdk rollout: error: stopped: an episode finished but its record could not be "
                           "written to c.jsonl: File too large"), limited.stderr
    assert "--resume --out c.jsonl" in last and "Traceback" not in limited.stderr
    assert (workdir / "c.jsonl").stat().st_size <= 6000  # the run stopped at the limit
    # The summary counts the episodes whose records the file holds (the one that failed is played
    # again by --resume), not that one too.
    whole = (workdir / "c.jsonl").read_bytes().split(b"\n")[:-1]  # lines a newline ends
    counted = re.search(r"^episodes\s+(\d+)$", limited.stdout, re.MULTILINE)
    assert counted is not None and int(counted.group(1)) == len(whole) > 0, limited.stdout
    resumed = envsdk(*args, "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(by_pair(workdir / "c.jsonl")) == sorted((f"seed-{n}", 0) for n in range(40))


def test_records_file_lines_end_at_a_newline_alone(tmp_path: Path) -> None:
    """A "\\r" (JSON whitespace) or U+2028 inside a line did cut it in two when the file was read
    as text with universal newlines; a line of bytes that are not UTF-8 is named."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"a":\r 1}\n\n{"b": "x\xe2\x80\xa8y"}\r\n  \n{"c": 3}')
    assert list(jsonl_lines(path)) == [(1, '{"a":\r 1}\n'), (3, '{"b": "x\u2028y"}\n'), (5, '{"c": 3}\n')]
    # The first `stop` bytes only: here all but the last line.
    assert [n for n, _ in jsonl_lines(path, stop=path.stat().st_size - len(b'{"c": 3}'))] == [1, 3]
    path.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not UTF-8 text"):
        list(jsonl_lines(path))



def test_a_record_line_reads_back_as_json_reads_the_record() -> None:
    """Records are encoded by pydantic-core (json took four times as long on a Sudoku record):
    every JSON value must read back as json's own encoding of it reads back, one line each."""
    import math

    from envsdk.records import record_bytes, record_line

    record = {
        "text": "é ü 中 \n\t\"\\ \x00\x1f\x7f \u2028", "floats": [0.1, 1e-7, 1e16, 1e15, 5e-324, 1.7976931348623157e308, -0.0, 2 / 3],
        "ints": [0, -1, 10**30, 2**63], "none": None, "bools": [True, False], "nested": {"a": [{"b": []}, {}]},
        "tuple": (1, "x"), "object": object.__new__(object),
    }
    line = record_bytes(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == json.loads(json.dumps(record, default=str))
    assert record_line(record) == line.decode()
    special = json.loads(record_bytes({"nan": math.nan, "inf": math.inf, "ninf": -math.inf}))
    assert math.isnan(special["nan"]) and special["inf"] == math.inf and special["ninf"] == -math.inf
    # A lone surrogate cannot be UTF-8: written with an escape, read back the same.
    lone = record_bytes({"s": "a\ud800b"})
    assert lone.isascii() and json.loads(lone) == {"s": "a\ud800b"}
