# mypy: ignore-errors
# ruff: noqa: F821  (names from _plaindata.py, whose text comes first)
# (Not imported by envsdk: `envsdk.verify.functions` sends this text, after _plaindata.py's and
# before _zygote.py's, as the -c source of an interpreter on the host, outside every sandbox,
# which forks a fresh verifier for each verification. Standard library only.)
"""The verifier's side: runs the tests, calling the candidate only through the channel.

Channel (stdin/stdout, one line each way): first the job ``{"setup", "tests", "entry_point",
"check"}``; then this side writes ``C<json>`` for each call into the candidate and reads the
candidate's answer, and finally ``V<json>``, the verdict:
``{"passed": true}`` or ``{"passed": false, "kind", "message", "test_line"}``.

The tests and the verdict exist only in this process, which the candidate cannot read, write
or signal; what it gets back from a call is decoded as plain data of exact builtin types, so
an answer can be right or wrong but never more than a value.
"""

import ctypes as _ctypes
import json as _json
import traceback as _traceback

PR_SET_DUMPABLE = 4


class CandidateRaised(Exception):
    """The candidate's function raised (its own traceback is the message): an exception, as the
    call would have raised in the candidate's own process."""


class CandidateFailed(BaseException):
    """The call has no answer: the candidate answered with something that is not plain data
    (the host ends a verification whose candidate is gone). Not an `Exception`, so a test's ``except Exception`` cannot swallow it."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _answer(line):
    try:
        reply = _json.loads(line)
    except (ValueError, RecursionError):
        raise CandidateFailed("not plain data", "the program's answer to a call was not JSON") from None
    if type(reply) is not dict or len(reply) != 1:
        raise CandidateFailed("not plain data", "the program's answer to a call was no answer")
    (key, body), = reply.items()
    if key == "value":
        try:
            return decode_plain(body)
        except PlainDataError as exc:
            raise CandidateFailed("not plain data", f"the program's answer was not plain data: {exc}") from None
    text = body if type(body) is str else "(no detail)"
    if key == "raised":
        raise CandidateRaised(text)
    if key == "not_plain":
        raise CandidateFailed("not plain data", text)
    raise CandidateFailed("not plain data", "the program's answer to a call was no answer")


def _test_line(exc, tests):
    frames = [f for f in _traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    if not frames or not frames[-1].lineno:
        return ""
    lines = tests.splitlines()
    return lines[frames[-1].lineno - 1].strip() if frames[-1].lineno <= len(lines) else ""


def main():
    # Not dumpable: a process of the same user cannot ptrace this one or open its /proc files.
    _ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    inbox, out = open_channel()
    job = _json.loads(inbox.readline())

    def candidate(*args, **kwargs):
        try:
            request = _json.dumps({"args": encode_plain(list(args)), "kwargs": encode_plain(dict(kwargs))},
                                  separators=(",", ":"))
        except (ValueError, RecursionError) as exc:
            raise CandidateFailed("verifier error", f"the tests passed an argument that is not plain data: {exc}")
        out.write(b"C" + request.encode("ascii") + b"\n")
        out.flush()
        return _answer(inbox.readline())

    try:
        scope = {}
        exec(compile(job["setup"], "<setup>", "exec", dont_inherit=True), scope)
        scope[job["entry_point"]] = candidate
        exec(compile(job["tests"], "<tests>", "exec", dont_inherit=True), scope)
        check = scope[job["check"]]
    except BaseException as exc:
        verdict = {"passed": False, "kind": "verifier error", "message": "".join(
            _traceback.format_exception_only(type(exc), exc)).strip(), "test_line": ""}
    else:
        try:
            check(candidate)
            verdict = {"passed": True}
        except CandidateRaised as exc:
            verdict = {"passed": False, "kind": "raised", "message": str(exc), "test_line": _test_line(exc, job["tests"])}
        except CandidateFailed as exc:
            verdict = {"passed": False, "kind": exc.kind, "message": str(exc), "test_line": _test_line(exc, job["tests"])}
        except BaseException as exc:
            kind = "assertion" if isinstance(exc, AssertionError) else "test error"
            message = "".join(_traceback.format_exception_only(type(exc), exc)).strip()
            verdict = {"passed": False, "kind": kind, "message": message[-2000:],
                       "test_line": _test_line(exc, job["tests"])}
    out.write(b"V" + _json.dumps(verdict).encode("ascii") + b"\n")
    out.flush()
