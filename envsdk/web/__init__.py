"""The web page every envsdk server can serve at ``/web``: play an episode by hand and watch the
server.

`mount_web` adds, to an app built by `envsdk.server.create_app`:

* ``GET /web`` — one HTML page (assets under ``/web/static/``: one JS and one CSS file shipped
  in this package, no build step). The page speaks the same ``/ws`` protocol as every client
  (plain browser WebSocket): reset with a seed, a variant and any JSON keyword arguments, send
  actions (JSON, or text for an action with a single string field), see the observation,
  reward, done and verdict, and the server's live figures from ``/health`` and ``/metrics``.
* ``GET /web/api/info`` — what the page needs to know of the env: name, action and observation
  JSON schemas, the action's single string field (if it has exactly one) and its placeholder,
  the reset parameters when they can be read from the env's ``reset`` signature, the env's
  panel (if any), and for a tool env its tools (name, description, input schema): the page
  then shows a tool picker, one form per tool from its schema, and calls the tool over ``/ws``
  (``{"type": "mcp"}``). An env that must be built to list its tools (an OpenEnv
  ``MCPEnvironment``) is built once, as a session's env: within ``max_concurrent_envs`` and under
  the factory deadline (503 while no slot is free).
* ``POST /web/api/render`` — an observation as the page shows it (`WebView`): the env's
  render hook when it has one, else its text.
* ``POST /web/api/model_view`` — ``{"observation", "previous", "formatter"?}`` → ``{"text"}``:
  what a model reads for that observation, rendered by the schedulers' own function
  (`envsdk.formats`, ``"text"`` unless another registered formatter is named).

The render hook: an environment class may define ``render_web(observation) -> WebView`` (a
static or class method) giving text or HTML for its observation and the legal actions (shown as
buttons that fill the action box); HTML is shown in a sandboxed frame (no scripts). Without it
the page shows the observation's single text field, or its fields as JSON. An env class may
also set ``web_panel`` to a `WebPanel` (or a ``"module:attribute"`` naming one, imported when
the page is mounted): extra routes under ``/web/api/<name>/`` and a script the page loads to
draw more (the Sudoku server's board, hints and reward components).

Whether a server mounts the page is `ServerConfig.web` (env ``ENVSDK_WEB=0`` turns it off).
Behind a token (`ServerConfig.token`) open ``/web?token=<token>``: the page passes the token on
to its assets, its HTTP calls (bearer header) and ``/ws`` (query parameter).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Body, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, ValidationError

from envsdk.protocol import FrameError
from envsdk.server.sessions import EnvSpec

__all__ = [
    "WEB_PATH", "STATIC_DIR", "WebView", "WebPanel", "mount_web", "text_field", "reset_parameters", "env_class_of",
]

WEB_PATH = "/web"
_ASSET_QUERY = "{{asset_query}}"
#: The page's assets, shipped as package data (``envsdk/web/static/*``).
STATIC_DIR = Path(__file__).parent / "static"


class WebView(BaseModel):
    """How the page shows one observation: `html` (in a sandboxed frame) or `text` (as is),
    and `actions`, the legal actions as the text the action box takes."""

    text: str | None = None
    html: str | None = None
    actions: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class WebPanel:
    """An env's addition to the page: `router` is mounted under ``/web/api/<name>``; `script`
    (a JavaScript file) is served at ``/web/panel/<name>.js`` and loaded by the page, where it
    registers ``window.envsdkPanels[name] = (page) => ({onReset, onStep, show})``.
    `action_placeholder` replaces the action box's placeholder."""

    name: str
    router: APIRouter | None = None
    script: Path | None = None
    action_placeholder: str | None = None


def env_class_of(spec: EnvSpec) -> type | None:
    """The env class: the factory itself, or the class its return annotation names."""
    if isinstance(spec.factory, type):
        return spec.factory
    try:
        returned = typing.get_type_hints(spec.factory).get("return")
    except Exception:  # unresolvable annotations: no class to read hooks from
        return None
    return returned if isinstance(returned, type) else None


