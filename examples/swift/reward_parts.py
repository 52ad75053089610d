"""ms-swift reward functions for envsdk's named reward parts: one reward column per part.

Load with ``--external_plugins examples/swift/reward_parts.py`` and name the parts in
``--reward_funcs envsdk_part_<name> …``. Each function reads, per completion, the episode's
value of its part from the scheduler's ``rollout_infos`` (ms-swift hands every reward function
the batch's ``rollout_infos``): first ``rollout_infos["reward_parts"][name]`` (any envsdk
environment's rubric parts), then a number stored under ``rollout_infos[name]`` (the Sudoku
scheduler's five components). A rollout without that part scores None, which ms-swift turns
into NaN and leaves out of the weighted sum — never a silent 0.

To log a part without training on it twice, give it weight 0 in ``--reward_weights`` beside
``--use_gym_env`` (whose ``total_reward`` column comes last).

Registered on import: Sudoku's ``empty_cell``, ``valid_move``, ``repetition``, ``progress``,
``correct`` and FrozenLake's shaped ``goal`` and ``format`` (``progress`` is shared), plus
every name in the comma-separated ``ENVSDK_REWARD_PARTS`` environment variable.
`register_reward_parts` registers more from Python.

ms-swift's own ``gym_scheduler`` keeps only ``total_reward``, ``step_rewards`` and
``gym_done`` in ``rollout_infos`` (it drops the env's ``info``), so parts reach these columns
through envsdk's schedulers (e.g. ``envsdk_sudoku`` from ``sudoku_scheduler.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from swift.rewards import ORM, orms

from envsdk.rewards.parts import REWARD_PARTS

PREFIX = "envsdk_part_"
DEFAULT_PARTS = ("empty_cell", "valid_move", "repetition", "progress", "correct", "goal", "format")


def part_value(infos: Any, name: str) -> float | None:
    """The episode's value of part `name` in one ``rollout_infos`` dict, or None."""
    if not isinstance(infos, dict):
        return None
    parts = infos.get(REWARD_PARTS)
    value = parts.get(name) if isinstance(parts, dict) else None
    if value is None:
        value = infos.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def reward_part_orm(name: str) -> type[ORM]:
    """An ms-swift ORM class scoring each completion by its episode's part `name`."""

    def __call__(self: ORM, completions: list[Any], rollout_infos: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
        infos = rollout_infos if rollout_infos is not None else [None] * len(completions)
        return [part_value(i, name) for i in infos]

    return type(f"EnvsdkPart_{name}", (ORM,), {"__call__": __call__, "part": name, "__doc__": f"envsdk reward part {name!r}."})


def register_reward_parts(names: Iterable[str]) -> list[str]:
    """Register ``envsdk_part_<name>`` in ms-swift's ``orms`` for each name; returns the keys."""
    keys = []
    for name in names:
        name = name.strip()
        if name:
            orms[PREFIX + name] = reward_part_orm(name)
            keys.append(PREFIX + name)
    return keys


register_reward_parts([*DEFAULT_PARTS, *os.environ.get("ENVSDK_REWARD_PARTS", "").split(",")])
