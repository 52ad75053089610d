"""The ``envsdk.completions/1`` record built from a trajectory, the checks a reader makes of one, and
the small statistics the summaries print (quantiles, means, success rates, reward-part labels)."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import pytest

from envsdk.env import RolloutRequest
from envsdk.records import (
    SCHEMA,
    RecordError,
    StepRecord,
    Trajectory,
    basis_labels,
    check_record,
    done_reason,
    episode_components,
    finite_number,
    mean_and_std,
    number_text,
    part_basis,
    quantile,
    record_bytes,
    record_line,
    stated_success,
    success_text,
    summary_facts,
    text_line,
    trajectory_record,
)


def _trajectory(env_config: dict[str, Any] | None = None, **data: Any) -> Trajectory:
    config = {"name": "game", "seed": 4} if env_config is None else env_config
    request = RolloutRequest(data_dict={"env_config": config, **data}, uuid="u-1")
    return Trajectory(request=request)


def _step(reward: float = 0.0, done: bool = False, info: dict[str, Any] | None = None, **components: float) -> StepRecord:
    return StepRecord(turn=1, action={"m": "x"}, observation={"o": reward}, reward=reward, done=done,
                      info=info or {}, components=components, duration_s=0.5)


# ---------------------------------------------------------------- the trajectory


def test_the_first_finish_wins_and_a_later_one_changes_nothing() -> None:
    trajectory = _trajectory()
    trajectory.finish("done", "solved")
    trajectory.finish("error", "the close failed")
    assert (trajectory.status, trajectory.reason) == ("done", "solved")


def test_starting_over_forgets_everything_but_the_request() -> None:
    trajectory = _trajectory()
    request = trajectory.request
    trajectory.messages.append({"role": "user", "content": "hi"})
    trajectory.steps.append(_step(1.0))
    trajectory.finish("error", "server went away")
    trajectory.turns, trajectory.total_reward, trajectory.success, trajectory.truncated = 3, 1.0, True, True
    trajectory.rollout_infos["x"] = 1
    trajectory.timings["env"] = 1.0
    trajectory.runtime = object()
    trajectory.start_over()
    assert trajectory == Trajectory(request=request)
    assert trajectory.request is request and trajectory.runtime is None
    trajectory.messages.append({"role": "user", "content": "again"})
    assert Trajectory(request=request).messages == []  # a fresh list, not one shared


@pytest.mark.parametrize(
    ("env_config", "seed"),
    [({"seed": 7}, 7), ({"seed": None, "reset_kwargs": {"seed": 3}}, None), ({"reset_kwargs": {"seed": 3}}, 3),
     ({"reset_kwargs": "seed=3"}, None), ({}, None)],
)
def test_the_seed_is_the_configs_or_its_reset_kwargs(env_config: dict[str, Any], seed: Any) -> None:
    assert _trajectory(env_config).seed == seed


def test_a_step_record_is_all_its_fields() -> None:
    step = _step(0.5, True, {"a": 1}, right=1.0)
    assert step.to_dict() == {
        "turn": 1, "action": {"m": "x"}, "observation": {"o": 0.5}, "reward": 0.5, "done": True,
        "info": {"a": 1}, "components": {"right": 1.0}, "duration_s": 0.5,
    }


# ---------------------------------------------------------------- what the environment states


@pytest.mark.parametrize("where", ["info", "metadata", "frame_metadata"])
@pytest.mark.parametrize("success", [True, False])
def test_success_is_read_from_the_last_steps_info_or_metadata(where: str, success: bool) -> None:
    trajectory = _trajectory()
    said = {"success": success}
    trajectory.steps += [_step(info={"success": not success}), _step(info=said if where == "info" else {where: said})]
    assert stated_success(trajectory) is success


@pytest.mark.parametrize("info", [{}, {"success": 1}, {"success": "true"}, {"metadata": {"success": None}}, {"metadata": "x"}])
def test_success_that_is_not_a_bool_is_not_stated(info: dict[str, Any]) -> None:
    trajectory = _trajectory()
    trajectory.steps.append(_step(1.0, info=info))
    assert stated_success(trajectory) is None
    assert stated_success(_trajectory()) is None


def test_the_infos_own_success_comes_before_its_metadatas() -> None:
    trajectory = _trajectory()
    trajectory.steps.append(_step(info={"success": False, "metadata": {"success": True}, "frame_metadata": {"success": True}}))
    assert stated_success(trajectory) is False
    trajectory.steps[-1] = _step(info={"metadata": {"success": False}, "frame_metadata": {"success": True}})
    assert stated_success(trajectory) is False


def test_the_done_reason_says_what_the_environment_said_on_one_line() -> None:
    trajectory = _trajectory()
    assert done_reason(trajectory) == "environment signalled done"
    trajectory.steps.append(_step(done=True, info={"reason": "  You\nguessed   it. "}))
    assert done_reason(trajectory) == "environment signalled done: You guessed it."
    trajectory.steps[-1] = _step(done=True, info={"metadata": {"reason": "won"}})
    assert done_reason(trajectory) == "environment signalled done: won"
    for nothing in ({"reason": " \n "}, {"reason": 5}, {}):
        trajectory.steps[-1] = _step(done=True, info=nothing)
        assert done_reason(trajectory) == "environment signalled done"
    # A reason on a step that did not end the episode is not why it ended.
    trajectory.steps[-1] = _step(done=False, info={"reason": "not yet"})
    assert done_reason(trajectory) == "environment signalled done"


def test_a_long_reason_is_cut_to_240_characters() -> None:
    trajectory = _trajectory()
    trajectory.steps.append(_step(done=True, info={"reason": "a" * 240}))
    assert done_reason(trajectory) == "environment signalled done: " + "a" * 240
    trajectory.steps[-1] = _step(done=True, info={"reason": "b" * 241})
    assert done_reason(trajectory) == "environment signalled done: " + "b" * 239 + "…"


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("value", "number"),
    [(1, 1.0), (-2.5, -2.5), (0, 0.0), (True, None), (False, None), ("1", None), (None, None), (math.nan, None),
     (math.inf, None), (-math.inf, None), (10**400, None), ([1], None)],
)
def test_a_finite_number_is_a_json_number_a_float_holds(value: Any, number: float | None) -> None:
    got = finite_number(value)
    assert got == number and (got is None or type(got) is float)


def test_a_quantile_is_the_nearest_rank_value() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 9.0, 8.0, 7.0, 6.0]
    ranks = {0.0: 1.0, 0.05: 1.0, 0.1: 1.0, 0.11: 2.0, 0.5: 5.0, 0.9: 9.0, 0.91: 10.0, 1.0: 10.0}
    assert {q: quantile(values, q) for q in ranks} == ranks
    assert quantile([0.0, 1.0, 1.0], 0.5) == 1.0 and quantile([0.0, 0.0, 1.0], 0.9) == 1.0
    assert quantile([3.0], 0.0) == quantile([3.0], 1.0) == 3.0


@pytest.mark.parametrize(
    "values", [[1.0, 2.0, 3.0, 4.0], [5.0], [-1.0, 1.0], [0.0, 0.0], [1e308, 1.7e308, -1e308], [1e-300, 3e-300]]
)
def test_mean_and_population_std_are_finite_however_large_the_values(values: list[float]) -> None:
    mean, std = mean_and_std(values)
    # In exact fractions: only the square root is taken in floats, of a variance scaled to at most 1.
    exact = [Fraction(v) for v in values]
    exact_mean = sum(exact) / len(exact)
    scale = max(abs(v) for v in exact) or 1
    variance = sum(((v - exact_mean) / scale) ** 2 for v in exact) / len(exact)
    assert mean == pytest.approx(float(exact_mean), rel=1e-12, abs=0.0)
    assert std == pytest.approx(math.sqrt(variance) * float(scale), rel=1e-9, abs=0.0)
    assert math.isfinite(mean) and math.isfinite(std)


def test_numbers_are_written_with_places_then_in_exponent_form_from_a_million() -> None:
    assert number_text(0.12345) == "0.123"
    assert number_text(2.5, 1) == "2.5"
    assert number_text(999_999.0) == "999999.000"
    assert number_text(1_000_000.0) == "1e+06"
    assert number_text(-1_000_000.0) == "-1e+06"
    assert number_text(1.7e308, 2) == "1.7e+308"


@pytest.mark.parametrize(
    ("successes", "stated", "episodes", "text"),
    [
        (0, 0, 5, "n/a (neither the env nor the scheduler states success)"),
        (1, 2, 2, "50.0% (1/2)"),
        (1, 2, 5, "50.0% (1/2; 3 not stated)"),
        (2, 3, 3, "66.7% (2/3)"),
        (0, 1, 1, "0.0% (0/1)"),
    ],
)
def test_a_success_rate_is_over_the_episodes_that_state_success(successes: int, stated: int, episodes: int, text: str) -> None:
    assert success_text(successes, stated, episodes) == text


# ---------------------------------------------------------------- reward parts


@pytest.mark.parametrize(
    ("value", "steps", "bases", "count"),
    [
        (3.0, [1.0, 2.0], {"sum"}, 2),
        (1.5, [1.0, 2.0], {"mean"}, 2),
        (2.5, [1.0, 2.0], set(), 2),
        (2.0, [0.0, 2.0, 4.0], {"mean"}, 3),
        (4.0, [0.0, 2.0, 4.0], {"last"}, 3),
        (5.0, [5.0], {"sum", "mean", "last"}, 1),
        (0.0, [0.0, None, 0.0], {"sum", "mean", "last"}, 2),
        (7.0, [1.0, 2.0], set(), 2),
        (None, [1.0], set(), 1),
        (1.0, [None, None], set(), 0),
        (0.3, [0.1, 0.2], {"sum"}, 2),
        # Within 1e-12 of zero is zero: a rounding error is no other rule.
        (0.0, [1e-13], {"sum", "mean", "last"}, 1),
        (0.0, [1e-11], set(), 1),
    ],
)
def test_the_basis_of_a_parts_episode_value_is_what_its_steps_make(
    value: float | None, steps: list[float | None], bases: set[str], count: int
) -> None:
    assert part_basis(value, steps) == (frozenset(bases), count)


def test_labels_say_how_each_parts_episode_value_is_made() -> None:
    s, m, last = frozenset({"sum"}), frozenset({"mean"}), frozenset({"last"})
    none: frozenset[str] = frozenset()
    every = frozenset({"sum", "mean", "last"})
    labels = basis_labels({
        "moves": [(s, 3), (s, 3)],
        "score": [(m, 1), (m, 8)],
        "final": [(last, 2), (last, 5)],
        "one": [(every, 1), (every, 1), (none, 0)],
        "episode": [(none, 2), (s, 2)],
        "never": [(none, 0)],
        "mixed": [(s | m, 2), (m, 3)],
        "flat": [(every, 2), (every, 4)],
    })
    assert labels == {
        "moves": "summed over 3 steps",
        "score": "mean over 1-8 steps",
        "final": "last of 2-5 steps",
        "one": "1 step per episode",
        "episode": "per episode",
        "never": "per episode",
        "mixed": "mean over 2-3 steps",
        # Fits every rule: the one the run's other parts show alone, in PART_BASES' order (mean first).
        "flat": "mean over 2-4 steps",
    }


def test_a_part_that_fits_every_rule_takes_the_one_the_other_parts_show() -> None:
    every = frozenset({"sum", "mean", "last"})
    assert basis_labels({"flat": [(every, 3)], "moves": [(frozenset({"sum"}), 3)]})["flat"] == "summed over 3 steps"
    assert basis_labels({"flat": [(every, 3)], "end": [(frozenset({"last"}), 3)]})["flat"] == "last of 3 steps"
    assert basis_labels({"flat": [(every, 3)]})["flat"] == "mean over 3 steps"
    assert basis_labels({"flat": [(frozenset({"sum", "last"}), 3)]})["flat"] == "last of 3 steps"


def test_episode_components_are_the_declared_finite_numbers() -> None:
    trajectory = _trajectory()
    assert episode_components(trajectory) == {}
    trajectory.rollout_infos["reward_parts"] = [1.0]
    assert episode_components(trajectory) == {}
    trajectory.rollout_infos["reward_parts"] = {"a": 1, "b": math.nan, 3: 2.5, "c": "x", "d": True}
    assert episode_components(trajectory) == {"a": 1.0, "3": 2.5}


# ---------------------------------------------------------------- the record


def _played() -> Trajectory:
    trajectory = _trajectory(eval={"example": "seed-4", "index": 1, "run": "r", "attempt": 1})
    trajectory.messages.append({"role": "user", "content": "board"})
    trajectory.steps += [
        _step(0.25, info={"timings": {"time_s": 0.5, "bad": "x"}}, right=0.0, progress=0.25, running=0.25),
        _step(0.75, done=True, info={"metadata": {"timings": {"time_s": 1.0, "nan": math.nan}}}, right=1.0, progress=math.nan),
    ]
    trajectory.finish("done", "solved")
    trajectory.turns, trajectory.total_reward, trajectory.success = 2, 4.0, True
    trajectory.rollout_infos.update({
        "reward_parts": {"right": 1.0, "progress": 0.5, "final": 2.0},
        "total_reward": 4.0, "step_rewards": [9], "tokens": [{"ids": [1]}], "cells_filled": 3, "final": "x",
    })
    trajectory.reset_info = {"seed": 4}
    trajectory.timings = {"env": 2.0, "time_s": 9.0}
    return trajectory


def test_a_lean_record_holds_every_field_once() -> None:
    trajectory = _played()
    record = trajectory_record(trajectory)
    assert trajectory.to_dict() == record
    assert json.loads(json.dumps(record)) == record
    assert record.pop("server", None) is None  # played in-process: no server
    assert record == {
        "schema": SCHEMA,
        "uuid": "u-1",
        "env": "game",
        "seed": 4,
        "env_config": {"name": "game", "seed": 4},
        "status": "done",
        "reason": "solved",
        "truncated": False,
        "error_kind": None,
        "success": True,
        "turns": 2,
        "total_reward": 4.0,
        "step_rewards": [0.25, 0.75],
        "reward_components": {
            "right": {"value": 1.0, "steps": [0.0, 1.0]},
            "progress": {"value": 0.5, "steps": [0.25, None]},
            "final": {"value": 2.0, "steps": []},
        },
        "infos": {"cells_filled": 3},
        "messages": [{"role": "user", "content": "board"}],
        # The env's own timing summed over its steps; the scheduler's name wins over a reported one.
        "timings": {"time_s": 9.0, "env": 2.0},
        "final_observation": {"o": 0.75},
        "eval": {"example": "seed-4", "index": 1, "run": "r", "attempt": 1},
        "tokens": [{"ids": [1]}],
    }


def test_a_full_record_adds_the_steps_and_the_reset_info() -> None:
    trajectory = _played()
    full = trajectory.to_dict("full")
    assert {k: v for k, v in full.items() if k not in ("steps", "reset_info")} == trajectory_record(trajectory)
    assert full["reset_info"] == {"seed": 4}
    assert full["steps"] == [
        {k: v for k, v in step.to_dict().items() if k != "components"} for step in trajectory.steps
    ]


def test_without_declared_parts_every_step_number_is_a_component() -> None:
    trajectory = _trajectory()
    trajectory.steps += [_step(1.0, a=1.0), _step(0.0, b=2.0)]
    record = trajectory_record(trajectory)
    assert record["reward_components"] == {"a": {"value": None, "steps": [1.0, None]}, "b": {"value": None, "steps": [None, 2.0]}}
    assert record["final_observation"] is None and "eval" not in record and "tokens" not in record


def test_timings_reported_on_steps_are_summed_and_kept_beside_the_schedulers() -> None:
    trajectory = _trajectory()
    trajectory.steps += [
        _step(info={"timings": {"t": 1.0}, "metadata": {"timings": {"t": 100.0}}}),
        _step(info={"frame_metadata": {"timings": {"t": 2.0, "u": 1}}}),
        _step(info={"timings": "fast"}),
        _step(info={"metadata": {"timings": {"m": 4.0}}}),
    ]
    trajectory.timings = {"env": 0.5}
    assert trajectory_record(trajectory)["timings"] == {"t": 3.0, "u": 1.0, "m": 4.0, "env": 0.5}
    assert trajectory_record(_trajectory())["timings"] == {}


def test_a_record_of_an_episode_the_environment_did_not_end_has_no_final_observation() -> None:
    trajectory = _trajectory()
    trajectory.steps += [_step(done=True), _step(done=False)]
    assert trajectory_record(trajectory)["final_observation"] is None


# ---------------------------------------------------------------- reading a record


def _valid() -> dict[str, Any]:
    return trajectory_record(_played())


def test_a_valid_record_is_returned_as_it_is() -> None:
    record = _valid()
    assert check_record(record, "f:1") is record
    for success in (None, False):
        assert check_record({**record, "success": success}, "f:1")["success"] is success


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": "envsdk.completions/2"}, 'f:3: schema is "envsdk.completions/2", this envsdk reads \'envsdk.completions/1\''),
        ({"schema": None}, "f:3: schema is null, this envsdk reads"),
        ({"total_reward": "1"}, "f:3: no numeric 'total_reward'"),
        ({"total_reward": math.nan}, "f:3: no numeric 'total_reward'"),
        ({"success": "false"}, "f:3: 'success' must be true, false or null, got \"false\""),
        ({"success": 0}, "f:3: 'success' must be true, false or null, got 0"),
        ({"success": "y" * 100}, f"f:3: 'success' must be true, false or null, got \"{'y' * 79}\n"),
        ({"reward_components": []}, "f:3: 'reward_components' must map names to {'value': number, 'steps': [...]}"),
        ({"reward_components": {"a": 1}}, "f:3: 'reward_components' must map"),
        ({"reward_components": {"a": {"steps": []}}}, "f:3: 'reward_components' must map"),
        ({"reward_components": {"a": {"value": 1, "steps": None}}}, "f:3: 'reward_components' must map"),
    ],
)
def test_a_record_of_another_shape_is_refused_naming_where_and_what(change: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordError) as caught:
        check_record({**_valid(), **change}, "f:3")
    # A message given up to a newline is the whole message.
    assert (str(caught.value) + "\n").startswith(message)


def test_a_record_without_its_components_is_refused() -> None:
    record = _valid()
    del record["reward_components"]
    with pytest.raises(RecordError, match="reward_components"):
        check_record(record, "f:1")


@pytest.mark.parametrize(("value", "kind"), [([], "list"), ("x", "str"), (None, "NoneType")])
def test_what_is_not_an_object_is_refused_naming_its_type(value: Any, kind: str) -> None:
    with pytest.raises(RecordError) as caught:
        check_record(value, "f:9")
    assert str(caught.value) == f"f:9: expected a JSON object (a trajectory record), got {kind}"


def test_the_wrong_schema_says_how_to_get_records_this_version_reads() -> None:
    with pytest.raises(RecordError) as caught:
        check_record({**_valid(), "schema": "other"}, "f:1")
    assert str(caught.value).endswith("(records written by `envsdk rollout --out`); re-run the rollout with this version")


def test_the_summary_facts_are_the_fields_a_summary_reads() -> None:
    record = _valid()
    assert summary_facts(record) == {k: record[k] for k in ("uuid", "eval", "total_reward", "success")}
    assert summary_facts({"uuid": "a", "other": 1}) == {"uuid": "a"}


# ---------------------------------------------------------------- a record's line


def test_a_record_line_is_compact_json_ending_in_a_newline() -> None:
    line = record_bytes({"a": [1, 2], "t": "é", "n": math.nan, "s": {3}})
    assert line == '{"a":[1,2],"t":"é","n":NaN,"s":[3]}\n'.encode()
    assert record_line({"a": 1}) == '{"a":1}\n'


class _Opaque:
    """A value JSON has no form for."""

    def __str__(self) -> str:
        return "opaque"


def test_a_value_json_has_no_form_for_is_written_as_its_text() -> None:
    assert record_bytes({"o": _Opaque()}) == b'{"o":"opaque"}\n'


def test_a_record_with_a_lone_surrogate_is_written_in_json_escapes() -> None:
    line = record_bytes({"t": "\ud800x"})
    assert line == b'{"t": "\\ud800x"}\n'
    assert json.loads(line) == {"t": "\ud800x"}
    assert record_bytes({"t": "\ud800", "o": _Opaque()}) == b'{"t": "\\ud800", "o": "opaque"}\n'


@pytest.mark.parametrize(
    ("raw", "line"),
    [(b'{"a":1}\n', '{"a":1}\n'), (b'{"a":1}\r\n', '{"a":1}\n'), (b'{"a":1}', '{"a":1}\n'), (b'{"a":"\r"}\n', '{"a":"\r"}\n'),
     (b"\n", "\n"), (b"\r\n", "\n")],
)
def test_a_line_is_text_ending_in_one_newline(raw: bytes, line: str) -> None:
    assert text_line(raw, "f:1", ValueError) == line


def test_a_line_that_is_not_utf8_names_where_and_which_byte() -> None:
    with pytest.raises(KeyError) as caught:
        text_line(b'{"a":"\xff"}\n', "f:2", KeyError)
    assert caught.value.args == ("f:2: not UTF-8 text (byte 7 of the line)",)
