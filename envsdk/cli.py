"""The ``envsdk`` command line.

Each subcommand is one entry of `COMMANDS`: a name and a function that adds its parser to the
subparsers and sets ``func`` (a function of the parsed args returning an exit code). Add a
subcommand by appending one ``(name, add_parser)`` pair.

``envsdk serve module:target`` serves an environment:

* ``target`` an `Environment` subclass: the action and observation types default to the
  annotations of its ``step`` method (``action`` parameter and return type);
* ``target`` a zero-argument factory: pass ``--action`` and ``--observation`` (or annotate the
  factory's return type with an `Environment` subclass, whose ``step`` is then read);
* ``target`` an ASGI app (e.g. a FastAPI app already built by `create_app`): served as is.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

from envsdk.env import Environment
from envsdk.errors import EnvSDKError

__all__ = ["main", "COMMANDS", "import_target"]


def import_target(spec: str) -> Any:
    """The object named by ``"package.module:attribute"`` or ``"path/file.py:attribute"``
    (`envsdk.registry.import_spec`); a `SystemExit` with one line when it cannot be imported."""
    from envsdk.registry import PluginLoadError, import_spec

    try:
        return import_spec(spec)
    except (ImportError, PluginLoadError) as exc:
        raise SystemExit(f"error: {exc}") from None


def _step_types(env_class: type) -> tuple[Any, Any]:
    """(action type, observation type) from ``env_class.step``'s annotations, None if absent."""
    try:
        hints = typing.get_type_hints(getattr(env_class, "step"))
    except Exception:  # unresolvable annotations: the user passes --action/--observation
        return None, None
    return hints.get("action"), hints.get("return")


def _build_app(args: argparse.Namespace) -> Any:
    from envsdk.server import create_app

    if args.no_web:
        # Through the environment, so that an app built at import time (a `module:app` target)
        # is built without the page too.
        os.environ["ENVSDK_WEB"] = "0"
    if args.token:
        # Same route as --no-web: a `module:app` target built at import time reads it too.
        os.environ["ENVSDK_TOKEN"] = args.token
    if args.allowed_hosts:
        os.environ["ENVSDK_ALLOWED_HOSTS"] = args.allowed_hosts
    target = import_target(args.target)
    if not callable(target):
        raise SystemExit(f"error: {args.target!r} is neither an app nor an environment factory")
    is_env_class = isinstance(target, type) and issubclass(target, Environment)
    if not is_env_class and not isinstance(target, type) and _is_asgi_app(target):
        built = getattr(getattr(target, "state", None), "envsdk_config", None)
        capacity = getattr(built, "max_concurrent_envs", None)
        wanted = args.max_concurrent_envs
        if wanted is not None and capacity is not None and capacity != wanted:
            # The app fixed its capacity when it was built: say so rather than serve another one.
            raise SystemExit(
                f"error: {args.target} is an app already built with max_concurrent_envs="
                f"{capacity}; --max-concurrent-envs {wanted} cannot change it: pass it to "
                "create_app(...), or serve the environment class (module:MyEnv) instead"
            )
        return target
    env_class = target if is_env_class else _returned_env_class(target)
    inferred_action, inferred_obs = _step_types(env_class) if env_class is not None else (None, None)
    action = import_target(args.action) if args.action else inferred_action
    observation = import_target(args.observation) if args.observation else inferred_obs
    if not isinstance(action, type) or not isinstance(observation, type):
        raise SystemExit(
            f"error: cannot tell the action/observation types of {args.target!r}; "
            "pass --action module:Class and --observation module:Class"
        )
    overrides: dict[str, Any] = {}
    if args.max_concurrent_envs is not None:
        overrides["max_concurrent_envs"] = args.max_concurrent_envs
    return create_app(target, action, observation, **overrides)


def _is_asgi_app(obj: Any) -> bool:
    from starlette.applications import Starlette

    return isinstance(obj, Starlette)


def _returned_env_class(factory: Callable[..., Any]) -> type | None:
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # no usable annotation
        return None
    return returned if isinstance(returned, type) and issubclass(returned, Environment) else None


def _run_serve(args: argparse.Namespace) -> int:
    from envsdk.server import serve

    if args.replicas > 1 or args.replicas_file:
        return _run_replicas(args)
    serve(_build_app(args), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _add_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve an environment over WebSocket and HTTP")
    parser.add_argument(
        "target", help="module:EnvClass, module:factory or module:app (or path/file.py:...)"
    )
    parser.add_argument("--host", default=None, help="bind address (default: $HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: $PORT or 8000)")
    parser.add_argument(
        "--max-concurrent-envs", type=int, default=None,
        help="session capacity (default: $MAX_CONCURRENT_ENVS or 64)",
    )
    parser.add_argument("--action", default=None, help="module:Class of the action type")
    parser.add_argument("--observation", default=None, help="module:Class of the observation type")
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    from envsdk.server.config import add_access_arguments

    add_access_arguments(parser)
    parser.add_argument(
        "--allowed-hosts", default=None,
        help="comma-separated Host names served ('*.example.com' wildcards, '*' any; default: "
        "$ENVSDK_ALLOWED_HOSTS, else only localhost/127.0.0.1/::1 on loopback connections)",
    )
    from envsdk.server.replicas import add_replica_arguments

    add_replica_arguments(parser, ports="N ports (consecutive from --port, else free ones)")
    parser.set_defaults(func=_run_serve)


def _run_replicas(args: argparse.Namespace) -> int:
    from envsdk.server.replicas import serve_replicas, without_options

    host = args.host or os.environ.get("HOST") or "127.0.0.1"
    port = args.port if args.port is not None else int(os.environ.get("PORT") or 0) or None
    # Every other flag (present or future) goes to the replicas unchanged.
    forwarded = without_options(args.command_line)

    def command(replica_port: int) -> list[str]:
        return [sys.executable, "-m", "envsdk.cli", *forwarded, "--host", host, "--port", str(replica_port)]

    return serve_replicas(command, args.replicas, host=host, first_port=port, replicas_file=args.replicas_file)


def _add_check_env(subparsers: Any) -> None:
    from envsdk.checker import add_check_env_parser

    add_check_env_parser(subparsers)


def _add_rollout(subparsers: Any) -> None:
    from envsdk.rollout import add_rollout_parser

    add_rollout_parser(subparsers)


def _add_report(subparsers: Any) -> None:
    from envsdk.report import add_report_parser

    add_report_parser(subparsers)


def _add_rescore(subparsers: Any) -> None:
    from envsdk.evaluate import add_rescore_parser

    add_rescore_parser(subparsers)


COMMANDS: list[tuple[str, Callable[[Any], None]]] = [
    ("serve", _add_serve),
    ("check-env", _add_check_env),
    ("rollout", _add_rollout),
    ("report", _add_report),
    ("rescore", _add_rescore),
]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: ``sys.argv[1:]``), run the chosen subcommand, return its code."""
    parser = argparse.ArgumentParser(prog="envsdk", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for _name, add_parser in COMMANDS:
        add_parser(subparsers)
    args = parser.parse_args(argv)
    args.command_line = list(argv) if argv is not None else sys.argv[1:]
    # `module:Name` targets, policies and plugins are looked up in the current folder first, as
    # `python -m` and uvicorn do; a console script alone would not see it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return int(args.func(args))
    except EnvSDKError as exc:
        # Typed errors are the user's to fix: one line, no traceback.
        print(f"envsdk {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
