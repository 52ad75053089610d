"""Reward functions for ``GRPOTrainer``: the environment's total and its named components as columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envsdk.integrations.trl.environment_factory import EpisodeEnvironment
from envsdk.rewards.base import is_rubric
from envsdk.rewards.parts import REWARD_PARTS, part_names
from envsdk.schedulers.sudoku import SUDOKU_COMPONENTS

#: Sudoku's shaped reward components, as `SudokuScheduler` reports them in ``rollout_infos``.
SUDOKU_REWARD_COMPONENTS: tuple[str, ...] = SUDOKU_COMPONENTS


def env_reward_func(completions: list[Any], env_reward: list[float | None] | None = None, **kwargs: Any) -> list[float | None]:
    """The environment's episode reward as a reward column (reads `make_rollout_func`'s
    ``env_reward`` field). With ``environment_factory`` TRL already adds the environment's
    ``get_reward`` column itself: do not add this one too."""
    if env_reward is None:
        raise ValueError(
            "env_reward_func found no `env_reward` field: it scores rollouts made by make_rollout_func. With "
            "environment_factory, TRL adds the environment's get_reward() as a reward column by itself."
        )
    return [None if r is None else float(r) for r in env_reward]


def reward_component_funcs(names: Sequence[str] | Any = SUDOKU_REWARD_COMPONENTS) -> list[Callable[..., list[float | None]]]:
    """One reward function per named reward part, named after it (TRL logs
    ``rewards/<name>/mean``): any environment's parts, not only Sudoku's.

    `names` is a sequence of part names, or a rubric (envsdk or OpenEnv), whose named parts
    (``named_rubrics()`` paths, e.g. ``"progress"``, ``"code.syntax"``) are taken. A function
    reads its part from `make_rollout_func`'s ``reward_parts`` field (the episode's value of
    each part; None for a failed episode, 0.0 for a part the episode never scored) or, with
    ``environment_factory``, from the ``environments`` TRL passes. Give them weight 0.0 to log
    each part without counting it twice in the reward."""
    wanted = part_names(names) if is_rubric(names) else [str(n) for n in names]
    if not wanted:
        raise ValueError("reward_component_funcs needs at least one part name (the rubric has no named parts)")
    funcs: list[Callable[..., list[float | None]]] = []
    for name in wanted:

        def component(completions: list[Any], _name: str = name, **kwargs: Any) -> list[float | None]:
            rows = kwargs.get(REWARD_PARTS)
            if rows is not None:
                return [None if parts is None else float(parts.get(_name, 0.0)) for parts in rows]
            environments = kwargs.get("environments")
            if environments is not None:
                return [
                    e.reward_components.get(_name) if isinstance(e, EpisodeEnvironment) else None for e in environments
                ]
            raise ValueError(
                f"no reward part {_name!r}: neither a `{REWARD_PARTS}` rollout field (make_rollout_func) nor "
                "environments (environment_factory) carry it"
            )

        component.__name__ = name
        component.__qualname__ = name
        funcs.append(component)
    return funcs


def with_env_reward(
    reward_funcs: Sequence[Callable[..., Any]] | None = None,
    reward_weights: Sequence[float] | None = None,
    env_weight: float = 1.0,
) -> tuple[list[Callable[..., Any]], list[float]]:
    """``(reward_funcs, reward_weights)`` with the environment's reward as the last column, as
    ms-swift's ``--use_gym_env`` does: `env_reward_func` appended with weight `env_weight`
    (other functions weigh 1.0 unless `reward_weights` says otherwise). Pass them to
    ``GRPOTrainer(reward_funcs=...)`` and ``GRPOConfig(reward_weights=...)``."""
    funcs = list(reward_funcs or [])
    if reward_weights is None:
        weights = [1.0] * len(funcs)
    else:
        weights = [float(w) for w in reward_weights]
        if len(weights) != len(funcs):
            raise ValueError(f"{len(weights)} reward_weights for {len(funcs)} reward_funcs")
    return [*funcs, env_reward_func], [*weights, float(env_weight)]
