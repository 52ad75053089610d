"""The coding env's `compiles` reward part: a syntax check that is safe from every lane thread."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from servers.coding.environment import _compiles

pytestmark = pytest.mark.timeout(120)

_PROGRAM = "\n".join(f"def f{i}(x):\n    return [y for y in range(x) if y % {i + 1} == 0]" for i in range(200))


class _Finalised:
    def __del__(self) -> None:
        pass


@pytest.fixture
def fast_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_checks_from_many_threads_at_once_never_raise(fast_switching: None) -> None:
    """Each session's step runs on its own lane thread. `ast.parse` keeps a process-wide depth
    counter while it builds its Python objects (CPython 3.11), so two threads parsing at once,
    with the collector running finalisers between them, failed with ``SystemError: AST
    constructor recursion depth mismatch``: a step error for an honest session."""
    failures: list[BaseException] = []
    answers: list[bool] = []
    stop = threading.Event()

    def check() -> None:
        for _ in range(60):
            if stop.is_set():
                return
            try:
                answers.append(_compiles(_PROGRAM))
            except BaseException as exc:  # noqa: BLE001 - any escape is the defect
                failures.append(exc)
                stop.set()
                return

    def churn() -> None:  # garbage in cycles with finalisers: the collector runs Python code often
        while not stop.is_set():
            for _ in range(1000):
                cycle: list[object] = [_Finalised()]
                cycle.append(cycle)

    threads = [threading.Thread(target=check) for _ in range(4)]
    churner = threading.Thread(target=churn)
    churner.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    stop.set()
    churner.join(timeout=10)
    assert not failures, repr(failures[0])
    assert answers and all(answers)


@pytest.mark.parametrize(
    ("code", "compiles"),
    [
        ("def f(x):\n    return x + 1\n", True),
        ("def f(x)\n    return x\n", False),  # the parser's error
        ("return 1\n", False),  # the compiler's: running it would fail the same way
        ("def f():\n    nonlocal x\n", False),
        ("(" * 300 + ")" * 300, False),  # too deeply nested to compile: an answer, not an error
        ("x = '\\0'\n", True),  # an escape in a string is fine
        ("\0", False),  # source with a null byte
    ],
)
def test_compiles_means_what_running_it_would_say(code: str, compiles: bool) -> None:
    assert _compiles(code) is compiles
