"""Rewards that live with the environment: rubrics, and every named part sent with the step.

A rubric (`Rubric`) computes a reward from an action and the observation it led to; containers
(`Sequential`, `Gate`, `WeightedSum`, `RubricList`, `RubricDict`) compose them, `LLMJudge` asks a
language model, `TrajectoryRubric` scores a finished episode with per-step credit. The API and
semantics are OpenEnv 0.10's (``openenv.core.rubrics``), and OpenEnv's rubric objects are accepted
as they are, in envsdk containers and by an envsdk `Environment` (``super().__init__(rubric=R)``,
``self._reset_rubric()`` in reset, ``obs.reward = self._apply_rubric(action, obs)`` in step).

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
