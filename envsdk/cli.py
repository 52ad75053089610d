"""The ``envsdk`` command line.

Each subcommand is one entry of `COMMANDS`: a name and a function that adds its parser to the
subparsers and sets ``func`` (a function of the parsed args returning an exit code). Add a
subcommand by appending one ``(name, add_parser)`` pair.

``envsdk serve module:target`` serves an environment:

* ``target`` an `Environment` subclass (envsdk's or OpenEnv's): the action and observation types
  default to the annotations of its ``step`` method (``action`` parameter and return type);
* ``target`` a zero-argument factory: pass ``--action`` and ``--observation`` (or annotate the
  factory's return type with an `Environment` subclass, whose ``step`` is then read);
* ``target`` an ms-swift-style `Env` subclass: served through `envsdk.adapters.env_app` (the
  action is the conversation, the observation the env's text; a step after done is refused);
* ``target`` an ASGI app (e.g. a FastAPI app already built by `create_app`): served as is.

Every subcommand exits 2 on a usage error and 1 on a failure, with one line
``envsdk <command>: error: ...`` on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from envsdk._process import Terminated, flush_out, let_stdout_go
from envsdk.env import Env, Environment, is_openenv_environment, step_types
from envsdk.errors import EnvSDKError

__all__ = ["main", "COMMANDS", "import_target", "CommandError", "EXTRAS"]

#: The optional dependencies' top-level modules and the extra of envsdk that installs each.
EXTRAS = {
    "fastmcp": "mcp", "matplotlib": "report", "httpx": "openai", "ray": "ray", "vllm": "vllm",
    "torch": "train", "transformers": "train", "tokenizers": "train", "accelerate": "train",
    "trl": "train", "datasets": "train",
}


class CommandError(Exception):
    """What a subcommand cannot do, in one line; `code` is its exit status (2: usage, 1: failure)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def missing_extra(exc: ImportError) -> str | None:
    """One line naming the install command when `exc` is an optional dependency that is not
    installed, else None. envsdk is installed from its clone, so the command is pip's editable
    form there (the package is not on the registry under that name)."""
    name = (exc.name or "").split(".")[0]
    if name not in EXTRAS:
        return None
    extra = EXTRAS[name]
    return (
        f"{name} is not installed (envsdk's [{extra}] extra): run pip install -e '.[{extra}]' in the envsdk "
        f"clone, or pip install {name}"
    )


def import_target(spec: str) -> Any:
    """The object named by ``"package.module:attribute"`` or ``"path/file.py:attribute"``
    (`envsdk.registry.import_spec`); a `CommandError` with one line when it cannot be imported."""
    from envsdk.registry import PluginLoadError, import_spec

    try:
        return import_spec(spec)
    except (ImportError, PluginLoadError) as exc:
        cause = exc if isinstance(exc, ImportError) else exc.__cause__
        hint = missing_extra(cause) if isinstance(cause, ImportError) else None
        raise CommandError(f"cannot import {spec}: {hint}" if hint else str(exc), 1 if hint else 2) from None


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
        raise CommandError(f"{args.target!r} is neither an app nor an environment factory")
    overrides: dict[str, Any] = {}
    if args.max_concurrent_envs is not None:
        overrides["max_concurrent_envs"] = args.max_concurrent_envs
    if isinstance(target, type) and issubclass(target, Env):
        # An ms-swift-style Env has no action/observation types of its own: the adapter's
        # conversation-in, text-out pair serves it (and refuses a step after done).
        from envsdk.adapters import env_app

        return env_app(target, **overrides)
    # OpenEnv's Environment classes too: their step is annotated the same way.
    is_env_class = isinstance(target, type) and (issubclass(target, Environment) or is_openenv_environment(target))
    if not is_env_class and not isinstance(target, type) and _is_asgi_app(target):
        built = getattr(getattr(target, "state", None), "envsdk_config", None)
        capacity = getattr(built, "max_concurrent_envs", None)
        wanted = args.max_concurrent_envs
        if wanted is not None and capacity is not None and capacity != wanted:
            # The app fixed its capacity when it was built: say so rather than serve another one.
            raise CommandError(
                f"{args.target} is an app already built with max_concurrent_envs="
                f"{capacity}; --max-concurrent-envs {wanted} cannot change it: pass it to "
                "create_app(...), or serve the environment class (module:MyEnv) instead"
            )
        return target
    env_class = target if is_env_class else _returned_env_class(target)
    inferred_action, inferred_obs = step_types(env_class) if env_class is not None else (None, None)
    action = import_target(args.action) if args.action else inferred_action
    observation = import_target(args.observation) if args.observation else inferred_obs
    if not isinstance(action, type) or not isinstance(observation, type):
        raise CommandError(
            f"cannot tell the action/observation types of {args.target!r} from its step's annotations; "
            "annotate step(self, action: MyAction) -> MyObservation, or pass --action module:Class and "
            "--observation module:Class"
        )
    return create_app(target, action, observation, **overrides)


def _is_asgi_app(obj: Any) -> bool:
    from starlette.applications import Starlette

    return isinstance(obj, Starlette)


def _returned_env_class(factory: Callable[..., Any]) -> type | None:
    try:
        returned = typing.get_type_hints(factory).get("return")
    except Exception:  # no usable annotation
        return None
    is_env = isinstance(returned, type) and (issubclass(returned, Environment) or is_openenv_environment(returned))
    return returned if is_env else None


