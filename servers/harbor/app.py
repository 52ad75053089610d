"""`create_harbor_app`: the Harbor task server as a FastAPI app, for embedding or serving;
`harbor_environment_factory`: the environments it serves, made without a server (``envsdk
check-env harbor --tasks DIR`` checks them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from envsdk.errors import EnvSDKError
from envsdk.sandbox import SandboxError
from envsdk.sandbox.container import ContainerEngine, ContainerLimits, ContainerProvider
from envsdk.server import create_app
from servers.harbor.environment import HarborEnvironment, HarborLimits, HarborTasks
from servers.harbor.models import HarborAction, HarborObservation, HarborState
from servers.harbor.tasks import TaskError, TaskFolderError

__all__ = ["HarborSetupError", "create_harbor_app", "harbor_environment_factory"]

logger = logging.getLogger("envsdk.harbor")


class HarborSetupError(EnvSDKError):
    """This Python lacks what the Harbor server needs (the ``mcp`` extra: its tools are served
    over MCP); one line naming the install command."""


def create_harbor_app(
    tasks: str | Path,
    *,
    provider: ContainerProvider | None = None,
    engine: str = "auto",
    limits: HarborLimits | None = None,
    allow_unbounded_disk: bool = False,
    tamper_check: bool = True,
    **server_options: Any,
) -> FastAPI:
    """An envsdk app serving the Harbor tasks of folder `tasks` (a folder of task folders, or
    one) on ``/ws`` (step action `HarborAction`), MCP (tools ``bash``, ``read_file``,
    ``write_file``, ``submit``) and ``/web``.

    Before the app is returned, the containers a killed server left are removed and every
    task's image is built (cached by content: a second start builds nothing); a task whose
    folder or image is broken is logged in one line and its resets answered with that error,
    while the others serve. `TaskFolderError` when no task can be served at all.

    `provider`: the container provider (default: one on `engine`, ``"auto"``, ``"podman"`` or
    ``"docker"``; `allow_unbounded_disk` lets it start containers whose storage limit it cannot
    enforce). `limits`: the server's caps on what a task gets (`HarborLimits`).
    `tamper_check` False: the verifier runs a task's tests even when the agent changed what
    they run (`HarborTasks`), for tasks that ask it to install what their tests use.
    `server_options` are `envsdk.server.ServerConfig` fields; the step and reset deadlines
    default to what the limits need. ``/health`` gains ``harbor``: the tasks, the broken ones
    with their errors, whether the tamper check is on, and the container provider.

    `HarborSetupError` (before anything is built) without the ``mcp`` extra. A line in the log
    says when ``max_concurrent_envs`` containers of the largest task would not all fit in the
    container store (a reset past its room waits a while for room, then fails in one line). At shutdown, once
    requests had their ``drain_timeout_s``, every container of the provider is removed with
    whatever runs in it, so the process exits in seconds whatever a command does.
    """
    _require_mcp()
    served = _served_tasks(tasks, provider, engine, limits, allow_unbounded_disk, tamper_check)
    server_options.setdefault("env_name", "HarborEnvironment")
    server_options.setdefault("step_timeout_s", served.limits.step_timeout_s)
    server_options.setdefault("reset_timeout_s", _reset_timeout_s())
    app = create_app(
        _environments(served), HarborAction, HarborObservation, state_type=HarborState, **server_options,
    )
    app.state.envsdk_harbor_tasks = served
    _add_harbor_health(app, served)
    _say_when_the_store_is_short(served, app.state.envsdk_config.max_concurrent_envs)
    _remove_containers_at_shutdown(app, served.provider)
    _one_line_task_errors()
    return app


def harbor_environment_factory(
    tasks: str | Path,
    *,
    provider: ContainerProvider | None = None,
    engine: str = "auto",
    limits: HarborLimits | None = None,
    allow_unbounded_disk: bool = False,
    tamper_check: bool = True,
) -> Callable[[], HarborEnvironment]:
    """A zero-argument maker of the environments `create_harbor_app` serves for the same
    arguments (each one a session's: it plays the tasks of folder `tasks`, one container per
    episode). As the server does before it serves, the containers a killed server left are
    removed and every task's image is built first; `TaskFolderError` when no task can be
    served. Blocking: seconds when the images are cached, minutes for a first build."""
    return _environments(_served_tasks(tasks, provider, engine, limits, allow_unbounded_disk, tamper_check))


def _served_tasks(
    tasks: str | Path, provider: ContainerProvider | None, engine: str, limits: HarborLimits | None,
    allow_unbounded_disk: bool, tamper_check: bool,
) -> HarborTasks:
    """The tasks of folder `tasks`, their images built (see `create_harbor_app`)."""
    if provider is None:
        provider = ContainerProvider(ContainerEngine.detect(engine), allow_unbounded_disk=allow_unbounded_disk)
    served = HarborTasks(tasks, provider, limits or HarborLimits(), tamper_check=tamper_check)
    if not tamper_check:
        logger.warning(
            "the tamper check is off: an agent that replaces a program or library the tests run "
            "(bash, python, ...) gets the reward it wants"
        )
    # What a killed server left goes now, not at this server's first reset.
    provider.remove_orphans()
    served.build()
    if not served.images:
        raise TaskFolderError(f"tasks folder {str(tasks)!r}: no task can be served (each one's error is logged above)")
    return served


def _require_mcp() -> None:
    """`HarborSetupError` unless fastmcp (the ``mcp`` extra) can be imported: without it the
    server would serve no tool, and every episode would fail at its first tool call."""
    try:
        import fastmcp  # noqa: F401 - only whether it is there
    except ImportError:
        raise HarborSetupError(
            "the Harbor server serves its tools (bash, read_file, write_file, submit) over MCP, which needs "
            "fastmcp, envsdk's [mcp] extra: run pip install -e '.[mcp]' in the envsdk clone "
            "(or bash scripts/setup.sh mcp)"
        ) from None


def _say_when_the_store_is_short(served: HarborTasks, sessions: int) -> None:
    """One warning line when `sessions` containers of the largest task the server plays would
    not all fit in the room the container store has for containers now."""
    space = served.provider.store_space()
    if space is None or not served.images:
        return
    needs = {
        name: served.limits.container_limits(served.tasks[name], served.provider.limits).container_memory_mb
        for name in served.images
    }
    largest = max(needs, key=lambda name: needs[name])
    if sessions * needs[largest] <= space.available_mb:
        return
    if space.host_bound:
        room = f"{space.available_mb} MiB available: this host's {space.memory_mb} MiB of RAM and swap bound it"
        act = "lower max_concurrent_envs (growing the store adds no room: the host's memory is the bound)"
    else:
        room = f"{space.available_mb} MiB available of {space.size_mb} MiB"
        act = f"lower max_concurrent_envs, or grow the store (mount -o remount,size=<MB>m {space.store})"
    logger.warning(
        "the container store %s has room for %d container(s) of task %s (%d MiB each: memory_mb + storage_mb + command "
        "output and the verifier's folders; %s), fewer than max_concurrent_envs %d: a reset past its room waits for "
        "containers to end, then is refused; %s",
        space.store, space.available_mb // needs[largest], largest, needs[largest], room, sessions, act,
    )


def _remove_containers_at_shutdown(app: FastAPI, provider: ContainerProvider) -> None:
    """Remove every container of `provider` at shutdown: when the drain (SIGTERM under
    `envsdk.server.serve`) has given requests their ``drain_timeout_s`` and one still runs, and
    when the app's lifespan ends, before the sessions are closed. A call blocked in a container
    (a command of 170 s) then returns at once, so the sessions' closes run and the process
    exits, rather than waiting for the command (the engine is asked directly: no sandbox's lock
    is waited for)."""
    drain = app.state.envsdk_drain
    grace_s = app.state.envsdk_config.drain_timeout_s

    async def remove(when: str) -> None:
        removed = await asyncio.to_thread(provider.remove_all)
        if removed:
            logger.warning("shutting down: removed %d container(s) %s", removed, when)

    async def drain_then_remove() -> None:
        draining = asyncio.ensure_future(drain())
        try:
            done, _ = await asyncio.wait({draining}, timeout=grace_s)
            if not done:
                await remove(f"with calls still running in them after the drain timeout ({grace_s:g} s)")
            await draining
        finally:
            if not draining.done():
                draining.cancel()
        await remove("left after the sessions closed")

    app.state.envsdk_drain = drain_then_remove
    lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan_then_remove(served: Any) -> AsyncIterator[Any]:
        async with lifespan(served) as state:
            try:
                yield state
            finally:
                await remove("of sessions still open")

    app.router.lifespan_context = lifespan_then_remove


#: The server's line for an env call that raised: ``<Env>.<call> raised <Type>: <what>``.
_RAISED = re.compile(r"HarborEnvironment\.\w+ raised (\w+)")


class _OneLineTaskErrors(logging.Filter):
    """Drops the traceback the server logs beside an env error when the error is one of a task
    or of its container (`TaskError`, `SandboxError` and theirs): their one line names what to
    fix, and a traceback of them says nothing more."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg == "%s\n%s" and isinstance(args, tuple) and len(args) == 2 and isinstance(args[0], str):
            raised = _RAISED.match(args[0])
            if raised is not None and raised.group(1) in _typed_error_names():
                record.msg, record.args = "%s", (args[0],)
        return True


