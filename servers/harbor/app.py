"""`create_harbor_app`: the Harbor task server as a FastAPI app, for embedding or serving;
`harbor_environment_factory`: the environments it serves, made without a server (``envsdk
check-env harbor --tasks DIR`` checks them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from envsdk.sandbox.container import ContainerEngine, ContainerLimits, ContainerProvider
from envsdk.server import create_app
from servers.harbor.environment import HarborEnvironment, HarborLimits, HarborTasks
from servers.harbor.models import HarborAction, HarborObservation, HarborState
from servers.harbor.tasks import TaskFolderError

__all__ = ["create_harbor_app", "harbor_environment_factory"]

logger = logging.getLogger("envsdk.harbor")


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
    """
    served = _served_tasks(tasks, provider, engine, limits, allow_unbounded_disk, tamper_check)
    server_options.setdefault("env_name", "HarborEnvironment")
    server_options.setdefault("step_timeout_s", served.limits.step_timeout_s)
    server_options.setdefault("reset_timeout_s", _reset_timeout_s())
    app = create_app(
        _environments(served), HarborAction, HarborObservation, state_type=HarborState, **server_options,
    )
    app.state.envsdk_harbor_tasks = served
    _add_harbor_health(app, served)
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
