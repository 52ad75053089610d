"""`CodingScheduler`: a model writes Python, the coding server runs it and scores it with tests.

What the model reads: at reset, the problem (the function's signature and docstring) and how
to answer (a fenced Python block); after each step, what its code did (exit status, what it
printed), then the test verdict with its feedback (`render_code_observation`). What is sent:
the last fenced code block of the reply (```` ```python ```` or a bare fence), else the whole
reply, as ``{"code": ...}``: OpenEnv's ``CodeAction``. Success: the problem's tests passed. The
reply is what follows any reasoning block (``<think>…</think>``): a draft the model writes while
it thinks is never run. A reply cut by the length limit is, under the default
``cut_replies="penalty"``, not run and scores 0.0 (`CodingScheduler.format_penalty`: what code
that fails its tests gets); under ``"env"`` its code runs and is judged like any other.

An episode is one attempt (`DEFAULT_MAX_TURNS`), as lm-eval and evalplus count HumanEval's
pass@1; with ``max_turns`` N > 1 the model reads the test feedback and tries again, up to N
times, and a success means "solved within N turns" (`sample_text` says which).
"""

from __future__ import annotations

import re
from typing import Any

from envsdk.reasoning import split_reasoning
from envsdk.schedulers.base import Trajectory
from envsdk.schedulers.openenv import OpenEnvScheduler

__all__ = [
    "CODE_INSTRUCTIONS", "DEFAULT_MAX_TURNS", "CodingScheduler", "extract_code", "render_code_observation", "sample_text",
]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)

CODE_INSTRUCTIONS = (
    "Complete the Python function below. Reply with the whole function (and its imports) in one "
    "```python code block. Your code runs in a persistent interpreter; the problem's tests run "
    "once the function is defined."
)
#: Most characters of a stream shown back to the model.
SHOWN_CHARS = 2000
#: Turns of an episode unless ``max_turns`` says otherwise: a single attempt with no feedback.
DEFAULT_MAX_TURNS = 1


def sample_text(max_turns: int) -> str:
    """What one episode of at most `max_turns` turns is, as a pass@k sample: one attempt with
    no test feedback, or an answer improved on the tests' feedback up to `max_turns` times."""
    if max_turns == 1:
        return "1 attempt per sample, no test feedback"
    return f"solved within {max_turns} turns with test feedback"


def extract_code(text: str) -> str:
    """The code of a reply: its last fenced block tagged python (or untagged), else its last
    fenced block of any tag, else the whole text; all read after any reasoning block
    (`envsdk.reasoning.split_reasoning`), so a completion's drafts in its thinking are not it."""
    text = split_reasoning(text)[1]
    blocks: list[tuple[str, str]] = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    for tag, body in reversed(blocks):
        if tag in ("", "python", "py", "python3"):
            return body
    return blocks[-1][1] if blocks else text


def _tail(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else "…" + text[-SHOWN_CHARS:]


def render_code_observation(obs: dict[str, Any], previous: dict[str, Any] | None = None) -> str:
    """The user message for a coding observation: at reset (`previous` None) the instructions
    and the problem; after a step, what the code run did (`_run_line`, then its stdout and
    stderr tails and the sandbox's note), then the test verdict and its feedback (`_tests_text`)."""
    meta = obs.get("metadata") or {}
    if previous is None:
        return f"{CODE_INSTRUCTIONS}\n\n```python\n{meta.get('prompt', '')}```"
    lines = [_run_line(obs.get("exit_code", 0), bool(meta.get("timed_out")))]
    for stream in ("stdout", "stderr"):
        text = str(obs.get(stream) or "").rstrip("\n")
        if text:
            lines.append(f"{stream}:\n{_tail(text)}")
    if meta.get("note"):
        lines.append(f"note: {meta['note']}")
    lines.append(_tests_text(meta.get("tests"), str(meta.get("entry_point", "the function"))))
    return "\n".join(lines)


def _run_line(exit_code: Any, timed_out: bool) -> str:
    """What running the code did, said so that a clean run is not read as passing the tests
    (exit status 0 reads as success, and the tests are a separate run)."""
    if timed_out:
        return "your code was stopped: it ran past its time limit"
    if exit_code == 0:
        return "your code ran without an error (exit status 0)"
    if exit_code == 1:  # the sandbox's interpreter exits 1 on an uncaught exception
        return "your code raised an exception (exit status 1)"
    if isinstance(exit_code, int) and exit_code < 0:
        return f"your code was killed (signal {-exit_code})"
    return f"your code exited with status {exit_code}"


def _tests_text(tests: Any, entry_point: str) -> str:
    """The test verdict and its feedback: ``tests: <verdict>``, then the output when there is
    any (none when the server hides the tests). Reads the server's ``tests`` of either shape:
    ``passed``/``verdict``/``output``, or the older ``passed``/``returncode``/``output``."""
    if not isinstance(tests, dict):
        return f"tests: not run yet ({entry_point} is not defined)"
    verdict = tests.get("verdict")
    if not isinstance(verdict, str):
        verdict = "passed" if tests.get("passed") else "timed out" if tests.get("timed_out") else "failed"
    output = str(tests.get("output") or "").rstrip()
    if verdict == "passed" or not output:
        return f"tests: {verdict}"
    return f"tests: {verdict}\n{_tail(output)}"


class CodingScheduler(OpenEnvScheduler):
    """Episodes of the coding server (`servers.coding`): see the module docstring."""

    #: A reply the scheduler cannot use scores as code that fails its tests (a cut reply under
    #: ``cut_replies="penalty"``): never above a wrong answer, never below it.
    format_penalty: float = 0.0

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", DEFAULT_MAX_TURNS)
        kwargs.setdefault("formatter", render_code_observation)
        super().__init__(**kwargs)

    def parse_action(self, text: str) -> dict[str, Any]:
        return {"code": extract_code(text)}

    def is_success(self, trajectory: Trajectory) -> bool | None:
        if not trajectory.steps:
            return False
        tests = (trajectory.steps[-1].observation.get("metadata") or {}).get("tests")
        return bool(isinstance(tests, dict) and tests.get("passed"))
