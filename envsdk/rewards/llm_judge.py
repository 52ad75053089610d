"""`LLMJudge`: a rubric that asks a language model for the score.

The judge renders `prompt_template` with ``{action}`` and ``{observation}``, sends it as one
user message (after `system_message`, if any) to `client` and reads the score from the reply
with `score_pattern` (by default the last ``Score: <number>``). The client is envsdk's
`OpenAIChatPolicy` (any OpenAI-compatible server: ``vllm serve``, ``transformers serve``, a
hosted API), any envsdk policy, or an OpenEnv ``LLMClient`` (anything with
``async complete(prompt) -> str``).

Unlike OpenEnv's judge, which scores an unreadable reply 0.0 without a word, a reply with no
score, or with a score outside `score_range`, raises `JudgeReplyError` (carrying the prompt and
the reply). Pass ``fallback_score=x`` to score such replies x instead: the error is then kept
in ``last_error`` (None after a readable reply) and logged as a warning.
"""

from __future__ import annotations

import logging
import re
import string
from typing import Any

from envsdk.rewards.base import Rubric

__all__ = ["LLMJudge", "JudgeReplyError", "DEFAULT_SCORE_PATTERN"]

logger = logging.getLogger(__name__)

#: ``Score: 0.8`` / ``score = 1`` (case-insensitive); the last one in the reply counts.
DEFAULT_SCORE_PATTERN = r"(?i)\bscore\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+))"

# Enough of a long reply to see what went wrong, without holding a whole essay in an error.
_EXCERPT = 500


class JudgeReplyError(ValueError):
    """The judge's reply holds no readable score, or one outside the allowed range."""

    def __init__(self, message: str, *, prompt: str, reply: str) -> None:
        super().__init__(f"{message}; reply: {reply[:_EXCERPT]!r}")
        self.prompt = prompt
        self.reply = reply


class LLMJudge(Rubric):
    """Scores ``(action, observation)`` by asking a language model (see the module doc).

    `prompt_template` may use only the fields ``{action}`` and ``{observation}`` (anything
    else is a `ValueError` here, not a `KeyError` at the first step). The score is the first
    group of `score_pattern`'s last match; it must lie in `score_range` (inclusive).
    ``last_prompt``, ``last_reply`` and ``last_error`` describe the latest call.
    """

    def __init__(
        self,
        prompt_template: str,
        client: Any,
        *,
        score_pattern: str = DEFAULT_SCORE_PATTERN,
        score_range: tuple[float, float] = (0.0, 1.0),
        fallback_score: float | None = None,
        system_message: str | None = None,
    ) -> None:
        super().__init__()
        fields = {name for _, name, _, _ in string.Formatter().parse(prompt_template) if name is not None}
        unknown = fields - {"action", "observation"}
        if unknown:
            raise ValueError(
                f"prompt_template may use only {{action}} and {{observation}}; it also uses {sorted(unknown)}"
                " (write literal braces as {{ and }})"
            )
        if not (hasattr(client, "complete") or hasattr(client, "act")):
            raise TypeError(
                f"client must be an envsdk policy (act) or an OpenEnv LLMClient (complete), got {type(client).__name__}"
            )
        low, high = score_range
        if low > high:
            raise ValueError(f"score_range must be (low, high) with low <= high, got {score_range}")
        self.prompt_template = prompt_template
        self.client = client
        self.score_pattern = re.compile(score_pattern)
        if self.score_pattern.groups < 1:
            raise ValueError(f"score_pattern needs a group around the number: {score_pattern!r}")
        self.score_range = (float(low), float(high))
        self.fallback_score = fallback_score
        self.system_message = system_message
        self.last_prompt: str | None = None
        self.last_reply: str | None = None
        self.last_error: JudgeReplyError | None = None

    def render_prompt(self, action: Any, observation: Any) -> str:
        """The user message sent to the judge for this step."""
        return self.prompt_template.format(action=action, observation=observation)

    def parse_score(self, reply: str, prompt: str = "") -> float:
        """The score in `reply`; `JudgeReplyError` when there is none or it is out of range."""
        matches = list(self.score_pattern.finditer(reply))
        if not matches:
            raise JudgeReplyError(f"no score matching {self.score_pattern.pattern!r}", prompt=prompt, reply=reply)
        text = matches[-1].group(1)
        try:
            score = float(text)
        except ValueError:
            raise JudgeReplyError(f"the score {text!r} is not a number", prompt=prompt, reply=reply) from None
        low, high = self.score_range
        if not low <= score <= high:
            raise JudgeReplyError(f"the score {score} is outside [{low}, {high}]", prompt=prompt, reply=reply)
        return score

    async def forward(self, action: Any, observation: Any) -> float:
        prompt = self.render_prompt(action, observation)
        self.last_prompt, self.last_reply, self.last_error = prompt, None, None
        reply = await self._ask(prompt)
        self.last_reply = reply
        try:
            return self.parse_score(reply, prompt)
        except JudgeReplyError as exc:
            self.last_error = exc
            if self.fallback_score is None:
                raise
            logger.warning("LLMJudge scored %s for an unreadable reply: %s", self.fallback_score, exc)
            return float(self.fallback_score)

    async def _ask(self, prompt: str) -> str:
        complete = getattr(self.client, "complete", None)
        if callable(complete):
            return str(await complete(prompt))
        messages = [{"role": "system", "content": self.system_message}] if self.system_message else []
        messages.append({"role": "user", "content": prompt})
        act_ex = getattr(self.client, "act_ex", None)
        output = await act_ex(messages) if callable(act_ex) else await self.client.act(messages)
        return str(getattr(output, "text", output))

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompt_template": self.prompt_template,
            "score_pattern": self.score_pattern.pattern,
            "score_range": list(self.score_range),
            "fallback_score": self.fallback_score,
            "system_message": self.system_message,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "prompt_template" in state:
            self.prompt_template = state["prompt_template"]
        if "score_pattern" in state:
            self.score_pattern = re.compile(state["score_pattern"])
        if "score_range" in state:
            low, high = state["score_range"]
            self.score_range = (float(low), float(high))
        if "fallback_score" in state:
            self.fallback_score = state["fallback_score"]
        if "system_message" in state:
            self.system_message = state["system_message"]
