"""Verification out of the candidate's reach.

A candidate (a policy's program) runs in a sandbox; the verdict comes from a process it cannot
read, write, signal or introspect, and what crosses between them is plain data. Code envs
share this piece: `verify_function` checks a program's function against HumanEval-style tests
(``check(candidate)``).
"""

from envsdk.verify.functions import (
    VERIFY_TIMEOUT_S,
    VERIFY_WALL_TIMEOUT_S,
    FunctionTests,
    Verdict,
    VerifierError,
    verify_function,
)

__all__ = ["FunctionTests", "Verdict", "VerifierError", "verify_function", "VERIFY_TIMEOUT_S", "VERIFY_WALL_TIMEOUT_S"]
