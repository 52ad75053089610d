"""Serve HumanEval in sandboxes over OpenEnv's coding env protocol: ``python -m servers.coding --help``.

Every flag has an environment variable of the same meaning (the flag wins).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from envsdk.server.config import (
    access_options,
    add_access_arguments,
    add_log_level_argument,
    config_error,
    non_negative_int,
    port_number,
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
        "which is weaker: rlimits and process groups only).",
    )
    parser.add_argument(
        "--warm", type=non_negative_int, default=env.get("SANDBOX_WARM", "4"),
        help="env var SANDBOX_WARM (default 4, at most --max-concurrent-envs). Sandboxes started ahead of need.",
    )
    parser.add_argument(
        "--max-concurrent-envs", type=positive_int, default=env.get("MAX_CONCURRENT_ENVS", "16"),
        help="env var MAX_CONCURRENT_ENVS (default 16). Most sessions, hence sandboxes in use, at once.",
    )
    parser.add_argument("--host", default=env.get("HOST", "127.0.0.1"), help="env var HOST (default 127.0.0.1).")
    parser.add_argument("--port", type=port_number, default=env.get("PORT", "8000"), help="env var PORT (default 8000).")
    add_log_level_argument(parser, "uvicorn's log level")
    add_access_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, then serve until interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warm > args.max_concurrent_envs:
        # Each warm sandbox is a process; no more than one a session is ever taken at once.
        parser.error(
            f"--warm {args.warm} is more than --max-concurrent-envs {args.max_concurrent_envs}: a session "
            "holds one sandbox, so sandboxes started past that many are never needed at once"
        )
    options: dict[str, Any] = {"max_concurrent_envs": args.max_concurrent_envs, **access_options(args)}
    # The server options ENVSDK_* variables set, checked before any sandbox starts.
    refused = config_error(**options)
    if refused is not None:
        parser.error(refused)
    from servers.coding.app import create_coding_app

    # A SIGTERM from here on closes the warm sandboxes too (`finally`), once they have started.
    sigterm = SigtermDuringStartUp.install()
    app = create_coding_app(provider=args.sandbox, warm=args.warm, **options)
    try:
        return sigterm.serve(app, args)
    finally:
        app.state.envsdk_sandbox_pool.close()


if __name__ == "__main__":
    sys.exit(main())