def _run_serve(args: argparse.Namespace) -> int:
    from envsdk.server import serve
    from envsdk.server.launch import AddressNotAvailableError, PortInUseError

    # Read here, so that a bad value is one line rather than a traceback from deep in the server.
    port = os.environ.get("PORT")
    if port and not (port.isdigit() and int(port) <= 65535):
        raise CommandError(f"PORT={port!r} is not a port number (0-65535)")
    capacity = os.environ.get("MAX_CONCURRENT_ENVS")
    if capacity and not (capacity.isdigit() and int(capacity) >= 1):
        raise CommandError(f"MAX_CONCURRENT_ENVS={capacity!r} is not a positive number")
    if args.replicas > 1 or args.replicas_file:
        return _run_replicas(args)
    from envsdk.server.config import ServerConfig, ServerEnvironmentError

    try:
        # The options environment variables set, checked before the target is imported: a
        # module may build its app (and so read them) while it is imported.
        ServerConfig()
        app = _build_app(args)
    except ValidationError as exc:
        if exc.title != "ServerConfig":
            raise
        raise CommandError(_option_error(exc)) from None
    except ServerEnvironmentError as exc:
        raise CommandError(str(exc)) from None
    try:
        serve(app, host=args.host, port=args.port, log_level=args.log_level)
    except PortInUseError as exc:
        raise CommandError(str(exc), 1) from None
    except AddressNotAvailableError as exc:
        # Reported as a port in use is: the server cannot listen where it was told to.
        where = "--host " if args.host else "HOST="
        raise CommandError(f"{where}{exc}", 1) from None
    return 0


def _option_error(exc: ValidationError) -> str:
    """The server options `exc` refuses, each as its flag, the value given and the bound it
    misses (pydantic's message), in one bounded line."""
    from envsdk.protocol import validation_errors, validation_message
    from envsdk.server.config import ENVIRONMENT_VARIABLES

    errors = validation_errors(exc)
    for error in errors:
        field = str(error["loc"][0]) if error.get("loc") else "option"
        # `serve` has a flag for the capacity alone: another option came from its environment variable.
        variable = ENVIRONMENT_VARIABLES.get(field) if field != "max_concurrent_envs" else None
        error["loc"] = [f"{variable}={error.get('input')}" if variable else f"--{field.replace('_', '-')} {error.get('input')}"]
    return validation_message("invalid server option", errors)


def _add_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve an environment over WebSocket and HTTP")
    parser.add_argument(
        "target", help="module:EnvClass, module:factory or module:app (or path/file.py:...)"
    )
    parser.add_argument("--host", default=None, help="bind address (default: $HOST or 127.0.0.1)")
    from envsdk.server.config import add_access_arguments, add_log_level_argument, port_number

    parser.add_argument("--port", type=port_number, default=None, help="port (default: $PORT or 8000)")
    parser.add_argument(
        "--max-concurrent-envs", type=int, default=None,
        help="session capacity (default: $MAX_CONCURRENT_ENVS or 64)",
    )
    parser.add_argument("--action", default=None, help="module:Class of the action type")
    parser.add_argument("--observation", default=None, help="module:Class of the observation type")

    add_log_level_argument(parser, "uvicorn's and envsdk's log level")
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


def _add_show(subparsers: Any) -> None:
    from envsdk.show import add_show_parser

    add_show_parser(subparsers)


COMMANDS: list[tuple[str, Callable[[Any], None]]] = [
    ("serve", _add_serve),
    ("check-env", _add_check_env),
    ("rollout", _add_rollout),
    ("show", _add_show),
    ("report", _add_report),
    ("rescore", _add_rescore),
]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: ``sys.argv[1:]``), run the chosen subcommand, return its code."""
    program = "envsdk"
    try:
        args = _parse(argv)
        program = f"envsdk {args.command}"
        # `module:Name` targets, policies and plugins are looked up in the current folder first,
        # as `python -m` and uvicorn do; a console script alone would not see it.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        code = _run(args)
        flush_out()  # the command ran to its end: its status stands, whoever stopped reading
        return code
    except KeyboardInterrupt as exc:
        # Ctrl-C where no command handles it (while the options are read, a module loads, a
        # report is read), or SIGTERM where a command raises it (`Terminated`): one line and
        # the shell's status for it, as `rollout` says its own.
        stopped = isinstance(exc, Terminated)
        print(f"{program}: {'terminated' if stopped else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if stopped else signal.SIGINT)
    except BrokenPipeError:
        # The reader went away (`envsdk ... | head`): nothing more to say, and nowhere to say it.
        let_stdout_go()
        return 1


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    from envsdk import __version__

    parser = argparse.ArgumentParser(
        prog="envsdk", description="Serve, check, roll out and report on environments for agentic RL."
    )
    parser.add_argument("--version", action="version", version=f"envsdk {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for _name, add_parser in COMMANDS:
        add_parser(subparsers)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Said by the subcommand's parser: its usage and `envsdk <command>: error:`, not the
        # top level's, which knows none of the subcommand's options.
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.command_line = list(argv) if argv is not None else sys.argv[1:]
    # Run as the `envsdk` program, the process is the command's own (see `rollout`'s heap freeze).
    args.own_process = argv is None
    return args


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"envsdk {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except EnvSDKError as exc:
        # Typed errors are the user's to fix: one line, no traceback.
        print(f"envsdk {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        hint = missing_extra(exc)
        if hint is None:
            raise
        print(f"envsdk {args.command}: error: {hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
