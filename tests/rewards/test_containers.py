"""envsdk's rubric containers against OpenEnv 0.10's own, on the same inputs.

Every tree is built twice from one recipe — once from ``openenv.core.rubrics``, once from
``envsdk.rewards`` — and both are asked the same questions: the score, every named part's
``last_score``, the named paths, ``get_rubric``, hooks, ``state_dict`` round trips, errors.
"""

from __future__ import annotations

import asyncio
import itertools
from types import ModuleType
from typing import Any

import pytest

oe = pytest.importorskip("openenv.core.rubrics", reason="needs the real openenv package (test extra)")

import envsdk.rewards as ev

PACKAGES = {"openenv": oe, "envsdk": ev}


def _leaf_classes(pkg: ModuleType) -> dict[str, type]:
    """Leaves for `pkg`: each reads one key of the observation dict (sync or async) and counts
    its calls, so a test can see which children a container evaluated."""

    class Field(pkg.Rubric):  # type: ignore[name-defined, misc]
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key
            self.calls = 0

        def forward(self, action: Any, observation: dict[str, float]) -> float:
            self.calls += 1
            return observation[self.key]

    class AsyncField(pkg.Rubric):  # type: ignore[name-defined, misc]
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key
            self.calls = 0

        async def forward(self, action: Any, observation: dict[str, float]) -> float:
            self.calls += 1
            await asyncio.sleep(0)
            return observation[self.key]

    class Pick(pkg.Rubric):  # type: ignore[name-defined, misc]
        """Uses a RubricDict and a RubricList the way their docs say: a parent picks one."""

        def __init__(self) -> None:
            super().__init__()
            self.games = pkg.RubricDict({"a": Field("a"), "b": Field("b")})
            self.extra = pkg.RubricList([Field("c"), Field("a")])

        def forward(self, action: Any, observation: dict[str, float]) -> float:
            key = "a" if action == "left" else "b"
            return self.games[key](action, observation) + 0.5 * self.extra[1](action, observation)

    class Episode(pkg.ExponentialDiscountingTrajectoryRubric):  # type: ignore[name-defined, misc]
        def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
            return float(trajectory[-1][1]["a"])

    return {"Field": Field, "AsyncField": AsyncField, "Pick": Pick, "Episode": Episode}


def _tree(pkg: ModuleType) -> Any:
    """One rubric using every container: gates, a fail-fast sequence, weights, dict, list."""
    leaf = _leaf_classes(pkg)
    Field = leaf["Field"]
    return pkg.WeightedSum(
        [
            pkg.Sequential(pkg.Gate(Field("a"), threshold=0.5), Field("b"), pkg.Gate(Field("c"), threshold=0.25)),
            leaf["Pick"](),
            pkg.Gate(Field("c"), threshold=0.0),
        ],
        weights=[0.5, 0.3, 0.2],
    )


INPUTS = [
    {"a": a, "b": b, "c": c}
    for a, b, c in itertools.product([0.0, 0.25, 0.5, 0.7, 1.0], [0.0, 0.3, 1.0], [0.0, 0.2, 0.25, 0.9])
]


def _last_scores(rubric: Any) -> dict[str, Any]:
    return {path: part.last_score for path, part in rubric.named_rubrics()}


def _calls(rubric: Any) -> dict[str, int]:
    return {path: part.calls for path, part in rubric.named_rubrics() if hasattr(part, "calls")}


@pytest.mark.parametrize("action", ["left", "right"])
def test_every_container_scores_like_openenv_on_the_same_inputs(action: str) -> None:
    trees = {name: _tree(pkg) for name, pkg in PACKAGES.items()}
    for observation in INPUTS:
        scores = {name: tree(action, observation) for name, tree in trees.items()}
        assert scores["envsdk"] == scores["openenv"], observation  # bit for bit: same order of operations
        assert _last_scores(trees["envsdk"]) == _last_scores(trees["openenv"]), observation
        assert _calls(trees["envsdk"]) == _calls(trees["openenv"]), observation
    assert trees["envsdk"].last_score == trees["openenv"].last_score


