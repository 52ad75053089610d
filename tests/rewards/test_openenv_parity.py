"""The same rubric, written as OpenEnv 0.10 writes it, run through OpenEnv's classes and through
envsdk's: the same constructor arguments are accepted and give the same scores, hook calls and
``last_score`` values."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envsdk import rewards as ours

theirs = pytest.importorskip("openenv.core.rubrics")

pytestmark = pytest.mark.timeout(30)

TEMPLATE = "Rate this move.\nMove: {action}\nBoard: {observation}\nScore (0-1):"


class _Canned:
    """An OpenEnv-style LLM client (``async complete(prompt) -> str``) with a fixed reply."""

    def __init__(self, reply: str) -> None:
        self.reply = reply

    async def complete(self, prompt: str) -> str:
        await asyncio.sleep(0)
        return self.reply


REPLIES = [
    "0.8",
    "Score: 0.7",
    "I would say 1.5 out of 1",
    "first 0.2 then 0.9",
    "no number at all",
    "Score: 7",
]
JUDGE_KWARGS: list[dict[str, Any]] = [
    {"default_score": 0.0},
    {"default_score": 0.25, "normalize": False},
    {"default_score": 0.5, "normalize": True, "score_pattern": r"(\d+\.?\d*)"},
    {"default_score": 0.1, "score_pattern": r"(?i)score:\s*(\d+\.?\d*)"},
    {"default_score": 0.0, "score_pattern": r"\d+\.\d+", "normalize": False},
]


@pytest.mark.parametrize("kwargs", JUDGE_KWARGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("reply", REPLIES)
async def test_llm_judge_with_openenv_arguments_scores_like_openenv(reply: str, kwargs: dict[str, Any]) -> None:
    if "score_pattern" not in kwargs:
        kwargs = {**kwargs, "score_pattern": r"(\d+\.?\d*)"}  # OpenEnv's default, spelled out
    their_judge = theirs.LLMJudge(TEMPLATE, _Canned(reply), **kwargs)
    our_judge = ours.LLMJudge(TEMPLATE, _Canned(reply), **kwargs)
    expected = await their_judge("[1 2 3]", "R1 4 8 .")
    assert await our_judge("[1 2 3]", "R1 4 8 .") == expected
    assert our_judge.last_score == their_judge.last_score == expected


def test_llm_judge_state_dicts_load_both_ways() -> None:
    their_judge = theirs.LLMJudge(TEMPLATE, _Canned(""), score_pattern=r"(\d)", default_score=0.3, normalize=False)
    our_judge = ours.LLMJudge("{action}", _Canned(""))
    our_judge.load_state_dict(their_judge.state_dict())
    assert (our_judge.prompt_template, our_judge.default_score, our_judge.normalize) == (TEMPLATE, 0.3, False)
    back = theirs.LLMJudge("{action}", _Canned(""))
    back.load_state_dict(our_judge.state_dict())
    assert back.state_dict() == their_judge.state_dict()


def _tree(package: Any, log: list[str], container: str) -> Any:
    """`container` over one sync and one async child, with a sync and an async pre-hook and an
    async forward hook on the container, every call logged."""

    class Sync(package.Rubric):  # type: ignore[misc, name-defined]
        def forward(self, action: Any, observation: Any) -> float:
            log.append("sync child")
            return 0.75

    class Async(package.Rubric):  # type: ignore[misc, name-defined]
        async def forward(self, action: Any, observation: Any) -> float:
            log.append("async child")
            await asyncio.sleep(0)
            return 0.5

    def sync_pre(rubric: Any, action: Any, observation: Any) -> None:
        log.append("sync pre-hook")

    async def async_pre(rubric: Any, action: Any, observation: Any) -> None:
        await asyncio.sleep(0)
        log.append("async pre-hook")

    async def async_post(rubric: Any, action: Any, observation: Any, score: float) -> None:
        log.append(f"async hook {score}")

    if container == "Sequential":
        rubric = package.Sequential(Sync(), Async())
    elif container == "Gate":
        rubric = package.Gate(Async(), threshold=0.4)
    else:
        rubric = package.WeightedSum([Sync(), Async()], weights=[0.5, 0.5])
    rubric.register_forward_pre_hook(sync_pre)
    rubric.register_forward_pre_hook(async_pre)
    rubric.register_forward_hook(async_post)
    return rubric


@pytest.mark.parametrize("container", ["Sequential", "Gate", "WeightedSum"])
async def test_an_async_pre_hook_on_a_container_with_an_async_child_runs_as_in_openenv(container: str) -> None:
    their_log: list[str] = []
    our_log: list[str] = []
    their_rubric = _tree(theirs, their_log, container)
    our_rubric = _tree(ours, our_log, container)
    expected = await their_rubric("a", "o")
    assert await our_rubric("a", "o") == expected
    assert our_rubric.last_score == their_rubric.last_score == expected
    assert "async pre-hook" in their_log and our_log == their_log
