"""pass@k, groups and their printed and written summaries, and re-scoring one record, with no
command and no server: the numbers counted out another way, the texts whole."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from typing import Any

import numpy as np
import pytest

from envsdk.evaluate import (
    EvalError,
    PlannedRun,
    ScoreFailedError,
    example_of,
    format_penalty_of,
    natural_key,
    pass_at_k,
    rescore_record,
    rescore_records,
    summarize_groups,
    summary_text,
    weighted_score,
)


def _direct_pass_at_k(outcomes: list[int], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def _record(example: str, index: int, reward: float, success: bool | None, run: str = "r") -> dict[str, Any]:
    return {"uuid": f"{example}/{index}", "total_reward": reward, "success": success,
            "eval": {"example": example, "index": index, "run": run, "attempt": 1}}


def _group(example: str, outcomes: list[int], run: str = "r") -> list[dict[str, Any]]:
    return [_record(example, i, float(o), bool(o), run) for i, o in enumerate(outcomes)]


# ---------------------------------------------------------------- pass@k


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 0), (3, 1, -1), (3, 1, 4), (3, 4, 1), (3, -1, 1), (0, 0, 1), (0, 0, 0)])
def test_pass_at_k_outside_its_domain_is_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError) as caught:
        pass_at_k(n, c, k)
    assert str(caught.value) == f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}"


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (5, 0, 5), (5, 5, 5), (5, 2, 1), (5, 2, 4), (5, 2, 3)])
def test_pass_at_k_at_the_edges_of_its_domain(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_direct_pass_at_k([1] * c + [0] * (n - c), k))


# ---------------------------------------------------------------- groups


@pytest.mark.parametrize(
    ("record", "pair"),
    [
        (_record("seed-3", 2, 1.0, True), ("seed-3", 2)),
        ({"uuid": "u", "eval": {"example": "e", "index": "2"}}, ("u", 0)),
        ({"uuid": "u", "eval": {"example": 5, "index": 2}}, ("u", 0)),
        ({"uuid": "u", "eval": {"index": 2}}, ("u", 0)),
        ({"uuid": "u", "eval": ["e", 2]}, ("u", 0)),
        ({"uuid": 7}, ("7", 0)),
        ({}, ("None", 0)),
    ],
)
def test_a_record_is_grouped_by_its_eval_tag_or_else_alone_by_its_uuid(record: dict[str, Any], pair: tuple[str, int]) -> None:
    assert example_of(record) == pair


def test_names_sort_with_their_numbers_compared_as_numbers() -> None:
    names = ["seed-10", "seed-2", "seed-1", "b", "a10", "a9", "10", "9", "seed-2b", "seed-2a", "a", "x-1-10", "x-1-9"]
    assert sorted(names, key=natural_key) == [
        "9", "10", "a", "a9", "a10", "b", "seed-1", "seed-2", "seed-2a", "seed-2b", "seed-10", "x-1-9", "x-1-10",
    ]


def test_groups_are_listed_in_natural_order_not_in_the_order_they_ended() -> None:
    records = [r for n in (11, 2, 10, 1, 0, 3, 12, 9, 5, 4, 8, 7, 6) for r in _group(f"seed-{n}", [1, 0])]
    summary = summarize_groups(records)
    assert [g.example for g in summary.groups] == [f"seed-{n}" for n in range(13)]
    rows = [line.split()[0] for line in summary.render().splitlines() if line.startswith("seed-")]
    assert rows == [f"seed-{n}" for n in range(13)]


def test_a_groups_numbers_are_its_rollouts_counted_whatever_their_order() -> None:
    records = [_record("e", 2, 0.5, None), _record("e", 0, 1.0, True), _record("e", 1, 0.0, False), _record("f", 0, 3.0, True)]
    summary = summarize_groups(records)
    first, second = summary.groups
    assert (first.example, first.n, first.correct) == ("e", 3, 1)
    assert first.mean_reward == pytest.approx(0.5) and first.reward_std == pytest.approx(statistics.pstdev([1.0, 0.0, 0.5]))
    assert first.pass_at == {k: pytest.approx(_direct_pass_at_k([1, 0, 0], k)) for k in (1, 2, 3)}
    assert (second.n, second.correct, second.pass_at) == (1, 1, {1: 1.0})
    # Overall: the mean over the examples of each k they all reach; the mean reward is over records.
    assert summary.pass_at == {1: pytest.approx((1 / 3 + 1) / 2)}
    assert summary.mean_reward == pytest.approx((1.0 + 0.0 + 0.5 + 3.0) / 4)
    assert (summary.records, summary.unstated, summary.repeated) == (4, 1, 0)
    assert summary.zero_variance_share == 0.5  # "f" has one reward


def test_rewards_a_millionth_apart_are_not_zero_variance_but_a_billionth_of_that_is() -> None:
    spread = summarize_groups([_record("e", 0, 1.0, True), _record("e", 1, 1.000002, True)])
    assert spread.groups[0].reward_std == pytest.approx(1e-6) and not spread.groups[0].zero_variance
    assert spread.zero_variance_share == 0.0
    flat = summarize_groups([_record("e", 0, 1.0, True), _record("e", 1, 1.0 + 2e-15, True)])
    assert flat.groups[0].zero_variance and flat.zero_variance_share == 1.0


def test_no_records_are_refused() -> None:
    with pytest.raises(EvalError) as caught:
        summarize_groups([])
    assert str(caught.value) == "no records to summarize"


def test_the_planned_run_speaks_only_for_records_all_of_its_run() -> None:
    planned = PlannedRun("r", 4, 2, "1 attempt per sample, no test feedback")
    ours = summarize_groups(_group("seed-0", [1, 0]), planned)
    assert ours.planned == (4, 2) and ours.sample == "1 attempt per sample, no test feedback"
    mixed = summarize_groups([*_group("seed-0", [1, 0]), *_group("seed-1", [1], run="other")], planned)
    assert mixed.planned is None and mixed.sample is None
    untagged = summarize_groups([{"uuid": "a", "total_reward": 1.0, "success": True}], planned)
    assert untagged.planned is None
    assert summarize_groups(_group("seed-0", [1, 0])).planned is None


# ---------------------------------------------------------------- the printed table and the written file


def test_the_printed_table_is_the_overall_lines_then_a_row_per_example() -> None:
    records = [*_group("seed-0", [1, 0, 0]), *_group("seed-1", [0, 0, 0]), *_group("seed-2", [1, 1, 1])]
    p1 = [1 / 3, 0.0, 1.0]
    stderr = statistics.stdev(p1) / math.sqrt(3)
    overall = {k: sum(_direct_pass_at_k(o, k) for o in ([1, 0, 0], [0, 0, 0], [1, 1, 1])) / 3 for k in (1, 2, 3)}
    assert summarize_groups(records).render() == "\n".join([
        "groups          3 examples x 3 rollouts (9 records)",
        f"pass@k          pass@1={overall[1]:.3f}  pass@2={overall[2]:.3f}  pass@3={overall[3]:.3f}",
        (
            f"pass@1 s.e.     {stderr:.3f} (standard error over the 3 examples: the sample standard deviation of "
            "their pass@1 / sqrt(3))"
        ),
        "mean reward     0.444",
        "zero variance   66.7% of groups (2/3: every rollout got the same reward)",
        "",
        "example                    n   c     mean      std   pass@1   pass@2   pass@3",
        "seed-0                     3   1    0.333    0.471    0.333    0.667    1.000",
        "seed-1                     3   0    0.000    0.000    0.000    0.000    0.000",
        "seed-2                     3   3    1.000    0.000    1.000    1.000    1.000",
    ])


def test_a_table_without_stated_success_says_n_a_and_names_what_is_unstated() -> None:
    records = [_record("seed-0", 0, 1.0, None), _record("seed-0", 1, 0.0, None), _record("seed-1", 0, 0.5, None)]
    summary = summarize_groups(records)
    assert not summary.success_stated and summary.pass_at_1_stderr is None and summary.stderr_line() is None
    lines = summary.render().splitlines()
    assert lines[:4] == [
        "groups          2 examples x 1-2 rollouts (3 records)",
        "pass@k          n/a (no record states success)",
        "mean reward     0.500",
        "zero variance   50.0% of groups (1/2: every rollout got the same reward)",
    ]
    # Neither "pass@k stops at" nor "do not state success": without a stated success they say nothing.
    assert lines[4:] == [
        "",
        "example                    n   c     mean      std   pass@1   pass@2",
        "seed-0                     2   0    0.500    0.500      n/a      n/a",
        "seed-1                     1   0    0.500    0.000      n/a        -",
    ]
    written = summary.to_dict()
    assert written["pass_at_k"] is None and written["pass_at_1_stderr"] is None
    assert [g["pass_at_k"] for g in written["groups"]] == [None, None]


def test_the_notes_under_the_overall_lines_say_what_a_reader_must_know() -> None:
    records = [*_group("seed-0", [1, 0, 1]), _record("seed-1", 0, 0.0, None), _record("seed-1", 0, 1.0, True)]
    summary = summarize_groups(records, PlannedRun("r", 3, 3, "one try"))
    lines = summary.render().splitlines()
    notes = [line.strip() for line in lines[5:10]]
    assert lines[1] == f"pass@k          pass@1={summary.pass_at[1]:.3f}  pass@2={summary.pass_at[2]:.3f} (one try)"
    assert notes == [
        (
            "cut short: the run planned 3 examples x 3 rollouts, the records hold 2 examples and 5 of 9 rollouts; "
            "pass@k is over those (`envsdk rollout --resume` completes it)"
        ),
        (
            "1 record(s) repeat an (example, index) pair another record has: files of several runs put together? "
            "Each counts in pass@k"
        ),
        (
            "overall pass@k stops at k=2: 1 of 2 examples have fewer than 3 rollouts (a run cut short: `envsdk "
            "rollout --resume` completes it)"
        ),
        "1 record(s) do not state success (null): pass@k counts them as not correct; `envsdk rescore` can score them",
        "",
    ]
    assert all(line.startswith(" " * 16) for line in lines[5:9])


def test_a_complete_planned_run_is_not_said_to_be_cut_short() -> None:
    summary = summarize_groups([*_group("seed-0", [1, 0]), *_group("seed-1", [0, 0])], PlannedRun("r", 2, 2))
    assert "cut short" not in summary.render() and summary.planned == (2, 2)
    assert summarize_groups(_group("seed-0", [1, 0]), PlannedRun("r", 2, 1)).render().count("cut short") == 1


def test_groups_of_several_sizes_are_given_as_the_smallest_to_the_largest() -> None:
    records = [*_group("seed-0", [1]), *_group("seed-1", [1, 0]), *_group("seed-2", [0, 0, 1])]
    assert summarize_groups(records).render().splitlines()[0] == "groups          3 examples x 1-3 rollouts (6 records)"


def test_the_table_shows_twenty_examples_then_counts_the_rest() -> None:
    summary = summarize_groups([r for n in range(25) for r in _group(f"seed-{n}", [n % 2])])
    lines = summary.render().splitlines()
    rows = [line for line in lines if line.startswith("seed-")]
    assert [row.split()[0] for row in rows] == [f"seed-{n}" for n in range(20)]
    assert lines[-1] == "... and 5 more examples (envsdk report lists them all)"
    assert len(summary.render(examples=3).splitlines()) == len(lines) - 17
    assert "more examples" not in summary.render(examples=25)
    assert not [line for line in summary.render(examples=0).splitlines() if line.startswith(("example", "seed-"))]


def test_long_names_are_cut_and_wide_columns_stay_apart() -> None:
    name = "HumanEval/" + "x" * 30
    summary = summarize_groups([_record(name, i, 1.0, True) for i in range(1000)])
    header, row = summary.render().splitlines()[-2:]
    assert row.startswith(f"{name[:23]:<24} 1000 1000") and name[:24] not in row
    assert header.endswith("  pass@512 pass@1000")  # each column one wider than its widest text
    assert header.split() == ["example", "n", "c", "mean", "std", *(f"pass@{k}" for k in summary.ks)]
    assert row.split()[1:3] == ["1000", "1000"] and header.endswith(" pass@1000")
    assert len(header) == len(row)


def test_the_stderr_of_pass_at_1_is_over_the_examples() -> None:
    outcomes = [[1, 0], [0, 0], [1, 1], [1, 0]]
    summary = summarize_groups([r for n, o in enumerate(outcomes) for r in _group(f"seed-{n}", o)])
    expected = statistics.stdev([sum(o) / len(o) for o in outcomes]) / math.sqrt(len(outcomes))
    assert summary.pass_at_1_stderr == pytest.approx(expected)
    assert summarize_groups(_group("seed-0", [1, 0])).pass_at_1_stderr is None


def test_the_written_summary_holds_every_number_of_the_run() -> None:
    records = [*_group("seed-0", [1, 0]), *_group("seed-1", [0]), _record("seed-1", 0, 1.0, None)]
    summary = summarize_groups(records, PlannedRun("r", 2, 2, "s"))
    assert summary.to_dict() == {
        "records": 4,
        "examples": 2,
        "rollouts_per_example": {"min": 2, "max": 2},
        "repeated_pairs": 1,
        "planned": {"examples": 2, "rollouts_per_example": 2},
        "pass_at_k": {"1": pytest.approx(0.25), "2": pytest.approx(0.5)},
        "pass_at_1_stderr": pytest.approx(statistics.stdev([0.5, 0.0]) / math.sqrt(2)),
        "sample": "s",
        "mean_reward": pytest.approx(0.5),
        "zero_variance_share": 0.0,
        "success_not_stated": 1,
        "groups": [
            {"example": "seed-0", "n": 2, "correct": 1, "mean_reward": 0.5, "reward_std": 0.5,
             "pass_at_k": {"1": 0.5, "2": 1.0}},
            {"example": "seed-1", "n": 2, "correct": 0, "mean_reward": 0.5, "reward_std": 0.5,
             "pass_at_k": {"1": 0.0, "2": 0.0}},
        ],
    }
    assert summarize_groups(records).to_dict()["planned"] is None


def test_the_summary_file_is_its_json_with_a_line_per_field_and_per_example() -> None:
    summary = summarize_groups([*_group("seed-0", [1, 0]), *_group("seed-1", [0, 1])]).to_dict()
    text = summary_text(summary)
    assert json.loads(text) == summary
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and text.endswith("}\n")
    assert lines[1] == ' "records": 4,'
    assert lines[-5:-1] == [
        ' "groups": [',
        '  {"example": "seed-0", "n": 2, "correct": 1, "mean_reward": 0.5, "reward_std": 0.5, "pass_at_k": {"1": 0.5, "2": 1.0}},',
        '  {"example": "seed-1", "n": 2, "correct": 1, "mean_reward": 0.5, "reward_std": 0.5, "pass_at_k": {"1": 0.5, "2": 1.0}}',
        " ]",
    ]
    assert len(lines) == len(summary) + 5
    assert summary_text({"records": 0, "groups": []}) == '{\n "records": 0,\n "groups": []\n}\n'
    assert json.loads(summary_text({"records": 0})) == {"records": 0, "groups": []}


# ---------------------------------------------------------------- re-scoring


def _scored(reward: float = 0.5, success: bool | None = False, **fields: Any) -> dict[str, Any]:
    return {"uuid": "u7", "total_reward": reward, "success": success, **fields}


@pytest.mark.parametrize(
    ("result", "reward", "success"),
    [
        (2, 2.0, False),
        (2.5, 2.5, False),
        (np.float64(0.25), 0.25, False),
        (True, 1.0, True),
        (False, 0.0, False),
        (np.bool_(True), 1.0, True),
        ({"reward": 3}, 3.0, False),
        ({"reward": 3, "success": True}, 3.0, True),
        ({"reward": 3, "success": np.bool_(False)}, 3.0, False),
        ({"reward": 3, "success": None}, 3.0, None),
    ],
)
def test_a_score_gives_the_reward_and_success_only_where_it_says_so(result: Any, reward: float, success: bool | None) -> None:
    new = rescore_record(_scored(), lambda record: result)
    assert new["total_reward"] == reward and type(new["total_reward"]) is float
    assert new["success"] is success
    assert new["rescored_from"] == {"total_reward": 0.5, "success": False}
    assert new["uuid"] == "u7"


def test_a_record_success_that_is_not_a_bool_is_not_kept() -> None:
    assert rescore_record(_scored(success="yes"), lambda record: 1.0)["success"] is None  # type: ignore[arg-type]
    assert rescore_record(_scored(success=None), lambda record: {"reward": 1.0})["success"] is None
    assert rescore_record(_scored(success=True), lambda record: {"reward": 1.0})["success"] is True


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("1.0", "the score for record u7 returned '1.0'; expected a number, a bool or {'reward': number, 'success': bool}"),
        (None, "the score for record u7 returned None; expected a number"),
        ({"success": True}, "the score for record u7 returned {'success': True}; expected"),
        ({"reward": "1"}, "the score for record u7 returned {'reward': '1'}; expected"),
        ({"reward": 1, "sucess": True, "extra": 1},
         "the score for record u7 returned the key(s) 'extra', 'sucess'; a mapping holds 'reward' and optionally 'success'"),
        ({"reward": 1, "success": "yes"}, "the score for record u7 returned success 'yes'; expected true, false or None"),
        (math.nan, "the score for record u7 is not a finite number: nan"),
        ({"reward": -math.inf}, "the score for record u7 is not a finite number: -inf"),
        (10**400, "the score for record u7 is not a finite number: an int too large for a float"),
    ],
)
def test_a_score_that_gives_no_usable_answer_is_refused_naming_the_record(result: Any, message: str) -> None:
    with pytest.raises(EvalError) as caught:
        rescore_record(_scored(), lambda record: result)
    assert not isinstance(caught.value, ScoreFailedError)
    assert str(caught.value).startswith(message)


def test_a_score_that_raises_is_named_with_its_error_on_one_bounded_line() -> None:
    def judge(record: dict[str, Any]) -> float:
        raise ValueError("bad\n  record   " + "x" * 400)

    with pytest.raises(ScoreFailedError) as caught:
        rescore_record(_scored(), judge)
    said = str(caught.value)
    text = "bad record " + "x" * 400
    assert said == (
        "test_a_score_that_raises_is_named_with_its_error_on_one_bounded_line.<locals>.judge() on record u7 raised "
        f"ValueError: {text[:300]}… ({len(text)} characters)"
    )
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_short_error_and_an_exit_are_named_whole() -> None:
    def short(record: dict[str, Any]) -> float:
        raise KeyError("x" * 298)  # its text is quoted: 300 characters

    def leaves(record: dict[str, Any]) -> float:
        raise SystemExit(3)

    with pytest.raises(ScoreFailedError) as caught:
        rescore_record(_scored(), short)
    assert str(caught.value).endswith(f"raised KeyError: '{'x' * 298}'")
    with pytest.raises(ScoreFailedError) as caught:
        rescore_record(_scored(), leaves)
    assert str(caught.value).endswith("leaves() on record u7 called sys.exit(3)")


def test_a_score_that_is_no_function_is_named_by_its_repr() -> None:
    class Judge:
        def __call__(self, record: dict[str, Any]) -> float:
            raise RuntimeError("no")

        def __repr__(self) -> str:
            return "Judge(strict)"

    with pytest.raises(ScoreFailedError) as caught:
        rescore_record(_scored(), Judge())
    assert str(caught.value) == "Judge(strict)() on record u7 raised RuntimeError: no"


def test_a_score_reads_a_copy_and_prints_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    record = _scored(infos={"a": [1]})

    def meddles(given: dict[str, Any]) -> float:
        print("thinking")
        given["infos"]["a"].append(2)
        given["total_reward"] = 9
        return 1.0

    new = rescore_record(record, meddles)
    assert record == _scored(infos={"a": [1]}) and new["infos"] == {"a": [1]}
    assert capsys.readouterr() == ("", "thinking\n")


def test_records_are_rescored_in_order() -> None:
    records = [_scored(1.0), _scored(2.0)]
    assert [r["total_reward"] for r in rescore_records(records, lambda record: record["total_reward"] * 2)] == [2.0, 4.0]


def _parts(**values: Any) -> dict[str, Any]:
    return {name: {"value": value, "steps": []} for name, value in values.items()}


def test_a_weighted_score_sums_the_weighted_components_and_the_format_penalty() -> None:
    score = weighted_score({"right": 2.0, "progress": 0.5, "absent": 10.0})
    record = _scored(reward_components=_parts(right=1.0, progress=4, other=100.0), infos={"format_penalty": -0.5})
    assert score(record) == pytest.approx(2.0 + 2.0 - 0.5)
    assert score(_scored()) == 0.0
    assert score(_scored(reward_components={"right": 1.0})) == 0.0
    assert score(_scored(reward_components=_parts(right="1", progress=True))) == pytest.approx(0.5)
    penalty_first = weighted_score({"format_penalty": 2.0, "right": 2.0, "progress": 1.0})
    assert penalty_first(record) == pytest.approx(2.0 + 4 - 1.0)
    heavy = weighted_score({"right": 1.0, "format_penalty": 3.0})
    assert heavy(_scored(reward_components=_parts(right=1.0, format_penalty=-0.5))) == pytest.approx(1.0 - 1.5)
    assert weighted_score({"format_penalty": 0.0})(_scored(infos={"format_penalty": -1.0})) == 0.0
    assert weighted_score({"right": 1.0})(_scored(reward_components=_parts(right=10**400))) == math.inf
    assert weighted_score({"right": 1.0})(_scored(reward_components=_parts(right=-(10**400)))) == -math.inf


@pytest.mark.parametrize(
    ("record", "penalty"),
    [
        (_scored(reward_components=_parts(format_penalty=-0.5), infos={"format_penalty": -2.0}), -0.5),
        (_scored(reward_components=_parts(right=1.0), infos={"format_penalty": -2.0}), -2.0),
        (_scored(infos={"format_penalty": -2}), -2.0),
        (_scored(reward_components={"format_penalty": -0.5}, infos={"format_penalty": -2.0}), -2.0),
        (_scored(reward_components=_parts(format_penalty=None), infos={"format_penalty": -2.0}), 0.0),
        (_scored(infos={"format_penalty": math.nan}), 0.0),
        (_scored(infos={"format_penalty": "-1"}), 0.0),
        (_scored(infos=["format_penalty"]), 0.0),
        (_scored(reward_components=[1]), 0.0),
        (_scored(), 0.0),
    ],
)
def test_the_format_penalty_is_the_component_else_the_infos(record: dict[str, Any], penalty: float) -> None:
    assert format_penalty_of(record) == penalty
