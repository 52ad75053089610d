"""Reward functions for ``GRPOTrainer``: the environment's total and its named components as columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envsdk.integrations.trl.environment_factory import EpisodeEnvironment

#: Sudoku's shaped reward components, as `SudokuScheduler` reports them in ``rollout_infos``.
SUDOKU_REWARD_COMPONENTS: tuple[str, ...] = ("empty_cell", "valid_move", "repetition", "progress", "correct")


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


def reward_component_funcs(names: Sequence[str] = SUDOKU_REWARD_COMPONENTS) -> list[Callable[..., list[float | None]]]:
    """One reward function per reward component, named after it, reading the component from
    `make_rollout_func`'s fields or from the ``environments`` TRL passes with
    ``environment_factory``. Give them weight 0.0 to log each component (``rewards/<name>/mean``)
    without counting it twice in the reward."""
    funcs: list[Callable[..., list[float | None]]] = []
    for name in names:

        def component(completions: list[Any], _name: str = name, **kwargs: Any) -> list[float | None]:
            values = kwargs.get(_name)
            if values is not None:
                return [None if v is None else float(v) for v in values]
            environments = kwargs.get("environments")
            if environments is not None:
                return [
                    e.reward_components.get(_name) if isinstance(e, EpisodeEnvironment) else None for e in environments
                ]
            raise ValueError(f"no reward component {_name!r}: neither a rollout field nor environments carry it")

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