def test_sequential_stops_at_the_first_zero_and_gate_keeps_a_score_equal_to_its_threshold() -> None:
    for pkg in PACKAGES.values():
        Field = _leaf_classes(pkg)["Field"]
        first, second = Field("a"), Field("b")
        seq = pkg.Sequential(first, second)
        assert seq(None, {"a": 0.0, "b": 1.0}) == 0.0 and second.calls == 0
        assert seq(None, {"a": 0.3, "b": 0.6}) == 0.6 and second.calls == 1
        assert pkg.Sequential()(None, {}) == 1.0
        gate = pkg.Gate(Field("a"), threshold=0.4)
        assert [gate(None, {"a": v}) for v in (0.39, 0.4, 0.8)] == [0.0, 0.4, 0.8]


def test_named_paths_and_get_rubric_match_openenv() -> None:
    trees = {name: _tree(pkg) for name, pkg in PACKAGES.items()}
    paths = {name: [p for p, _ in tree.named_rubrics()] for name, tree in trees.items()}
    assert paths["envsdk"] == paths["openenv"]
    assert "rubric_1.games.a" in paths["envsdk"] and "rubric_1.extra.rubric_1" in paths["envsdk"]
    assert ev.part_names(trees["openenv"]) == paths["openenv"]
    for path in paths["envsdk"]:
        assert type(trees["envsdk"].get_rubric(path)).__name__ == type(trees["openenv"].get_rubric(path)).__name__
    for tree in trees.values():
        with pytest.raises(KeyError, match="Rubric path not found: rubric_0.nope"):
            tree.get_rubric("rubric_0.nope")
    assert [n for n, _ in trees["envsdk"].named_children()] == [n for n, _ in trees["openenv"].named_children()]
    assert trees["envsdk"].weights == trees["openenv"].weights == [0.5, 0.3, 0.2]


@pytest.mark.parametrize(
    "rubrics_weights",
    [(2, [0.5, 0.6]), (2, [1.0]), (3, [0.2, 0.2, 0.2])],
)
def test_weighted_sum_refuses_bad_weights_like_openenv(rubrics_weights: tuple[int, list[float]]) -> None:
    count, weights = rubrics_weights
    for pkg in PACKAGES.values():
        Field = _leaf_classes(pkg)["Field"]
        with pytest.raises(ValueError):
            pkg.WeightedSum([Field("a") for _ in range(count)], weights=weights)


def test_state_dict_round_trip_matches_openenv() -> None:
    states: dict[str, dict[str, Any]] = {}
    for name, pkg in PACKAGES.items():
        episode = _leaf_classes(pkg)["Episode"](gamma=0.7, intermediate_reward=0.1)
        tree = pkg.RubricDict({"episode": episode, "main": _tree(pkg)})
        states[name] = {path: part.state_dict() for path, part in tree.named_rubrics()}
        fresh = _leaf_classes(pkg)["Episode"](gamma=0.2)
        fresh.load_state_dict(episode.state_dict())
        assert (fresh.gamma, fresh.intermediate_reward) == (0.7, 0.1)
    assert states["envsdk"] == states["openenv"]
    assert states["envsdk"]["episode"] == {"intermediate_reward": 0.1, "gamma": 0.7}


def test_hooks_run_in_the_same_order_as_openenv() -> None:
    events: dict[str, list[tuple[str, str, Any]]] = {}
    for name, pkg in PACKAGES.items():
        log: list[tuple[str, str, Any]] = events.setdefault(name, [])
        tree = _tree(pkg)
        for path, part in [("root", tree), *tree.named_rubrics()]:
            part.register_forward_pre_hook(lambda r, a, o, p=path, log=log: log.append(("pre", p, None)))
            part.register_forward_hook(lambda r, a, o, s, p=path, log=log: log.append(("post", p, s)))
        tree("left", INPUTS[37])
    assert events["envsdk"] == events["openenv"]
    assert events["envsdk"][0] == ("pre", "root", None) and events["envsdk"][-1][:2] == ("post", "root")


