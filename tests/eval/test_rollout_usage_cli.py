"""Defects a user found walking the README's rollout and evaluate commands, each through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, ServeFn, assert_one_line_error, envsdk
from tests.eval.conftest import by_pair

pytestmark = pytest.mark.timeout(240)


def _replies(path: Path) -> dict[tuple[str, int], list[str]]:
    return {
        pair: [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        for pair, record in by_pair(path).items()
    }


def test_random_policy_replies_repeat_per_example_and_index_whatever_the_concurrency(tmp_path: Path) -> None:
    def play(out: str, concurrency: str) -> dict[tuple[str, int], list[str]]:
        result = envsdk(
            "rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "4", "--rollouts-per-example", "2",
            "--seed", "100", "--concurrency", concurrency, "--out", out, "--no-progress", cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        return _replies(tmp_path / out)

    one_at_a_time, all_at_once = play("a.jsonl", "1"), play("b.jsonl", "8")
    assert sorted(one_at_a_time) == [(f"seed-{s}", i) for s in range(100, 104) for i in range(2)]
    assert one_at_a_time == all_at_once
    # Seeded per (example, index), not one sequence: the two rollouts of an example differ.
    assert any(one_at_a_time[(f"seed-{s}", 0)] != one_at_a_time[(f"seed-{s}", 1)] for s in range(100, 104))


def test_a_new_run_refuses_to_overwrite_an_earlier_runs_records(tmp_path: Path) -> None:
    command = ("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--no-progress")
    first = envsdk(*command, "--out", "run/completions.jsonl", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    saved = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    assert {"completions.jsonl", "completions.run.toml", "completions.eval.json"} <= set(saved)
    again = envsdk(*command, "--episodes", "3", "--out", "run/completions.jsonl", cwd=tmp_path)
    assert again.returncode == 2
    assert_one_line_error(again, "run/completions.jsonl", "--resume", "--overwrite")
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == saved  # nothing lost
    replaced = envsdk(*command, "--episodes", "3", "--out", "run/completions.jsonl", "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert len(by_pair(tmp_path / "run" / "completions.jsonl")) == 3


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--env", "sudoku", "--base-url", "ftp://127.0.0.1:9/"], ["ftp://127.0.0.1:9/", "http", "ws"]),
        (["--env", "frozen_lake", "--env-config", '{"size": "big"}'], ["--env-config", "frozen_lake", '"size": "big"']),
        # Each episode's seed and env are the runner's: these were dropped without a word.
        (["--env", "frozen_lake", "--env-config", '{"seed": 5}'], ["--env-config", "'seed'", "--seed"]),
        (["--env", "frozen_lake", "--env-config", '{"name": "sudoku"}'], ["--env-config", "'name'", "--env"]),
        # Every rollout is planned before the first plays: a billion filled the memory at 80 MB/s.
        (["--env", "frozen_lake", "--rollouts-per-example", "1000000000"], ["4000000000 rollouts", "1000000"]),
    ],
)
def test_usage_mistakes_are_refused_before_any_episode_plays(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    result = envsdk("rollout", *args, "--episodes", "4", "--no-progress", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "completions.jsonl").exists()


@pytest.mark.parametrize("option", [["--formatter", "json"], ["--scheduler", "openenv"]])
def test_an_option_that_does_not_fit_a_local_env_is_named_not_an_env_config_never_given(
    tmp_path: Path, option: list[str]
) -> None:
    result = envsdk("rollout", "--env", "frozen_lake", *option, "--episodes", "2", "--no-progress", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, option[0], "frozen_lake")
    assert "--env-config" not in result.stderr


def test_a_policy_that_cannot_act_is_refused_before_any_episode_plays(tmp_path: Path) -> None:
    """Each episode ended in an error record ('... has no attribute act') instead."""
    (tmp_path / "notapolicy.py").write_text("class NotAPolicy:\n    pass\n")
    result = envsdk(
        "rollout", "--env", "frozen_lake", "--policy", "notapolicy.py:NotAPolicy", "--episodes", "2", "--no-progress",
        cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 2
    assert_one_line_error(result, "--policy notapolicy.py:NotAPolicy", "NotAPolicy", "act")
    assert not (tmp_path / "completions.jsonl").exists()


def test_a_run_of_more_rollouts_than_can_be_planned_is_refused_at_once(tmp_path: Path) -> None:
    result = envsdk("rollout", "--env", "frozen_lake", "--episodes", "1000000000", "--no-progress", cwd=tmp_path,
                    timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, "1000000000 rollouts", "1000000", "split")
    assert not (tmp_path / "completions.jsonl").exists()
    # No group size is not a large run: it said "2000000 x 0 = 2000000 rollouts".
    result = envsdk("rollout", "--env", "frozen_lake", "--episodes", "2000000", "--rollouts-per-example", "0",
                    "--no-progress", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, "--rollouts-per-example must be >= 1, got 0")


def test_resume_of_a_run_that_is_not_there_says_so(tmp_path: Path) -> None:
    result = envsdk("rollout", "--resume", "--out", "nothere/completions.jsonl", "--no-progress", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "no run to resume", "nothere/completions.jsonl")
    assert not (tmp_path / "nothere").exists()


def test_a_tool_server_is_played_without_env_by_the_name_its_metadata_gives(tmp_path: Path, serve: ServeFn) -> None:
    url = serve(f"{REPO / 'examples' / 'ledger_tools.py'}:LedgerEnvironment", cwd=tmp_path)
    result = envsdk("rollout", "--base-url", url, "--episodes", "2", "--max-turns", "3", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    played = by_pair(tmp_path / "completions.jsonl")
    assert len(played) == 2
    for record in played.values():
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert len(replies) == 3 and all(r.startswith("<tool_call>") for r in replies), replies


def test_the_per_example_table_lists_examples_in_natural_order(tmp_path: Path) -> None:
    lines = []
    for example in ("seed-10", "seed-2", "seed-9", "seed-1"):  # the order episodes happened to end in
        for index in range(2):
            lines.append(json.dumps({
                "schema": "envsdk.completions/1", "uuid": f"{example}/{index}", "total_reward": 1.0, "success": True,
                "reward_components": {"correct": {"value": 1.0, "steps": []}},
                "eval": {"example": example, "index": index, "run": "r", "attempt": 1},
            }))
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = envsdk("rescore", "c.jsonl", "--weights", "correct=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("seed-")]
    assert rows == ["seed-1", "seed-2", "seed-9", "seed-10"], result.stdout


@pytest.mark.parametrize("seed", ['"x"', "1.5", "true"])
def test_a_dataset_row_with_a_seed_that_is_not_an_integer_is_refused(tmp_path: Path, seed: str) -> None:
    good = '{"env_config": {"name": "frozen_lake", "seed": 3}}'
    bad = '{"env_config": {"name": "frozen_lake", "seed": %s}}' % seed
    (tmp_path / "rows.jsonl").write_text(f"{good}\n{bad}\n", encoding="utf-8")
    result = envsdk("rollout", "--dataset", "rows.jsonl", "--no-progress", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "rows.jsonl:2", "seed", "integer")
    assert not (tmp_path / "completions.jsonl").exists()


def test_an_out_that_is_a_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    result = envsdk("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--no-progress",
                    "--out", "d", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "--out d is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and not any((tmp_path / "d").iterdir())


def test_records_files_sharing_a_stem_do_not_take_over_each_others_run(tmp_path: Path) -> None:
    """c.jsonl and c.json share c.run.toml and c.eval.json: a second run into the other one would
    replace the first run's run file, and a resume would then continue the wrong run (it said
    'nothing left to play' for a run stopped half-way)."""
    command = ("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "2", "--max-turns", "2", "--no-progress")
    first = envsdk(*command, "--out", "q/c.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_file = (tmp_path / "q" / "c.run.toml").read_bytes()
    second = envsdk(*command, "--out", "q/c.jsonl", cwd=tmp_path)
    assert second.returncode == 2
    assert_one_line_error(second, "c.run.toml is the run file of", "c.json")
    resumed = envsdk("rollout", "--resume", "--no-progress", "--out", "q/c.jsonl", cwd=tmp_path)
    assert resumed.returncode == 2
    assert_one_line_error(resumed, "c.run.toml is the run file of", "c.json", "not of q/c.jsonl")
    assert (tmp_path / "q" / "c.run.toml").read_bytes() == run_file and not (tmp_path / "q" / "c.jsonl").exists()


@pytest.mark.parametrize(
    ("flag", "value"), [("--max-turns", "0"), ("--concurrency", "0"), ("--concurrency", "-3"), ("--max-tokens", "0")]
)
def test_an_option_out_of_range_changes_nothing_it_is_refused_at_once(tmp_path: Path, flag: str, value: str) -> None:
    """Ranges were checked when the scheduler was made, after --overwrite had cut the records and
    the run file was rewritten: a refused command wiped the earlier run, and a refused --resume
    left the bad value in the run file, where every later --resume met it again."""
    command = ("rollout", "--env", "frozen_lake", "--policy", "random", "--episodes", "4", "--max-turns", "8",
               "--no-progress", "--out", "c.jsonl")
    assert envsdk(*command, cwd=tmp_path).returncode == 0
    out, run_file = tmp_path / "c.jsonl", tmp_path / "c.run.toml"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:2]))  # as if stopped
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # (A resume that changes what the run plays, --max-turns, is refused for that before the range.)
    for attempt in ([*command, "--overwrite", flag, value], ["rollout", "--resume", "--out", "c.jsonl", flag, value]):
        refused = envsdk(*attempt, cwd=tmp_path)
        assert refused.returncode == 2
        assert_one_line_error(refused, flag, value)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert_one_line_error(envsdk(*command, "--overwrite", flag, value, cwd=tmp_path), f"{flag} must be >= 1, got {value}")
    resumed = envsdk("rollout", "--resume", "--out", "c.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(by_pair(out)) == 4 and run_file.is_file()


def test_a_base_url_that_names_no_server_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A scheme-less --base-url that is no pool name nor file ended every episode in an error (and
    a resume kept it in the run file); `base-url = []` in a run file played on localhost:8000."""
    refused = envsdk("rollout", "--env", "sudoku", "--base-url", "notaurl", "--episodes", "2", "--no-progress",
                     cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "'notaurl'", "registered pool name")
    (tmp_path / "run.toml").write_text('env = "sudoku"\nbase-url = []\n', encoding="utf-8")
    refused = envsdk("rollout", "--config", "run.toml", "--episodes", "2", "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "--base-url names no server")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_a_file_spec_imports_the_modules_beside_it_from_any_folder(tmp_path: Path) -> None:
    """``--env``/``--policy`` ``file.py:Class`` files that import a module beside them (as ``python
    file.py`` finds it) failed with ModuleNotFoundError when run from another folder."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "greetings.py").write_text('GREETING = "say hi"\n', encoding="utf-8")
    (plugins / "replies.py").write_text('REPLY = "hi"\n', encoding="utf-8")
    (plugins / "my_env.py").write_text(
        "from greetings import GREETING\n"
        "from envsdk.env import Env\n\n"
        "class MyEnv(Env):\n"
        "    async def reset(self, config):\n"
        "        return GREETING, {}, None\n"
        "    async def step(self, messages):\n"
        "        return 'done', float(messages[-1]['content'] == 'hi'), True, {}\n",
        encoding="utf-8",
    )
    (plugins / "my_policy.py").write_text(
        "from replies import REPLY\n"
        "from envsdk.policies import Policy\n\n"
        "class Greeter(Policy):\n"
        "    async def act(self, messages):\n"
        "        return REPLY\n",
        encoding="utf-8",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = envsdk(
        "rollout", "--env", "../plugins/my_env.py:MyEnv", "--policy", str(plugins / "my_policy.py") + ":Greeter",
        "--episodes", "2", "--out", "c.jsonl", "--no-progress", cwd=elsewhere,
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (elsewhere / "c.jsonl").read_text().splitlines()]
    assert [r["total_reward"] for r in records] == [1.0, 1.0]


def test_a_local_env_whose_reset_breaks_in_the_preflight_is_left_to_the_run_not_a_traceback(tmp_path: Path) -> None:
    """The pre-flight resets a local env once with its config: a reset that breaks with anything
    but a ValueError or TypeError (here an AttributeError, a bug in the env) escaped as a
    traceback. It is left to the run, whose episodes record it, and the run says so in one line."""
    (tmp_path / "broken.py").write_text(
        "from envsdk.env import Env\n\n"
        "class Broken(Env):\n"
        "    async def reset(self, config):\n"
        "        return config.seed, {}, None\n\n"
        "    async def step(self, messages):\n"
        "        return '', 0.0, True, {}\n",
        encoding="utf-8",
    )
    result = envsdk("rollout", "--env", "broken.py:Broken", "--env-config", '{"size": 3}', "--episodes", "2",
                    "--policy", "random", "--no-progress", "--out", "c.jsonl", cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "no episode ran" in result.stderr and "AttributeError" in result.stderr, result.stderr
    assert [r["error_kind"] for r in by_pair(tmp_path / "c.jsonl").values()] == ["AttributeError"] * 2


@pytest.mark.parametrize("episodes", [["--episodes", "2"], ["--episodes=8"], ["--epi", "1"]])
def test_episodes_with_a_dataset_is_refused_not_ignored(tmp_path: Path, episodes: list[str]) -> None:
    """A dataset plays one episode per row: --episodes 2 with it played all 3 rows, without a
    word, and the run file said episodes = 8 of any dataset run."""
    rows = "".join(json.dumps({"env_config": {"name": "frozen_lake", "seed": s}}) + "\n" for s in range(3))
    (tmp_path / "rows.jsonl").write_text(rows, encoding="utf-8")
    result = envsdk("rollout", "--dataset", "rows.jsonl", *episodes, "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, "--episodes", "--dataset", "one episode per row")
    assert not (tmp_path / "completions.jsonl").exists()
    played = envsdk("rollout", "--dataset", "rows.jsonl", "--policy", "oracle", "--no-progress", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert len((tmp_path / "completions.jsonl").read_text(encoding="utf-8").splitlines()) == 3
    run_file = (tmp_path / "completions.run.toml").read_text(encoding="utf-8")
    assert "episodes" not in run_file.split("[run]")[0], run_file
    again = envsdk("rollout", "--config", "completions.run.toml", "--out", "again.jsonl", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len((tmp_path / "again.jsonl").read_text(encoding="utf-8").splitlines()) == 3


@pytest.mark.parametrize(("source", "needles"), [
    ("class NeedsArgs:\n    def __init__(self, x):\n        pass\n    async def act(self, messages):\n        return 'x'\n",
     ["--policy my_policy:NeedsArgs", "no arguments", "x"]),
    ("class SyncAct:\n    def act(self, messages):\n        return 'x'\n",
     ["--policy my_policy:SyncAct", "async def act"]),
], ids=["needs-args", "sync-act"])
def test_a_policy_class_that_cannot_be_made_or_awaited_is_refused_before_any_episode(
    tmp_path: Path, source: str, needles: list[str]
) -> None:
    """A class whose constructor needs arguments was a traceback; one whose act is a plain def
    failed every episode with "object str can't be used in 'await' expression"."""
    (tmp_path / "my_policy.py").write_text(source, encoding="utf-8")
    name = source.split()[1].rstrip(":")
    result = envsdk("rollout", "--env", "frozen_lake", "--policy", f"my_policy:{name}", "--episodes", "2",
                    "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "completions.jsonl").exists()


@pytest.mark.parametrize(("flags", "named"), [
    (["--temperature", "5"], "--temperature"),
    (["--model", "foo"], "--model"),
    (["--top-p", "0.5"], "--top-p"),
    (["--max-tokens", "64"], "--max-tokens"),
    (["--api-base", "http://127.0.0.1:9/v1"], "--api-base"),
])
def test_a_sampling_option_the_policy_does_not_use_is_refused_not_recorded(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    """--temperature 5 with the oracle ran, and the run file recorded temperature = 5.0 as if a
    model had sampled at it (--policy openai refuses the same value)."""
    result = envsdk("rollout", "--env", "frozen_lake", "--policy", "oracle", *flags, "--episodes", "1",
                    "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, named, "--policy oracle")
    assert not (tmp_path / "completions.jsonl").exists()


def test_a_policy_object_a_module_made_is_played(tmp_path: Path) -> None:
    """``--policy pol:instance`` (an object, not its class) was a traceback: the CLI called it."""
    (tmp_path / "pol.py").write_text(
        "from envsdk.policies import FrozenLakeOraclePolicy\ninstance = FrozenLakeOraclePolicy()\n", encoding="utf-8"
    )
    result = envsdk("rollout", "--env", "frozen_lake", "--policy", "pol:instance", "--episodes", "2", "--no-progress",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2 and all(r["success"] for r in records)


def test_a_run_file_holding_a_sampling_option_its_policy_ignores_still_runs_and_resumes(tmp_path: Path) -> None:
    """Run files written before such options were refused hold them (temperature = 1.0 with the
    oracle): the refusal met every --config and every --resume of that run, naming a flag the
    user never typed. From a run file it is said once and left; on the command line refused."""
    (tmp_path / "old.toml").write_text(
        'env = "frozen_lake"\npolicy = "oracle"\nepisodes = 2\ntemperature = 1.0\nout = "old.jsonl"\nno-progress = true\n',
        encoding="utf-8",
    )
    played = envsdk("rollout", "--config", "old.toml", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    warnings = [line for line in played.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "temperature" in warnings[0] and "--policy oracle" in warnings[0], played.stderr
    out = tmp_path / "old.jsonl"
    out.write_bytes(out.read_bytes().splitlines(keepends=True)[0])  # as if stopped after one episode
    resumed = envsdk("rollout", "--resume", "--out", "old.jsonl", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    refused = envsdk("rollout", "--config", "old.toml", "--temperature", "0.5", "--out", "new.jsonl", cwd=tmp_path)
    assert refused.returncode == 2
    assert_one_line_error(refused, "--temperature", "--policy oracle")
