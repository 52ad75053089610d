"""Serve Harbor task folders in containers over OpenEnv's wire and MCP: ``python -m servers.harbor --help``.

Every flag has an environment variable of the same meaning (the flag wins).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from envsdk.sandbox import SandboxError
from envsdk.server.config import (
    access_options,
    add_access_arguments,
    add_log_level_argument,
    config_error,
    port_number,
    positive_float,
    positive_int,
)
from envsdk.server.launch import SigtermDuringStartUp, route_envsdk_logs

__all__ = ["build_parser", "main"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_TAMPER_CHECK_VARIABLE = "HARBOR_TAMPER_CHECK"


def _switch(raw: str) -> bool | None:
    """An environment variable's text as a switch that is on unless set off; None when it is
    neither (the caller says so as a usage error)."""
    raw = raw.strip().lower()
    if raw in ("", *_TRUE):
        return True
    return False if raw in _FALSE else None


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults come from the environment variables named in each help."""
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m servers.harbor",
        description="Harbor task server: task folders played in containers, verified after the agent "
        "(OpenEnv wire on /ws, MCP tools bash, read_file, write_file, submit).",
    )
    parser.add_argument(
        "--tasks", default=env.get("HARBOR_TASKS"), metavar="DIR",
        help="env var HARBOR_TASKS (required). A folder of Harbor task folders, or one task folder.",
    )
    parser.add_argument(
        "--engine", choices=("auto", "podman", "docker"), default=env.get("ENVSDK_CONTAINER_ENGINE", "auto"),
        help="env var ENVSDK_CONTAINER_ENGINE (default auto: podman where installed, else docker).",
    )
    parser.add_argument(
        "--allow-unbounded-disk", action="store_true",
        default=env.get("HARBOR_ALLOW_UNBOUNDED_DISK", "").strip().lower() in _TRUE,
        help="env var HARBOR_ALLOW_UNBOUNDED_DISK=1. Start containers even where the engine cannot bound "
        "what they write (a Docker daemon, podman without root); by default that is refused.",
    )
    parser.add_argument(
        "--no-tamper-check", dest="tamper_check", action="store_false",
        default=_switch(env.get(_TAMPER_CHECK_VARIABLE, "")),
        help=f"env var {_TAMPER_CHECK_VARIABLE}=0. Run a task's tests even when the agent changed what they run "
        "(system programs and libraries, Python's start-up files, programs on PATH); by default such an episode "
        "scores 0.0 untested. Only for tasks that ask the agent to install what their tests then use.",
    )
    parser.add_argument(
        "--max-concurrent-envs", type=positive_int, default=env.get("MAX_CONCURRENT_ENVS", "16"),
        help="env var MAX_CONCURRENT_ENVS (default 16). Most sessions, hence containers, at once.",
    )
    parser.add_argument(
        "--drain-timeout", type=positive_float, default=env.get("HARBOR_DRAIN_TIMEOUT_S", "20"), metavar="SECONDS",
        help="env var HARBOR_DRAIN_TIMEOUT_S (default 20). On SIGTERM, how long tool calls and verifiers still "
        "running may take to finish; then every container is removed with what runs in it, and the server exits "
        "within a few seconds.",
    )
    parser.add_argument(
        "--max-steps", type=positive_int, default=env.get("HARBOR_MAX_STEPS", "100"),
        help="env var HARBOR_MAX_STEPS (default 100, at most 10000). Tool calls of an episode unless its reset "
        "says otherwise.",
    )
    parser.add_argument(
        "--command-timeout", type=positive_float, default=env.get("HARBOR_COMMAND_TIMEOUT_S", "180"), metavar="SECONDS",
        help="env var HARBOR_COMMAND_TIMEOUT_S (default 180). One bash command at most (never past the agent's time left).",
    )
    parser.add_argument(
        "--max-agent-timeout", type=positive_float, default=env.get("HARBOR_MAX_AGENT_TIMEOUT_S", "3600"),
        metavar="SECONDS",
        help="env var HARBOR_MAX_AGENT_TIMEOUT_S (default 3600). Cap on a task's [agent] timeout_sec, and the "
        "agent's time on a task that sets none.",
    )
    parser.add_argument(
        "--max-verifier-timeout", type=positive_float, default=env.get("HARBOR_MAX_VERIFIER_TIMEOUT_S", "600"),
        metavar="SECONDS", help="env var HARBOR_MAX_VERIFIER_TIMEOUT_S (default 600). Cap on [verifier] timeout_sec.",
    )
    parser.add_argument(
        "--max-build-timeout", type=positive_float, default=env.get("HARBOR_MAX_BUILD_TIMEOUT_S", "1800"),
        metavar="SECONDS",
        help="env var HARBOR_MAX_BUILD_TIMEOUT_S (default 1800). Cap on [environment] build_timeout_sec.",
    )
    parser.add_argument(
        "--max-cpus", type=positive_float, default=env.get("HARBOR_MAX_CPUS", "4"),
        help="env var HARBOR_MAX_CPUS (default 4). Cap on [environment] cpus.",
    )
    parser.add_argument(
        "--max-memory-mb", type=positive_int, default=env.get("HARBOR_MAX_MEMORY_MB", "4096"),
        help="env var HARBOR_MAX_MEMORY_MB (default 4096). Cap on [environment] memory_mb.",
    )
    parser.add_argument(
        "--max-storage-mb", type=positive_int, default=env.get("HARBOR_MAX_STORAGE_MB", "4096"),
        help="env var HARBOR_MAX_STORAGE_MB (default 4096). Cap on [environment] storage_mb.",
    )
    parser.add_argument(
        "--pids", type=positive_int, default=env.get("HARBOR_PIDS", "1024"),
        help="env var HARBOR_PIDS (default 1024). Processes and threads of one container.",
    )
    parser.add_argument(
        "--output-bytes", type=positive_int, default=env.get("HARBOR_OUTPUT_BYTES", "16384"),
        help="env var HARBOR_OUTPUT_BYTES (default 16384). Of a tool's output, the agent sees this many bytes at "
        "most (a command's start and end).",
    )
    parser.add_argument("--host", default=env.get("HOST", "127.0.0.1"), help="env var HOST (default 127.0.0.1).")
    parser.add_argument("--port", type=port_number, default=env.get("PORT", "8000"), help="env var PORT (default 8000).")
    add_log_level_argument(parser, "uvicorn's log level (debug: also each verifier's output)")
    add_access_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, build every task's image, then serve until interrupted. Exit
    status 2, with one line on stderr, on a usage error, a tasks folder with no task to serve,
    no container engine, or no ``mcp`` extra."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.tasks:
        parser.error("--tasks DIR (or HARBOR_TASKS) is required: a folder of Harbor task folders, or one")
    from servers.harbor.environment import MAX_STEPS_LIMIT, HarborLimits
    from servers.harbor.tasks import TaskFolderError, scan_tasks

    try:
        scan_tasks(args.tasks)  # a wrong folder is said before any engine is asked
    except TaskFolderError as exc:
        parser.error(str(exc))
    if args.tamper_check is None:
        said = os.environ.get(_TAMPER_CHECK_VARIABLE, "")
        parser.error(f"{_TAMPER_CHECK_VARIABLE} must be 1 or 0 (true/false, yes/no, on/off), got {said!r}")
    if args.max_steps > MAX_STEPS_LIMIT:
        parser.error(f"--max-steps {args.max_steps} is more than {MAX_STEPS_LIMIT}")
    limits = HarborLimits(
        command_timeout_s=args.command_timeout, max_agent_timeout_s=args.max_agent_timeout,
        max_verifier_timeout_s=args.max_verifier_timeout, max_build_timeout_s=args.max_build_timeout,
        max_cpus=args.max_cpus, max_memory_mb=args.max_memory_mb, max_storage_mb=args.max_storage_mb,
        pids=args.pids, output_bytes=args.output_bytes, max_steps=args.max_steps,
    )
    options: dict[str, Any] = {
        "max_concurrent_envs": args.max_concurrent_envs, "drain_timeout_s": args.drain_timeout, **access_options(args),
    }
    # The server options ENVSDK_* variables set, checked before any image is built.
    refused = config_error(**options)
    if refused is not None:
        parser.error(refused)
    from servers.harbor.app import HarborSetupError, create_harbor_app

    # The start-up's lines (each image built, each broken task) in the server's log format.
    route_envsdk_logs(args.log_level)
    sigterm = SigtermDuringStartUp.install()
    try:
        app = create_harbor_app(
            args.tasks, engine=args.engine, limits=limits, allow_unbounded_disk=args.allow_unbounded_disk,
            tamper_check=args.tamper_check, **options,
        )
    except (TaskFolderError, SandboxError, HarborSetupError) as exc:
        # Said in one line, as a usage error: the fix is a folder or an install, not a bug to trace.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return sigterm.serve(app, args)


if __name__ == "__main__":
    sys.exit(main())
