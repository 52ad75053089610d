"""Groups and pass@k through the real ``envsdk rollout`` and ``envsdk report`` against a real server."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from envsdk.evaluate import EvalSummary, finish_run, pass_at_k, summarize_groups
from tests.cli.conftest import ServeFn, envsdk, user_env
from tests.eval.conftest import by_pair, records

pytestmark = pytest.mark.timeout(240)

# Three hand-made groups of 5 rollouts: some right, none right, all right.
SCRIPT = {0: [1, 0, 0, 1, 0], 1: [0, 0, 0, 0, 0], 2: [1, 1, 1, 1, 1]}


def direct_pass_at_k(outcomes: list[int], k: int) -> float:
    """The share of all k-subsets of the rollouts that hold at least one success: the quantity
    the estimator estimates, counted out without the formula."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_success() -> None:
    for outcomes in ([1, 0, 0, 1, 0], [0] * 4, [1] * 3, [0, 0, 0, 0, 0, 0, 1]):
        for k in range(1, len(outcomes) + 1):
            assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(direct_pass_at_k(outcomes, k))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_rollouts_per_example_give_pass_at_k_of_hand_made_groups(workdir: Path, serve: ServeFn) -> None:
    url = serve("graded:app", cwd=workdir)
    env = {**user_env(), "GRADED_SCRIPT": json.dumps(SCRIPT)}
    run = envsdk(
        "rollout", "--env", "graded", "--base-url", url, "--policy", "policies.py:Scripted", "--episodes", "3",
        "--rollouts-per-example", "5", "--concurrency", "1", "--no-progress", cwd=workdir, env=env,
    )
    assert run.returncode == 0, run.stderr
    pairs = by_pair(workdir / "completions.jsonl")
    assert sorted(pairs) == [(f"seed-{n}", i) for n in range(3) for i in range(5)]
    # Each group replays its example: the same seed for all 5, and the scripted outcomes.
    for (example, index), record in pairs.items():
        assert record["seed"] == int(example.split("-")[1]) and record["uuid"] == f"{example}/{index}"
    outcomes = {f"seed-{n}": [int(pairs[(f"seed-{n}", i)]["success"]) for i in range(5)] for n in SCRIPT}
    assert outcomes == {f"seed-{n}": v for n, v in SCRIPT.items()}

    summary = json.loads((workdir / "completions.eval.json").read_text())
    for group in summary["groups"]:
        mine = outcomes[group["example"]]
        assert group["n"] == 5 and group["correct"] == sum(mine)
        assert group["mean_reward"] == pytest.approx(sum(mine) / 5)
        assert group["reward_std"] == pytest.approx((sum((x - sum(mine) / 5) ** 2 for x in mine) / 5) ** 0.5)
        for k in range(1, 6):
            assert group["pass_at_k"][str(k)] == pytest.approx(direct_pass_at_k(mine, k))
    for k in range(1, 6):
        overall = sum(direct_pass_at_k(v, k) for v in outcomes.values()) / 3
        assert summary["pass_at_k"][str(k)] == pytest.approx(overall)
        assert f"pass@{k}={overall:.3f}" in run.stdout
    assert summary["zero_variance_share"] == pytest.approx(2 / 3)  # all wrong, all right
    assert "66.7% of groups" in run.stdout

    report = envsdk("report", "completions.jsonl", cwd=workdir)
    assert report.returncode == 0, report.stderr
    assert f"pass@2={sum(direct_pass_at_k(v, 2) for v in outcomes.values()) / 3:.3f}" in report.stderr
    assert all((workdir / line).exists() for line in report.stdout.split()), report.stdout  # stdout: the files
    page = (workdir / "completions_report" / "report.html").read_text()
    assert "Groups and pass@k" in page and "<td>seed-0</td><td>5</td><td>2</td>" in page


def test_groups_of_records_without_a_tag_are_groups_of_one(tmp_path: Path) -> None:
    plain = [{"uuid": "a", "total_reward": 1.0, "success": True}, {"uuid": "b", "total_reward": 0.0, "success": None}]
    summary = summarize_groups(plain)
    assert [g.n for g in summary.groups] == [1, 1] and summary.pass_at == {1: 0.5}
    assert summary.unstated == 1 and "do not state success" in summary.render()


