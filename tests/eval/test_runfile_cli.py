"""Run files: ``envsdk rollout --config run.toml`` and the resolved ``<stem>.run.toml`` beside the records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envsdk.runfile import read_run_file
from tests.cli.conftest import ServeFn, assert_one_line_error, envsdk
from tests.eval.conftest import by_pair, comparable

pytestmark = pytest.mark.timeout(240)


def test_a_run_file_and_its_command_line_give_identical_records(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    (workdir / "run.toml").write_text(
        f"""\
env = "graded"
base-url = ["{url}"]
policy = "policies.py:Parity"
episodes = 3
seed = 4
rollouts_per_example = 2
max-turns = 5
concurrency = 2
env-config = {{ reset_kwargs = {{ level = "easy", tags = ["a", "b"] }} }}
out = "from_file.jsonl"
no-progress = true
""",
        encoding="utf-8",
    )
    from_file = envsdk("rollout", "--config", "run.toml", cwd=workdir)
    assert from_file.returncode == 0, from_file.stderr
    by_hand = envsdk(
        "rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Parity", "--episodes", "3",
        "--seed", "4", "--rollouts-per-example", "2", "--max-turns", "5", "--concurrency", "2",
        "--env-config", json.dumps({"reset_kwargs": {"level": "easy", "tags": ["a", "b"]}}), "--out", "by_hand.jsonl", "--no-progress",
        cwd=workdir,
    )
    assert by_hand.returncode == 0, by_hand.stderr
    a, b = by_pair(workdir / "from_file.jsonl"), by_pair(workdir / "by_hand.jsonl")
    assert sorted(a) == [(f"seed-{n}", i) for n in (4, 5, 6) for i in (0, 1)]
    assert {k: comparable(v) for k, v in a.items()} == {k: comparable(v) for k, v in b.items()}
    assert a[("seed-4", 0)]["env_config"]["reset_kwargs"]["level"] == "easy"

    # The resolved options are written next to the records, and repeat the run exactly.
    written = read_run_file(workdir / "from_file.run.toml")
    assert written["seed"] == 4 and written["rollouts-per-example"] == 2 and written["env-config"]["reset_kwargs"]["tags"] == ["a", "b"]
    assert isinstance(written["run"]["id"], str) and written["run"]["attempt"] == 1
    again = envsdk("rollout", "--config", "from_file.run.toml", "--out", "again.jsonl", cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert {k: comparable(v) for k, v in by_pair(workdir / "again.jsonl").items()} == {
        k: comparable(v) for k, v in a.items()
    }
    # The command line wins over the file.
    fewer = envsdk("rollout", "--config", "run.toml", "--episodes", "1", "--out", "fewer.jsonl", cwd=workdir)
    assert fewer.returncode == 0, fewer.stderr
    assert sorted(by_pair(workdir / "fewer.jsonl")) == [("seed-4", 0), ("seed-4", 1)]


def test_a_run_file_that_cannot_be_read_is_named_not_blamed_on_out(tmp_path: Path) -> None:
    """A folder given as --config said "cannot write --out completions.jsonl there", and bytes
    that are not UTF-8 gave the codec's message without the file's name."""
    (tmp_path / "folder.toml").mkdir()
    (tmp_path / "latin.toml").write_bytes(b'env = "caf\xe9"\n')
    for name, needles in (("folder.toml", ["cannot read"]), ("latin.toml", ["not UTF-8"])):
        result = envsdk("rollout", "--config", name, "--env", "frozen_lake", cwd=tmp_path)
        assert result.returncode == 2
        assert_one_line_error(result, name, *needles)
        assert "--out" not in result.stderr
        assert not (tmp_path / "completions.jsonl").exists()


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('env = "frozen_lake"\nepisodez = 3\n', ["unknown option 'episodez'", "Did you mean 'episodes'"]),
        ('env = "frozen_lake"\nepisodes = "three"\n', ["episodes", "three"]),
        ('env = "frozen_lake"\nrecord = "huge"\n', ["record", "lean, full"]),
        ('env = "frozen_lake"\nno-progress = 1\n', ["no-progress", "true or false"]),
        ("env = \n", ["not TOML"]),
        # Arrays nested deeper than the parser goes: a RecursionError's traceback.
        ('env = "frozen_lake"\nenv-config = ' + "[" * 100_000 + "]" * 100_000 + "\n", ["not TOML", "nested too deep"]),
        # The same as the JSON text --env-config also takes.
        ('env = "frozen_lake"\nenv-config = "' + "[" * 100_000 + '"\n', ["env-config", "nested too deep"]),
    ],
    # Named, not spelled out: a test's id reaches its subprocesses' environment (PYTEST_CURRENT_TEST),
    # and one of 200,000 brackets is past what one variable may hold (exec fails with E2BIG).
    ids=["misspelled", "wrong-type", "bad-choice", "not-bool", "not-toml", "deep-toml", "deep-json"],
)
def test_a_bad_run_file_is_one_clear_line_and_exit_2(tmp_path: Path, text: str, needles: list[str]) -> None:
    (tmp_path / "bad.toml").write_text(text, encoding="utf-8")
    result = envsdk("rollout", "--config", "bad.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "bad.toml", *needles)
    assert not (tmp_path / "completions.jsonl").exists()


def test_a_run_file_that_overwrites_can_be_resumed_with_itself(tmp_path: Path) -> None:
    """`overwrite = true` in a run's --config made `--resume --config` refuse "give one of them"."""
    (tmp_path / "exp.toml").write_text(
        'env = "frozen_lake"\npolicy = "random"\nepisodes = 3\nmax-turns = 3\nout = "exp.jsonl"\noverwrite = true\n'
        "no-progress = true\n", encoding="utf-8")
    assert envsdk("rollout", "--config", "exp.toml", cwd=tmp_path).returncode == 0
    out = tmp_path / "exp.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:-1]))
    resumed = envsdk("rollout", "--resume", "--config", "exp.toml", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(by_pair(out)) == 3 and max(r["eval"]["attempt"] for r in by_pair(out).values()) == 2
    both = envsdk("rollout", "--resume", "--overwrite", "--config", "exp.toml", cwd=tmp_path)
    assert both.returncode == 2  # said on the command line, the two still contradict


def test_a_file_name_that_is_not_utf8_is_named_before_anything_is_written(tmp_path: Path) -> None:
    """A run file is TOML, which holds only text: an --out whose name is not UTF-8 (b'\\xff')
    failed with the codec's words, naming neither the option nor the file."""
    name = os.fsdecode(b"\xff.jsonl")
    refused = envsdk("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--no-progress",
                     "--out", name, cwd=tmp_path)
    assert_one_line_error(refused, "--out", "not UTF-8")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        # TOML allows no byte-order mark; tomllib said only "Invalid statement (at line 1, column 1)".
        ('\ufeffenv = "frozen_lake"\n', ["run.toml", "byte-order mark"]),
        # One option spelled both ways: the last won without a word.
        ('env = "frozen_lake"\nrollouts_per_example = 2\nrollouts-per-example = 3\n',
         ["run.toml", "'rollouts-per-example' a second time"]),
    ],
)
def test_a_run_file_that_says_something_twice_or_begins_with_a_bom_is_named(
    tmp_path: Path, text: str, needles: list[str]
) -> None:
    (tmp_path / "run.toml").write_text(text, encoding="utf-8")
    refused = envsdk("rollout", "--config", "run.toml", "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]
