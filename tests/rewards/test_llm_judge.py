"""`LLMJudge` over envsdk's OpenAI-compatible client, against `transformers serve` on the tiny
local model: the prompt it sends, the score it reads, and what an unreadable reply gives.

The tiny model is random: its greedy replies are fixed gibberish, some with digits, none with
"Score:". So a digit pattern shows parsing on real replies, and the default pattern shows the
malformed-reply path on real replies — where OpenEnv's judge silently scores 0.0.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from envsdk import Action, Environment, Observation, State
from envsdk.policies.openai_chat import OpenAIChatPolicy
from envsdk.rewards import Gate, JudgeReplyError, LLMJudge, Rubric, WeightedSum, ascore
from envsdk.server import create_app
from envsdk.testing import running_server
from tests.policies.conftest import tiny_model_dir  # noqa: F401 - fixture used by served_model
from tests.policies.test_openai_chat import served_model  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(240)

TEMPLATE = "Judge this Sudoku move.\nMove: {action}\nBoard: {observation}\nAnswer 'Score: <0..1>'."
INPUTS = [
    ("[1 2 3]", "R1 4 8 . | 9 5 7 | 2 . 1"),
    ("[5 5 9]", "R5 . . . | . . . | . . ."),
    ("[9 1 4]", "Board R1 4 8 . | 9 5 7. Score?"),
    ("left", "S F F H"),
]


def _policy(base_url: str, model: str) -> OpenAIChatPolicy:
    return OpenAIChatPolicy(base_url, model, temperature=0.0, seed=1, max_tokens=24, timeout=60)


# ---------------------------------------------------------------- no server needed


class _Canned:
    """A client that answers every prompt with one fixed reply (for the parser's edge cases)."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    async def complete(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.reply


@pytest.mark.parametrize(
    ("reply", "score"),
    [("Score: 0.8", 0.8), ("score=1", 1.0), ("Score: 0.2 ... on reflection, Score: .75", 0.75), ("SCORE : 0", 0.0)],
)
async def test_the_last_score_in_the_reply_counts(reply: str, score: float) -> None:
    judge = LLMJudge(TEMPLATE, _Canned(reply))
    assert await judge("a", "b") == score and judge.last_error is None


@pytest.mark.parametrize(
    ("reply", "kwargs"),
    [("I like it", {}), ("", {}), ("Score: 7", {"normalize": False, "score_range": (0, 1)}),
     ("Score: -0.5", {"normalize": False, "score_range": (0, 1)})],
)
async def test_an_unreadable_reply_raises_a_typed_error_or_scores_the_default(
    reply: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(JudgeReplyError) as caught:
        await LLMJudge(TEMPLATE, _Canned(reply), **kwargs)("a", "b")
    assert caught.value.reply == reply and "Move: a" in caught.value.prompt
    judge = LLMJudge(TEMPLATE, _Canned(reply), default_score=0.25, **kwargs)
    assert await judge("a", "b") == 0.25
    assert isinstance(judge.last_error, JudgeReplyError) and judge.last_score == 0.25


@pytest.mark.parametrize(("reply", "score"), [("Score: 7", 1.0), ("Score: -0.5", 0.0)])
async def test_an_out_of_range_score_is_clamped_by_default_as_in_openenv(reply: str, score: float) -> None:
    judge = LLMJudge(TEMPLATE, _Canned(reply))
    assert await judge("a", "b") == score and judge.last_error is None


def test_a_template_with_unknown_fields_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="only {action} and {observation}"):
        LLMJudge("Rate {answer}", _Canned(""))
    with pytest.raises(TypeError, match="policy"):
        LLMJudge(TEMPLATE, object())


def test_state_dict_round_trip() -> None:
    judge = LLMJudge(TEMPLATE, _Canned(""), score_pattern=r"(\d)", score_range=(0, 9), default_score=0.5)
    other = LLMJudge("{action}", _Canned(""))
    other.load_state_dict(json.loads(json.dumps(judge.state_dict())))
    assert other.state_dict() == judge.state_dict()
    assert other.score_pattern.pattern == r"(\d)" and other.score_range == (0.0, 9.0)


# ---------------------------------------------------------------- against transformers serve


async def test_judge_sends_the_rendered_prompt_and_parses_real_replies(served_model: tuple[str, str]) -> None:
    base_url, model = served_model
    async with _policy(base_url, model) as policy:
        judge = LLMJudge(TEMPLATE, policy, score_pattern=r"(\d)", score_range=(0, 9))
        parsed = 0
        for action, observation in INPUTS:
            prompt = TEMPLATE.format(action=action, observation=observation)
            # The same request sent directly: the judge asked exactly this (greedy: same reply).
            direct = (await policy.act_ex([{"role": "user", "content": prompt}])).text
            digits = re.findall(r"\d", direct)
            try:
                score = await judge(action, observation)
            except JudgeReplyError as exc:
                assert not digits and exc.reply == direct
                continue
            assert (judge.last_prompt, judge.last_reply) == (prompt, direct)
            assert score == float(digits[0]) == judge.last_score  # a pattern's first match
            parsed += 1
    assert parsed >= 1, "no reply of the tiny model held a digit; pick other INPUTS"


async def test_a_malformed_real_reply_is_a_typed_error_never_a_silent_zero(served_model: tuple[str, str]) -> None:
    base_url, model = served_model
    action, observation = INPUTS[2]
    async with _policy(base_url, model) as policy:
        with pytest.raises(JudgeReplyError, match="no score matching") as caught:
            await LLMJudge(TEMPLATE, policy)(action, observation)
        assert "score" not in caught.value.reply.lower() and caught.value.reply
        judge = LLMJudge(TEMPLATE, policy, default_score=0.5)
        assert await judge(action, observation) == 0.5
        assert judge.last_error is not None and judge.last_error.reply == caught.value.reply

    # OpenEnv's own judge, on the same server and prompt, scores the same reply 0.0 without a word.
    oe_rubrics = pytest.importorskip("openenv.core.rubrics")
    from openenv.core.llm_client import OpenAIClient

    client = OpenAIClient(f"{base_url}/v1", None, model=model, temperature=0.0, max_tokens=24)
    their = oe_rubrics.LLMJudge(TEMPLATE, client, score_pattern=r"(?i)\bscore\s*[:=]\s*(\d+\.?\d*)")
    assert await their(action, observation) == 0.0
    # And an OpenEnv LLMClient works as our judge's client too.
    with pytest.raises(JudgeReplyError):
        await LLMJudge(TEMPLATE, client)(action, observation)


class MoveAction(Action):
    message: str


class MoveObservation(Observation):
    text: str = ""


class Short(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if len(action.message) <= 8 else 0.0


class JudgedEnv(Environment[MoveAction, MoveObservation, State]):
    """An async env whose reward is a judge (with a fallback) weighted with a rule."""

    base_url = ""
    model = ""

    def __init__(self) -> None:
        self.policy = _policy(self.base_url, self.model)
        judge = LLMJudge(TEMPLATE, self.policy, default_score=0.5)
        super().__init__(rubric=WeightedSum([Gate(Short(), 1.0), judge], weights=[0.5, 0.5]))
        self._state = State()

    async def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MoveObservation:
        await self._reset_rubric_async()
        self._state = State(episode_id=episode_id or str(uuid.uuid4()))
        return MoveObservation(text="R1 4 8 . | 9 5 7. Score?")

    async def step(self, action: MoveAction) -> MoveObservation:
        self._state.step_count += 1
        obs = MoveObservation(text="R1 4 8 . | 9 5 7. Score?")
        obs.reward = await self._apply_rubric_async(action, obs)
        return obs

    @property
    def state(self) -> State:
        return self._state

    async def close(self) -> None:
        await self.policy.aclose()


async def test_a_judged_env_sends_the_judge_part_on_the_wire(served_model: tuple[str, str]) -> None:
    from envsdk.client import EnvClient

    base_url, model = served_model
    env_cls = type("Judged", (JudgedEnv,), {"base_url": base_url, "model": model})
    with running_server(create_app(env_cls, MoveAction, MoveObservation)) as url:
        async with EnvClient(url) as client:
            await client.reset()
            result = await client.step({"message": "[9 1 4]"})
    parts = result.metadata["reward_components"]
    assert parts == {"rubric_0": 1.0, "rubric_0.rubric": 1.0, "rubric_1": 0.5}  # the judge's fallback
    assert result.reward == 0.5 * 1.0 + 0.5 * 0.5
    # The same rubric scored locally agrees with the wire.
    async with _policy(base_url, model) as policy:
        local = WeightedSum([Gate(Short(), 1.0), LLMJudge(TEMPLATE, policy, default_score=0.5)], weights=[0.5, 0.5])
        scored = await ascore(local, MoveAction(message="[9 1 4]"), MoveObservation(text="R1 4 8 . | 9 5 7. Score?"))
    assert (scored.reward, scored.parts) == (result.reward, parts)


async def test_a_judge_over_a_trickling_server_gives_up_at_the_policy_deadline() -> None:
    import time

    from envsdk.policies.openai_chat import InferenceTimeoutError
    from tests.policies.test_openai_chat import _trickling_app

    reply = b'{"choices": [{"message": {"content": "Score: 1"}, "finish_reason": "stop"}]}'
    with running_server(_trickling_app(reply, delay_s=0.25, chunk=1), timeout_graceful_shutdown=2) as url:
        async with OpenAIChatPolicy(url, "judge", timeout=2) as policy:
            judge = LLMJudge(TEMPLATE, policy, default_score=0.5)
            started = time.monotonic()
            with pytest.raises(InferenceTimeoutError):
                await judge("[1 2 3]", "R1 4 8 .")  # a transport failure is not an unreadable reply
            assert time.monotonic() - started < 2 + 3
