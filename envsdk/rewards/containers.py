"""Rubric containers, with OpenEnv 0.10's semantics (``openenv.core.rubrics.containers``).

* `Sequential(*rubrics)` — children in order; the first that scores 0 stops the rest and the
  result is 0; otherwise the last child's score (1.0 when empty).
* `Gate(rubric, threshold=1.0)` — the child's score, or 0 when it is below `threshold`.
* `WeightedSum(rubrics, weights)` — Σ weightᵢ·scoreᵢ; the weights must sum to 1 (±1e-6).
* `RubricList` / `RubricDict` — named holders with no aggregation of their own (their
  ``forward`` raises `NotImplementedError`): a parent rubric decides how to use them.

Children may be envsdk or OpenEnv rubrics, sync or async. With only sync children a
container returns a float, even inside a running event loop (OpenEnv's `Sequential` returns a
coroutine there); with an async child it returns a coroutine, and `WeightedSum` awaits its
async children concurrently. Children are named ``rubric_0``, ``rubric_1``… (dict keys for
`RubricDict`), so paths such as ``"rubric_1.rubric_0"`` name the same part in both packages.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from typing import Any

from envsdk.rewards.base import Rubric

__all__ = ["Sequential", "Gate", "WeightedSum", "RubricList", "RubricDict"]


class Sequential(Rubric):
    """Run children in order; 0 from any child stops the rest and scores 0 (fail fast)."""

    def __init__(self, *rubrics: Any) -> None:
        super().__init__()
        for i, rubric in enumerate(rubrics):
            setattr(self, f"rubric_{i}", rubric)
        self._rubric_list = list(rubrics)

    def forward(self, action: Any, observation: Any) -> Any:
        result = 1.0
        for i, rubric in enumerate(self._rubric_list):
            score = rubric(action, observation)
            if inspect.isawaitable(score):
                return self._continue_async(action, observation, score, i + 1)
            if score == 0.0:
                return 0.0
            result = score
        return result

    async def _continue_async(self, action: Any, observation: Any, pending: Awaitable[Any], start: int) -> float:
        score = await pending
        if score == 0.0:
            return 0.0
        for rubric in self._rubric_list[start:]:
            score = rubric(action, observation)
            if inspect.isawaitable(score):
                score = await score
            if score == 0.0:
                return 0.0
        return float(score)

    def __len__(self) -> int:
        return len(self._rubric_list)

    def __getitem__(self, index: int) -> Any:
        return self._rubric_list[index]


class Gate(Rubric):
    """The child's score when it reaches `threshold`, else 0."""

    def __init__(self, rubric: Any, threshold: float = 1.0) -> None:
        super().__init__()
        self.rubric = rubric
        self.threshold = threshold

    def forward(self, action: Any, observation: Any) -> Any:
        score = self.rubric(action, observation)
        if inspect.isawaitable(score):
            return self._gate_async(score)
        return self._gate(score)

    def _gate(self, score: float) -> float:
        return 0.0 if score < self.threshold else float(score)

    async def _gate_async(self, pending: Awaitable[Any]) -> float:
        return self._gate(await pending)


class WeightedSum(Rubric):
    """Σ weightᵢ·scoreᵢ over the children. `ValueError` when the lengths differ or the weights
    do not sum to 1 (within 1e-6)."""

    def __init__(self, rubrics: list[Any], weights: list[float]) -> None:
        super().__init__()
        if len(rubrics) != len(weights):
            raise ValueError(f"Number of rubrics ({len(rubrics)}) must match number of weights ({len(weights)})")
        if abs(sum(weights) - 1.0) > 1e-6:
            raise ValueError(f"Weights must sum to 1.0, got {sum(weights)}")
        for i, rubric in enumerate(rubrics):
            setattr(self, f"rubric_{i}", rubric)
        self._rubric_list = list(rubrics)
        self._weights = list(weights)

    def forward(self, action: Any, observation: Any) -> Any:
        scores = [rubric(action, observation) for rubric in self._rubric_list]
        if any(inspect.isawaitable(s) for s in scores):
            return self._sum_async(scores)
        return self._sum(scores)

    def _sum(self, scores: list[Any]) -> float:
        # Accumulated in order from 0.0, as OpenEnv does, so both give the same float.
        total = 0.0
        for score, weight in zip(scores, self._weights):
            total += score * weight
        return total

    async def _sum_async(self, scores: list[Any]) -> float:
        pending = [(i, s) for i, s in enumerate(scores) if inspect.isawaitable(s)]
        done = await asyncio.gather(*(s for _, s in pending))
        resolved = list(scores)
        for (i, _), value in zip(pending, done):
            resolved[i] = value
        return self._sum(resolved)

    @property
    def weights(self) -> list[float]:
        """A copy of the weights."""
        return list(self._weights)


class RubricList(Rubric):
    """An ordered list of child rubrics (``rubric_0``…); no aggregation of its own."""

    def __init__(self, rubrics: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._rubrics: list[Any] = []
        for rubric in rubrics or ():
            self.append(rubric)

    def forward(self, action: Any, observation: Any) -> float:
        raise NotImplementedError(
            "RubricList.forward() is not implemented. Use RubricList within a parent rubric that defines aggregation."
        )

    def append(self, rubric: Any) -> None:
        setattr(self, f"rubric_{len(self._rubrics)}", rubric)
        self._rubrics.append(rubric)

    def extend(self, rubrics: Iterable[Any]) -> None:
        for rubric in rubrics:
            self.append(rubric)

    def __len__(self) -> int:
        return len(self._rubrics)

    def __getitem__(self, index: int) -> Any:
        return self._rubrics[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rubrics)


class RubricDict(Rubric):
    """Child rubrics by key (each key is also the child's name); no aggregation of its own."""

    def __init__(self, rubrics: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._rubric_dict: dict[str, Any] = {}
        if rubrics is not None:
            self.update(rubrics)

    def forward(self, action: Any, observation: Any) -> float:
        raise NotImplementedError(
            "RubricDict.forward() is not implemented. Use RubricDict within a parent rubric that defines aggregation."
        )

    def __setitem__(self, key: str, rubric: Any) -> None:
        setattr(self, key, rubric)
        self._rubric_dict[key] = rubric

    def __getitem__(self, key: str) -> Any:
        return self._rubric_dict[key]

    def __contains__(self, key: object) -> bool:
        return key in self._rubric_dict

    def __len__(self) -> int:
        return len(self._rubric_dict)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rubric_dict)

    def keys(self) -> Iterator[str]:
        return iter(self._rubric_dict.keys())

    def values(self) -> Iterator[Any]:
        return iter(self._rubric_dict.values())

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(self._rubric_dict.items())

    def update(self, rubrics: Mapping[str, Any]) -> None:
        for name, rubric in rubrics.items():
            self[name] = rubric