def _typed_error_names() -> set[str]:
    found: set[str] = set()
    todo: list[type[BaseException]] = [TaskError, SandboxError]
    while todo:
        kind = todo.pop()
        found.add(kind.__name__)
        todo.extend(kind.__subclasses__())
    return found


def _one_line_task_errors() -> None:
    """Install `_OneLineTaskErrors` on the server's logger (once)."""
    server_log = logging.getLogger("envsdk.server")
    if not any(isinstance(f, _OneLineTaskErrors) for f in server_log.filters):
        server_log.addFilter(_OneLineTaskErrors())


def _environments(served: HarborTasks) -> Callable[[], HarborEnvironment]:
    # Annotated: the /web page finds the env class (its render hook) by the maker's return type.
    def make_env() -> HarborEnvironment:
        return HarborEnvironment(served)

    return make_env


def _reset_timeout_s() -> float:
    """A reset closes the previous episode's container, then starts one and waits for it."""
    return HarborEnvironment.close_timeout_s + ContainerLimits().start_timeout_s + 60.0


def _add_harbor_health(app: FastAPI, served: HarborTasks) -> None:
    """Answer ``/health`` with the server's own fields plus ``harbor`` (routes match in
    order, so this one, put first, answers)."""
    base = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/health")

    async def health() -> dict[str, Any]:
        reply: dict[str, Any] = await base.endpoint()
        reply["harbor"] = {
            "tasks": len(served.names),
            "ready": sorted(served.images),
            "broken": {name: str(error) for name, error in sorted(served.broken.items())},
            "tamper_check": served.tamper_check,
            # In a thread: a provider may ask its engine.
            "containers": await asyncio.to_thread(served.provider.describe),
        }
        return reply

    app.router.routes.insert(0, APIRoute("/health", health, methods=["GET"]))
