"""Rewards that live with the environment: rubrics, and every named part sent with the step.

A rubric (`Rubric`) computes a reward from an action and the observation it led to; containers
(`Sequential`, `Gate`, `WeightedSum`, `RubricList`, `RubricDict`) compose them, `LLMJudge` asks a
language model, `TrajectoryRubric` scores a finished episode with per-step credit. The classes,
their arguments and hook order are OpenEnv 0.10's (``openenv.core.rubrics``; the same rubric
scores the same through either package), and OpenEnv's rubric objects are accepted as they are,
in envsdk containers and by an envsdk `Environment` (``super().__init__(rubric=R)``,
``self._reset_rubric()`` in reset, ``obs.reward = self._apply_rubric(action, obs)`` in step).

Where envsdk differs, on purpose: a container with only sync children returns a float even
inside a running event loop (OpenEnv's `Sequential` returns a coroutine there); a coroutine-function
hook on a call that stays synchronous raises `TypeError` (OpenEnv never runs it); `LLMJudge`
raises on an unreadable reply unless given a ``default_score`` and by default reads the last
``Score: <number>`` (see `envsdk.rewards.llm_judge`).

What OpenEnv lacks: every named part of the score travels with the observation, in the
``reward_components`` metadata field (see `envsdk.rewards.parts`), so schedulers, the trainer's
reward columns, ``completions.jsonl`` and reports see the same parts.
"""

from envsdk.rewards.base import Rubric, is_rubric
from envsdk.rewards.containers import Gate, RubricDict, RubricList, Sequential, WeightedSum
from envsdk.rewards.llm_judge import DEFAULT_SCORE_PATTERN, JudgeReplyError, LLMJudge
from envsdk.rewards.parts import (
    REWARD_COMPONENTS,
    REWARD_PARTS,
    Scored,
    ascore,
    components_from,
    episode_parts,
    evaluated,
    part_names,
    score,
)
from envsdk.rewards.trajectory import ExponentialDiscountingTrajectoryRubric, TrajectoryRubric

__all__ = [
    "Rubric",
    "is_rubric",
    "Sequential",
    "Gate",
    "WeightedSum",
    "RubricList",
    "RubricDict",
    "LLMJudge",
    "JudgeReplyError",
    "DEFAULT_SCORE_PATTERN",
    "TrajectoryRubric",
    "ExponentialDiscountingTrajectoryRubric",
    "REWARD_COMPONENTS",
    "REWARD_PARTS",
    "Scored",
    "score",
    "ascore",
    "part_names",
    "components_from",
    "episode_parts",
    "evaluated",
]
