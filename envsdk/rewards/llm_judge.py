"""`LLMJudge`: a rubric that asks a language model for the score.

The judge renders `prompt_template` with ``{action}`` and ``{observation}``, sends it as one
user message (after `system_message`, if any) to `client` and reads the score from the reply.
The client is envsdk's `OpenAIChatPolicy` (any OpenAI-compatible server: ``vllm serve``,
``transformers serve``, a hosted API), any envsdk policy, or an OpenEnv ``LLMClient`` (anything
with ``async complete(prompt) -> str``).

The arguments are OpenEnv 0.10's, with its meaning: the score is group 1 of `score_pattern`'s
first match (the whole match when the pattern has no group), clamped to [0, 1] when `normalize`
is true, and `default_score` is the score of a reply it cannot read. Two defaults differ, so
that an unreadable reply is never a silent score:

* ``default_score=None`` (OpenEnv: 0.0) — an unreadable reply raises `JudgeReplyError`,
  carrying the prompt and the reply. With a number, that number is the score, the error is kept
  in ``last_error`` (None after a readable reply) and logged as a warning.
* ``score_pattern=None`` — `DEFAULT_SCORE_PATTERN`, the last ``Score: <number>`` of the reply
  (OpenEnv's reads the first number anywhere, such as the 2 of "2+2=4"). Pass
  ``score_pattern=r"(\\d+\\.?\\d*)"`` for OpenEnv's.

`score_range` (envsdk only) is the range `normalize` clamps to; with ``normalize=False`` a score
outside a given `score_range` is unreadable.
"""

from __future__ import annotations

import logging
import re
import string
from typing import Any

from envsdk.rewards.base import Rubric

__all__ = ["LLMJudge", "JudgeReplyError", "DEFAULT_SCORE_PATTERN"]

logger = logging.getLogger(__name__)

#: ``Score: 0.8`` / ``score = 1`` (case-insensitive). The greedy ``\A.*`` makes the first match
#: (the rule every pattern follows) the last score given in the reply, in linear time.
DEFAULT_SCORE_PATTERN = r"(?is)\A.*\bscore\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+))"

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
    else is a `ValueError` here, not a `KeyError` at the first step). ``last_prompt``,
    ``last_reply`` and ``last_error`` describe the latest call.
    """

    def __init__(
        self,
        prompt_template: str,
        client: Any,
        *,
        score_pattern: str | None = None,
        default_score: float | None = None,
        normalize: bool = True,
        score_range: tuple[float, float] | None = None,
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
        if score_range is not None and score_range[0] > score_range[1]:
            raise ValueError(f"score_range must be (low, high) with low <= high, got {score_range}")
        self.prompt_template = prompt_template
        self.client = client
        self.score_pattern = re.compile(score_pattern if score_pattern is not None else DEFAULT_SCORE_PATTERN)
        self.default_score = default_score
        self.normalize = normalize
        self.score_range = None if score_range is None else (float(score_range[0]), float(score_range[1]))
        self.system_message = system_message
        self.last_prompt: str | None = None
        self.last_reply: str | None = None
        self.last_error: JudgeReplyError | None = None

    def render_prompt(self, action: Any, observation: Any) -> str:
        """The user message sent to the judge for this step."""
        return self.prompt_template.format(action=action, observation=observation)

    def _render_prompt(self, action: Any, observation: Any) -> str:
        # OpenEnv's name for the same step: a subclass written for OpenEnv overrides this one.
        return self.render_prompt(action, observation)

    def parse_score(self, reply: str, prompt: str = "") -> float:
        """The score in `reply` (see the module doc); `JudgeReplyError` when there is none."""
        match = self.score_pattern.search(reply)
        if match is None:
            raise JudgeReplyError(f"no score matching {self.score_pattern.pattern!r}", prompt=prompt, reply=reply)
        text = match.group(1) if match.lastindex else match.group(0)
        try:
            score = float(text)
        except ValueError:
            raise JudgeReplyError(f"the score {text!r} is not a number", prompt=prompt, reply=reply) from None
        low, high = self.score_range or (0.0, 1.0)
        if self.normalize:
            return max(low, min(high, score))
        if self.score_range is not None and not low <= score <= high:
            raise JudgeReplyError(f"the score {score} is outside [{low}, {high}]", prompt=prompt, reply=reply)
        return score

    async def forward(self, action: Any, observation: Any) -> float:
        prompt = self._render_prompt(action, observation)
        self.last_prompt, self.last_reply, self.last_error = prompt, None, None
        reply = await self._ask(prompt)
        self.last_reply = reply
        try:
            return self.parse_score(reply, prompt)
        except JudgeReplyError as exc:
            self.last_error = exc
            if self.default_score is None:
                raise
            logger.warning("LLMJudge scored %s for an unreadable reply: %s", self.default_score, exc)
            return float(self.default_score)

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
        """OpenEnv's keys (``prompt_template``, ``score_pattern``, ``default_score``,
        ``normalize``) and envsdk's (``score_range``, ``system_message``)."""
        return {
            "prompt_template": self.prompt_template,
            "score_pattern": self.score_pattern.pattern,
            "default_score": self.default_score,
            "normalize": self.normalize,
            "score_range": None if self.score_range is None else list(self.score_range),
            "system_message": self.system_message,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (envsdk's or OpenEnv's); absent keys are kept."""
        if "prompt_template" in state:
            self.prompt_template = state["prompt_template"]
        if "score_pattern" in state:
            self.score_pattern = re.compile(state["score_pattern"])
        if "default_score" in state:
            self.default_score = state["default_score"]
        if "normalize" in state:
            self.normalize = bool(state["normalize"])
        if "score_range" in state:
            bounds = state["score_range"]
            self.score_range = None if bounds is None else (float(bounds[0]), float(bounds[1]))
        if "system_message" in state:
            self.system_message = state["system_message"]