async def test_async_children_give_the_same_scores_as_openenv() -> None:
    results: dict[str, tuple[float, dict[str, Any]]] = {}
    for name, pkg in PACKAGES.items():
        leaf = _leaf_classes(pkg)
        tree = pkg.WeightedSum(
            [pkg.Sequential(leaf["Field"]("a"), leaf["AsyncField"]("b")), pkg.Gate(leaf["AsyncField"]("c"), 0.5)],
            weights=[0.25, 0.75],
        )
        total = 0.0
        for observation in INPUTS:
            pending = tree("x", observation)
            assert asyncio.iscoroutine(pending)
            total += await pending
        results[name] = (total, _last_scores(tree))
    assert results["envsdk"] == results["openenv"]


class _DoneObservation(dict[str, float]):
    """A final observation: a dict the leaves read, with ``done`` set as trajectory rubrics expect."""

    done = True


def test_exponential_discounting_credits_steps_like_openenv() -> None:
    for pkg in PACKAGES.values():
        episode = _leaf_classes(pkg)["Episode"](gamma=0.5)
        rewards = [episode(step, {"a": 1.0, "done": False}) for step in range(2)]
        rewards.append(episode(2, _DoneObservation({"a": 1.0})))
        assert rewards == [0.0, 0.0, 1.0]
        assert episode.compute_step_rewards() == [0.25, 0.5, 1.0]
        episode.reset()
        assert episode.compute_step_rewards() == [] and episode.trajectory == []
        with pytest.raises(ValueError, match="gamma"):
            _leaf_classes(pkg)["Episode"](gamma=1.5)


def test_openenv_rubrics_nest_in_envsdk_containers_and_are_scored_with_their_parts() -> None:
    oe_field = _leaf_classes(oe)["Field"]
    mixed = ev.WeightedSum([oe.Gate(oe_field("a"), 0.5), ev.Gate(oe_field("b"), 0.5)], weights=[0.5, 0.5])
    assert ev.part_names(mixed) == ["rubric_0", "rubric_0.rubric", "rubric_1", "rubric_1.rubric"]
    scored = ev.score(mixed, None, {"a": 0.8, "b": 0.1})
    assert scored.reward == 0.5 * 0.8 + 0.5 * 0.0
    assert scored.parts == {"rubric_0": 0.8, "rubric_0.rubric": 0.8, "rubric_1": 0.0, "rubric_1.rubric": 0.1}


def test_a_part_skipped_this_step_reads_none_not_an_old_score() -> None:
    for pkg in PACKAGES.values():
        Field = _leaf_classes(pkg)["Field"]
        seq = pkg.Sequential(Field("a"), Field("b"))
        assert ev.score(seq, None, {"a": 1.0, "b": 0.5}).parts == {"rubric_0": 1.0, "rubric_1": 0.5}
        assert ev.score(seq, None, {"a": 0.0, "b": 0.5}).parts == {"rubric_0": 0.0, "rubric_1": None}


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_score_refuses_an_async_rubric_and_ascore_awaits_it() -> None:
    leaf = _leaf_classes(ev)
    tree = ev.WeightedSum([leaf["Field"]("a"), leaf["AsyncField"]("b")], weights=[0.5, 0.5])
    with pytest.raises(TypeError, match="ascore"):
        ev.score(tree, None, {"a": 1.0, "b": 0.0})
    scored = await ev.ascore(tree, None, {"a": 1.0, "b": 0.5})
    assert scored.reward == 0.75 and scored.parts == {"rubric_0": 1.0, "rubric_1": 0.5}


async def test_openenv_sequential_inside_a_running_loop_is_scored_by_ascore() -> None:
    """OpenEnv's Sequential returns a coroutine whenever an event loop runs, even with sync
    children (an async env's step): `ascore` awaits it, `score` says to use `ascore`."""
    Field = _leaf_classes(oe)["Field"]
    rubric = oe.Sequential(Field("a"), Field("b"))
    scored = await ev.ascore(rubric, None, {"a": 0.5, "b": 0.25})
    assert scored.reward == 0.25 and scored.parts == {"rubric_0": 0.5, "rubric_1": 0.25}
    with pytest.raises(TypeError, match="ascore"):
        ev.score(rubric, None, {"a": 0.5, "b": 0.25})
    # envsdk's own Sequential stays sync with sync children, loop or not.
    ours = ev.Sequential(_leaf_classes(ev)["Field"]("a"), _leaf_classes(ev)["Field"]("b"))
    assert ev.score(ours, None, {"a": 0.5, "b": 0.25}).reward == 0.25
