"""Scoring a rubric with all its named parts, and where the parts travel.

OpenEnv's server sends only a rubric's scalar. envsdk sends every named part too, in one
field, ``REWARD_COMPONENTS`` (``"reward_components"``):

* on the wire, in the observation's ``metadata`` (so both in the observation body and in the
  frame's top-level ``metadata``, where OpenEnv 0.10 repeats it);
* from a local `Env`, in the step's ``info``.

Its value maps each named descendant's dotted path (``named_rubrics()``: ``"progress"``,
``"code.syntax"``) to the score that part gave on this step, or None when the part was not
evaluated on this step (e.g. after a `Sequential` stopped early). The rubric's own score is
the step's reward when the environment says so (OpenEnv's ``obs.reward =
self._apply_rubric(action, obs)``).

An environment written against OpenEnv's own classes scores with OpenEnv's
``_apply_rubric``, which returns the scalar only: the server reads its rubric's named parts
after each step (`clear_parts` before it, `record_parts` after) and sends them the same way,
unless the step put ``reward_components`` in the metadata itself.

JSON has no NaN or infinity, and a null part means "not evaluated": a non-finite reward or
part is refused, never sent (`non_finite`).

Schedulers keep each step's parts (`StepRecord.components`) and give the episode's value of
each part in ``rollout_infos["reward_parts"]``: the sum of its step values (steps where it
was not evaluated add nothing), as an episode's reward is the sum of its step rewards.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "REWARD_COMPONENTS",
    "REWARD_PARTS",
    "TIMINGS",
    "Scored",
    "part_names",
    "score",
    "ascore",
    "components_from",
    "episode_parts",
    "evaluated",
    "clear_parts",
    "record_parts",
    "non_finite",
]

#: The metadata (wire) / info (local `Env`) key holding a step's named parts.
REWARD_COMPONENTS = "reward_components"
#: The ``rollout_infos`` key holding an episode's value of each named part.
REWARD_PARTS = "reward_parts"
#: The metadata (wire) / info (local `Env`) key holding a step's timings (name → seconds): a
#: latency is no part of the reward, so it travels here; records add them up per episode
#: (`envsdk.records`' ``timings``).
TIMINGS = "timings"


@dataclass(frozen=True)
class Scored:
    """One evaluation: the rubric's score and each named part's score (None: not evaluated)."""

    reward: float
    parts: dict[str, float | None] = field(default_factory=dict)


def part_names(rubric: Any) -> list[str]:
    """The dotted paths of every named part of `rubric` (envsdk or OpenEnv), depth first."""
    return [path for path, _ in rubric.named_rubrics()]


def _clear(rubric: Any) -> list[tuple[str, Any]]:
    # A part skipped this step would otherwise still show the score of an earlier step.
    named = list(rubric.named_rubrics())
    for _, part in named:
        part.last_score = None
    return named


def _collect(named: list[tuple[str, Any]]) -> dict[str, float | None]:
    return {path: None if part.last_score is None else float(part.last_score) for path, part in named}


def score(rubric: Any, action: Any, observation: Any) -> Scored:
    """Evaluate `rubric` synchronously and collect its parts.

    `TypeError` when the rubric turns out to be async (an ``async def forward`` or an async
    child, or an OpenEnv `Sequential` called inside a running event loop): use `ascore`.
    """
    named = _clear(rubric)
    result = rubric(action, observation)
    if hasattr(result, "__await__"):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise TypeError(
            f"{type(rubric).__name__} is async here (it returned a coroutine): score it with `await ascore(...)`"
            " / `await self._apply_rubric_async(...)`"
        )
    return Scored(reward=float(result), parts=_collect(named))


async def ascore(rubric: Any, action: Any, observation: Any) -> Scored:
    """Evaluate `rubric` (sync or async) and collect its parts."""
    named = _clear(rubric)
    result = rubric(action, observation)
    if hasattr(result, "__await__"):
        result = await result
    return Scored(reward=float(result), parts=_collect(named))


_ONLY_STR = {str}
_ONLY_FLOAT = {float}


def all_finite_floats(values: Collection[Any]) -> bool:
    """Whether `values` are floats (not ints, bools or subclasses), at least one, all finite:
    checked in C, for the usual case of reward numbers. False when a sum of finite values
    overflows: a caller then checks the values one by one, as it does for anything else."""
    return set(map(type, values)) == _ONLY_FLOAT and math.isfinite(sum(values))


def components_from(mapping: Mapping[str, Any] | None) -> dict[str, float | None] | None:
    """The parts carried by an observation's ``metadata`` (or a local env's ``info``), or None
    when it carries none. `ValueError` for a field that is not ``{str: number | None}``."""
    if not mapping or REWARD_COMPONENTS not in mapping:
        return None
    value = mapping[REWARD_COMPONENTS]
    # The usual case, checked in C: str names and finite float values.
    if type(value) is dict and set(map(type, value)) == _ONLY_STR and all_finite_floats(value.values()):
        return dict(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{REWARD_COMPONENTS} must be an object of name -> number, got {type(value).__name__}")
    parts: dict[str, float | None] = {}
    for name, part in value.items():
        if part is None:
            parts[str(name)] = None
        elif isinstance(part, (int, float)) and not isinstance(part, bool) and math.isfinite(part):
            parts[str(name)] = float(part)
        else:
            raise ValueError(f"{REWARD_COMPONENTS}[{name!r}] must be a finite number or null, got {part!r}")
    return parts


def episode_parts(steps: Iterable[Mapping[str, float | None]]) -> dict[str, float | None]:
    """An episode's value of each part from its steps' parts: the sum of the step values that
    were evaluated; None for a part never evaluated."""
    totals: dict[str, float | None] = {}
    for parts in steps:
        for name, value in parts.items():
            if value is None:
                totals.setdefault(name, None)
            else:
                previous = totals.get(name)
                totals[name] = value if previous is None else previous + value
    return totals


def evaluated(parts: Mapping[str, float | None] | None) -> dict[str, float]:
    """The parts that were evaluated (not None): what a step record keeps."""
    return {name: value for name, value in (parts or {}).items() if value is not None}


def clear_parts(rubric: Any) -> list[tuple[str, Any]]:
    """Before a step: forget every named part's last score (so that a part the step does not
    evaluate reads None after it) and return the parts, for `record_parts`."""
    return _clear(rubric)


def record_parts(observation: Any, named: list[tuple[str, Any]]) -> None:
    """After a step: put the parts `named` (from `clear_parts`) scored during the step into
    ``observation.metadata[REWARD_COMPONENTS]``, unless the step put parts there itself or
    evaluated none (the rubric did not run)."""
    metadata = getattr(observation, "metadata", None)
    if not named or not isinstance(metadata, dict) or REWARD_COMPONENTS in metadata:
        return
    parts = _collect(named)
    if any(value is not None for value in parts.values()):
        metadata[REWARD_COMPONENTS] = parts


def _is_non_finite(value: Any) -> bool:
    kind = type(value)
    if kind is float:  # the usual cases first: the ABC checks below cost microseconds each
        return not math.isfinite(value)
    if kind is int or value is None:
        return False
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, numbers.Integral)
        and not math.isfinite(value)
    )


def non_finite(reward: Any, metadata: Mapping[str, Any] | None) -> str | None:
    """What is not a finite number among a step's `reward` and its parts
    (``metadata[REWARD_COMPONENTS]``), e.g. ``"a non-finite reward (nan)"``; None when all are
    finite (or absent)."""
    if _is_non_finite(reward):
        return f"a non-finite reward ({reward})"
    parts = metadata.get(REWARD_COMPONENTS) if isinstance(metadata, Mapping) else None
    if type(parts) is dict and parts and all_finite_floats(parts.values()):
        return None  # every step of a shaped rubric: checked in C
    if isinstance(parts, Mapping):
        for name, value in parts.items():
            if _is_non_finite(value):
                return f"a non-finite reward part {str(name)[:256]!r} ({value})"
    return None
