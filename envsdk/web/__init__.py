"""The web page every envsdk server can serve at ``/web``: play an episode by hand and watch the
server.

`mount_web` adds, to an app built by `envsdk.server.create_app`:

* ``GET /web`` — one HTML page (assets under ``/web/static/``: one JS and one CSS file shipped
  in this package, no build step). The page speaks the same ``/ws`` protocol as every client
  (plain browser WebSocket): reset with a seed, a variant and any JSON keyword arguments, send
  actions (JSON, or text for an action with a single string field), see the observation,
  reward, done and verdict, and the server's live figures from ``/health`` and ``/metrics``.
* ``GET /web/api/info`` — what the page needs to know of the env: name, action and observation
  JSON schemas, the action's single string field (if it has exactly one), the reset
  parameters when they can be read from the env's ``reset`` signature, and for a tool env its
  tools (name, description, input schema): the page then shows a tool picker, one form per
  tool from its schema, and calls the tool over ``/ws`` (``{"type": "mcp"}``).
* ``POST /web/api/sudoku/hints`` and ``POST /web/api/sudoku/reward`` — for observations with a
  9×9 ``board``: the hints and the five reward components exactly as `SudokuScheduler`
  computes them (see `envsdk.web.sudoku`), so the page never re-implements them in JS.

Whether a server mounts the page is `ServerConfig.web` (env ``ENVSDK_WEB=0`` turns it off).
Behind a token (`ServerConfig.token`) open ``/web?token=<token>``: the page passes the token on
to its assets, its HTTP calls (bearer header) and ``/ws`` (query parameter).
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from envsdk.server.sessions import EnvSpec
from envsdk.web.sudoku import (
    SudokuHintsReply,
    SudokuHintsRequest,
    SudokuRewardReply,
    SudokuRewardRequest,
    sudoku_hints_reply,
    sudoku_reward_reply,
)

__all__ = ["WEB_PATH", "STATIC_DIR", "mount_web", "text_field", "reset_parameters"]

WEB_PATH = "/web"
_ASSET_QUERY = "{{asset_query}}"
#: The page's assets, shipped as package data (``envsdk/web/static/*``).
STATIC_DIR = Path(__file__).parent / "static"


def text_field(action_type: type[BaseModel]) -> str | None:
    """The name of the action's only field other than ``metadata`` when that field is a
    ``str``; None otherwise (the page then asks for a JSON action)."""
    fields = {name: f for name, f in action_type.model_fields.items() if name != "metadata"}
    if len(fields) != 1:
        return None
    name, field = next(iter(fields.items()))
    return name if field.annotation is str else None


def reset_parameters(spec: EnvSpec) -> list[str] | None:
    """The keyword names the env's ``reset`` accepts, read from the env class (or from the
    factory's return annotation); None when the class cannot be told or ``reset`` takes
    ``**kwargs``."""
    env_class: Any = spec.factory if isinstance(spec.factory, type) else None
    if env_class is None:
        try:
            env_class = typing.get_type_hints(spec.factory).get("return")
        except Exception:  # unresolvable annotations: the page just shows every input
            return None
    reset = getattr(env_class, "reset", None) if isinstance(env_class, type) else None
    if reset is None:
        return None
    params = list(inspect.signature(reset).parameters.values())[1:]  # drop self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def mount_web(app: FastAPI, spec: EnvSpec) -> None:
    """Register ``/web``, ``/web/static/…`` and ``/web/api/…`` on `app` for the env `spec`.

    Raises `FileNotFoundError` if the package's static assets are missing (an install without
    its package data).
    """
    index = STATIC_DIR / "index.html"
    if not index.is_file():
        raise FileNotFoundError(
            f"envsdk's web assets are missing ({index}); reinstall envsdk with its package data, "
            "or turn the page off with ServerConfig(web=False) / ENVSDK_WEB=0"
        )
    page = index.read_text(encoding="utf-8")
    info: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "action_schema": spec.action_type.model_json_schema(),
        "observation_schema": spec.observation_type.model_json_schema(),
        "text_field": text_field(spec.action_type),
        "reset_parameters": reset_parameters(spec),
    }

    @app.get(WEB_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def web_page(token: str | None = None) -> str:
        # Behind a token the page is opened as /web?token=…, already checked by the server's
        # access control; its asset requests need the token too, and cannot send a header.
        return page.replace(_ASSET_QUERY, f"?{urlencode({'token': token})}" if token else "")

    @app.get(WEB_PATH + "/", include_in_schema=False)
    async def web_slash(request: Request) -> RedirectResponse:
        query = request.url.query
        return RedirectResponse(f"{WEB_PATH}?{query}" if query else WEB_PATH)

    @app.get(WEB_PATH + "/api/info")
    async def web_info() -> dict[str, Any]:
        if "tools" not in info:
            from envsdk.server.mcp import describe_tools

            info["tools"] = await describe_tools(spec.factory)
        return info

    @app.post(WEB_PATH + "/api/sudoku/hints")
    async def web_sudoku_hints(body: SudokuHintsRequest) -> SudokuHintsReply:
        return sudoku_hints_reply(body)

    @app.post(WEB_PATH + "/api/sudoku/reward")
    async def web_sudoku_reward(body: SudokuRewardRequest) -> SudokuRewardReply:
        return sudoku_reward_reply(body)

    app.mount(WEB_PATH + "/static", StaticFiles(directory=STATIC_DIR), name="envsdk-web-static")