@pytest.mark.parametrize("env_name", ["sudoku", "frozen_lake"])
def test_groups_work_on_the_built_in_envs(tmp_path: Path, env_name: str) -> None:
    run = envsdk(
        "rollout", "--env", env_name, "--policy", "random", "--episodes", "2", "--rollouts-per-example", "3",
        "--max-turns", "4", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    pairs = by_pair(tmp_path / "completions.jsonl")
    assert sorted(pairs) == [(f"seed-{n}", i) for n in range(2) for i in range(3)]
    assert len(records(tmp_path / "completions.jsonl")) == 6
    assert "2 examples x 3 rollouts" in run.stdout


def test_groups_work_on_a_textarena_server(tmp_path: Path, serve: ServeFn) -> None:
    url = serve("--game-workers", "1", "--env-id", "2048-v0", cwd=tmp_path, module="servers.textarena")
    run = envsdk(
        "rollout", "--env", "TextArenaEnvironment", "--base-url", url, "--policy", "random", "--episodes", "2",
        "--rollouts-per-example", "3", "--max-turns", "3", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    pairs = by_pair(tmp_path / "completions.jsonl")
    assert sorted(pairs) == [(f"seed-{n}", i) for n in range(2) for i in range(3)]
    assert all(r["status"] != "error" for r in pairs.values())
    summary = json.loads((tmp_path / "completions.eval.json").read_text())
    assert [g["n"] for g in summary["groups"]] == [3, 3]


def test_groups_work_on_the_coding_server(tmp_path: Path, serve: ServeFn) -> None:
    url = serve("--sandbox", "process", "--warm", "1", cwd=tmp_path, module="servers.coding")
    run = envsdk(
        "rollout", "--env", "CodingEnvironment", "--base-url", url, "--policy", "random", "--episodes", "2",
        "--rollouts-per-example", "2", "--max-turns", "1", "--concurrency", "2", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    pairs = by_pair(tmp_path / "completions.jsonl")
    assert sorted(pairs) == [(f"seed-{n}", i) for n in range(2) for i in range(2)]
    assert all(r["status"] != "error" for r in pairs.values()), [r["reason"] for r in pairs.values()]
    assert "2 examples x 2 rollouts" in run.stdout


def _group(example: str, outcomes: list[int]) -> list[dict[str, object]]:
    return [{"uuid": f"{example}/{i}", "total_reward": float(o), "success": bool(o),
             "eval": {"example": example, "index": i, "run": "r", "attempt": 1}} for i, o in enumerate(outcomes)]


def test_overall_pass_at_k_covers_only_the_k_every_example_reaches() -> None:
    """Groups of unequal size (a run cut short, two files put together): pass@4 was the mean over
    the one example with 4 rollouts, 1.000 while two examples of three never succeeded."""
    summary = summarize_groups([*_group("seed-0", [0, 0, 0, 1]), *_group("seed-1", [0, 0]), *_group("seed-2", [0, 0])])
    assert summary.pass_at == {1: pytest.approx(1 / 12), 2: pytest.approx(direct_pass_at_k([0, 0, 0, 1], 2) / 3)}
    text = summary.render()
    overall = next(line for line in text.splitlines() if line.startswith("pass@k"))
    assert "pass@3" not in overall and "pass@4" not in overall
    assert "2 of 3 examples have fewer" in text and "--resume" in text
    # Each example's own pass@k is still there, up to its own size.
    row = next(line for line in text.splitlines() if line.startswith("seed-0"))
    assert row.split()[-4:] == [f"{direct_pass_at_k([0, 0, 0, 1], k):.3f}" for k in range(1, 5)]
    written = summary.to_dict()
    assert written["pass_at_k"] == {"1": pytest.approx(1 / 12), "2": pytest.approx(1 / 6)}
    assert written["rollouts_per_example"] == {"min": 2, "max": 4}


def test_a_large_group_gets_pass_at_k_for_the_shown_ks_only() -> None:
    """pass@k was computed for every k up to n: for n = 20000, 20000 ratios of huge binomials,
    minutes of work for a summary that shows about 16 of them."""
    outcomes = [i % 7 == 0 for i in range(20_000)]
    summary = summarize_groups(_group("seed-0", [int(o) for o in outcomes]))
    shown = [*range(1, 11), *(2**i for i in range(4, 15)), 20_000]
    assert list(summary.groups[0].pass_at) == shown == list(summary.pass_at)
    correct = sum(outcomes)
    assert summary.pass_at[2] == pytest.approx(pass_at_k(20_000, correct, 2)) and summary.pass_at[20_000] == 1.0
    header = next(line for line in summary.render().splitlines() if line.startswith("example"))
    assert header.split()[-3:] == ["pass@8192", "pass@16384", "pass@20000"]  # columns apart, not run together


def test_the_summary_of_rewards_near_the_largest_float_is_finite() -> None:
    """Their sum overflowed: a re-scoring by weights of 1e308 printed a mean reward of -inf."""
    big = [{**r, "total_reward": -1.5e308} for r in _group("seed-0", [0, 0]) + _group("seed-1", [0, 0])]
    summary = summarize_groups(big)
    assert summary.mean_reward == -1.5e308 and [g.mean_reward for g in summary.groups] == [-1.5e308] * 2
    assert [g.reward_std for g in summary.groups] == [0.0, 0.0]
    spread = summarize_groups([{**big[0], "total_reward": 1.5e308}, big[1]])
    assert spread.mean_reward == 0.0 and spread.groups[0].reward_std == 1.5e308


def test_every_k_up_to_ten_is_shown_then_powers_of_two() -> None:
    """Above R = 10 pass@3, 5, 6, 7, 9 and 10 were left out of every example's numbers."""
    summary = summarize_groups([*_group("seed-0", [0] * 11 + [1]), *_group("seed-1", [1] * 9)])
    assert list(summary.groups[0].pass_at) == [*range(1, 11), 12]
    assert list(summary.groups[1].pass_at) == list(range(1, 10)) == list(summary.pass_at)


def _written(path: Path, records: list[dict[str, object]], run_file: str) -> None:
    path.write_text("".join(json.dumps({"schema": "envsdk.completions/1", "reward_components": {}, **r}) + "\n"
                            for r in records), encoding="utf-8")
    path.with_name(f"{path.stem}.run.toml").write_text(run_file, encoding="utf-8")


def _rendered(summary: EvalSummary | None) -> str:
    return summary.render() if summary is not None else ""


def test_a_run_cut_short_says_what_its_run_file_planned(tmp_path: Path) -> None:
    """A killed run lacks whole examples: its summary gave pass@k over the two played as if they
    were the run, without a word about the six never played."""
    out = tmp_path / "c.jsonl"
    played = [*_group("seed-0", [1, 1]), *_group("seed-1", [1, 0])]
    run_file = 'env = "frozen_lake"\nepisodes = 8\nrollouts-per-example = 2\n\n[run]\nid = "r"\nexamples = 8\nrollouts = 2\n'
    _written(out, played, run_file)
    text = _rendered(finish_run(out))
    assert "cut short: the run planned 8 examples x 2 rollouts" in text
    assert "2 examples and 4 of 16 rollouts" in text
    assert json.loads(out.with_name("c.eval.json").read_text())["planned"] == {"examples": 8, "rollouts_per_example": 2}
    # The whole run says nothing; records of another run than the file's are not measured by it.
    _written(out, [r for n in range(8) for r in _group(f"seed-{n}", [1, 0])], out.with_name("c.run.toml").read_text())
    assert "cut short" not in _rendered(finish_run(out))
    _written(out, played, run_file.replace('"r"', '"another"'))
    assert "cut short" not in _rendered(finish_run(out))


def test_records_that_repeat_a_pair_are_counted_and_said() -> None:
    summary = summarize_groups([*_group("seed-0", [1, 0]), *_group("seed-0", [0, 0])])
    assert summary.repeated == 2 and "2 record(s) repeat an (example, index) pair" in summary.render()
    assert summarize_groups(_group("seed-0", [1, 0])).repeated == 0