def _default_view(observation: BaseModel) -> WebView:
    body = observation.model_dump(exclude={"reward", "done", "metadata"})
    texts = [v for v in body.values() if isinstance(v, str)]
    if len(body) == 1 and len(texts) == 1:
        return WebView(text=texts[0])
    return WebView(text=json.dumps(body, indent=2, ensure_ascii=False, default=str))


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
    env_class = env_class_of(spec)
    reset = getattr(env_class, "reset", None) if env_class is not None else None
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
    env_class = env_class_of(spec)
    render = getattr(env_class, "render_web", None)
    panel = getattr(env_class, "web_panel", None)
    if isinstance(panel, str):
        from envsdk.registry import import_spec

        panel = import_spec(panel)
    if panel is not None and not isinstance(panel, WebPanel):
        raise TypeError(f"{env_class!r}.web_panel must be a WebPanel or 'module:attribute' naming one")
    field = text_field(spec.action_type)
    described = spec.action_type.model_fields[field].description if field else None
    info: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "action_schema": spec.action_type.model_json_schema(),
        "observation_schema": spec.observation_type.model_json_schema(),
        "text_field": field,
        "action_placeholder": (panel.action_placeholder if panel else None) or described or (
            f"text for `{field}`" if field else None
        ),
        "reset_parameters": reset_parameters(spec),
        "panel": panel.name if panel is not None and panel.script is not None else None,
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

    listing = asyncio.Lock()

    @app.get(WEB_PATH + "/api/info", response_model=None)
    async def web_info(request: Request) -> dict[str, Any] | JSONResponse:
        # One request at a time builds what the list needs (an OpenEnv MCP env is built as a
        # throw-away session's: within capacity, under the factory deadline); the rest wait
        # for it and read the cached list. A refusal is not cached: the page retries.
        async with listing:
            if "tools" not in info:
                from envsdk.server.mcp import describe_tools

                try:
                    info["tools"] = await describe_tools(request.app.state.envsdk_sessions)
                except FrameError as exc:
                    return JSONResponse(
                        {"detail": f"cannot list the tools now: {exc.message}", "code": exc.code.value, **exc.details},
                        status_code=503,
                    )
        return info

    @app.post(WEB_PATH + "/api/render")
    async def web_render(body: dict[str, Any] = Body(...)) -> WebView:
        try:
            observation = spec.observation_type.model_validate(body.get("observation", body))
        except ValidationError as exc:
            raise HTTPException(422, detail=f"not a {spec.observation_type.__name__}: {exc}") from None
        if render is None:
            return _default_view(observation)
        try:
            view = render(observation)
        except Exception as exc:  # the env's own code: its failure is the page's to show
            raise HTTPException(500, detail=f"render_web raised {type(exc).__name__}: {exc}") from None
        return view if isinstance(view, WebView) else WebView(text=str(view))

    @app.post(WEB_PATH + "/api/model_view")
    async def web_model_view(body: dict[str, Any] = Body(...)) -> dict[str, str]:
        # The very function the schedulers call, so the page shows the model's characters.
        from envsdk.formats import DEFAULT_FORMATTER, formatters

        observation, previous = body.get("observation"), body.get("previous")
        name = body.get("formatter") or DEFAULT_FORMATTER
        if not isinstance(observation, dict) or not (previous is None or isinstance(previous, dict)):
            raise HTTPException(422, detail="expected {'observation': {...}, 'previous': {...} or null}")
        if not isinstance(name, str) or name not in formatters:
            raise HTTPException(422, detail=f"unknown formatter {name!r}; known: {', '.join(sorted(formatters))}")
        # A registered formatter is user code: it runs off the event loop like any env call.
        text = await asyncio.to_thread(formatters[name], observation, previous)
        return {"formatter": name, "text": text}

    if panel is not None:
        if panel.router is not None:
            app.include_router(panel.router, prefix=f"{WEB_PATH}/api/{panel.name}")
        script = panel.script
        if script is not None:

            @app.get(f"{WEB_PATH}/panel/{panel.name}.js", include_in_schema=False)
            async def web_panel_script() -> FileResponse:
                return FileResponse(script, media_type="text/javascript")

    app.mount(WEB_PATH + "/static", StaticFiles(directory=STATIC_DIR), name="envsdk-web-static")
