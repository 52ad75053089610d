"""Token authentication, the browser Origin check, loopback binding, and what the server
never does with client bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import psutil
import pytest
from pydantic import SecretStr
from server.helpers import frame, ws_url
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import envsdk
from envsdk.client import EnvClient, InProcessTransport
from envsdk.errors import AuthenticationError
from envsdk.server import ServerConfig, create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server

from .helpers import serve_process

TOKEN = "s3cret-token"
RESET = frame(type="reset", data={})


@pytest.fixture(scope="module")
def token_url():
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, token=TOKEN)
    with running_server(app, log_config=None) as url:
        yield url


def _refusal(url: str, **connect_kwargs) -> tuple[dict, int | None]:
    """The first frame and the close code of a connection the server refuses."""
    with connect(url, **connect_kwargs) as ws:
        first = json.loads(ws.recv(timeout=5))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
        return first, ws.close_code


@pytest.mark.timeout(30)
def test_without_a_valid_token_websocket_and_http_are_refused_with_the_reason(token_url):
    first, code = _refusal(ws_url(token_url))
    assert first["data"]["code"] == "UNAUTHORIZED" and first["data"]["reason"] == "missing_token"
    assert "Authorization: Bearer" in first["data"]["message"] and code == 1008
    first, code = _refusal(ws_url(token_url), additional_headers={"Authorization": "Bearer wrong"})
    assert first["data"]["reason"] == "invalid_token" and code == 1008
    first, _ = _refusal(ws_url(token_url, "token=wrong"))
    assert first["data"]["reason"] == "invalid_token"

    for method, path in (("GET", "/metadata"), ("GET", "/schema"), ("GET", "/metrics"),
                         ("POST", "/reset"), ("GET", "/state"), ("GET", "/openapi.json")):
        response = httpx.request(method, token_url + path, json={} if method == "POST" else None)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["detail"]["code"] == "UNAUTHORIZED"
    # /health stays open, and no refused attempt took a session.
    assert httpx.get(token_url + "/health").json()["active_sessions"] == 0

    good = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(token_url + "/metadata", headers=good).status_code == 200
    assert httpx.get(token_url + f"/metadata?token={TOKEN}").status_code == 200
    for url, kwargs in ((ws_url(token_url), {"additional_headers": good}), (ws_url(token_url, f"token={TOKEN}"), {})):
        with connect(url, **kwargs) as ws:
            ws.send(RESET)
            assert json.loads(ws.recv(timeout=5))["type"] == "observation"


@pytest.mark.timeout(30)
async def test_envclient_sends_its_token_reads_envsdk_token_and_raises_authentication_error(token_url, monkeypatch):
    monkeypatch.delenv("ENVSDK_TOKEN", raising=False)
    with pytest.raises(AuthenticationError, match="requires a token") as info:
        await EnvClient(token_url).connect()
    assert info.value.code == "UNAUTHORIZED" and info.value.details["reason"] == "missing_token"
    with pytest.raises(AuthenticationError, match="not valid"):
        await EnvClient(token_url, token="wrong").connect()

    async with EnvClient(token_url, token=TOKEN) as env:
        assert (await env.reset()).observation["echoed_message"] == "ready"
    async with EnvClient(token_url, headers={"Authorization": f"Bearer {TOKEN}"}) as env:
        await env.reset()
    monkeypatch.setenv("ENVSDK_TOKEN", TOKEN)
    async with EnvClient(token_url) as env:
        await env.reset()
        assert (await env.step({"message": "hi"})).observation["echoed_message"] == "hi"


@pytest.mark.timeout(30)
async def test_the_token_guards_the_in_process_transport_too():
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, token=TOKEN)
    async with InProcessTransport(app) as transport:
        with pytest.raises(AuthenticationError):
            await EnvClient("http://envsdk", transport=transport, token="wrong").connect()
        async with EnvClient("http://envsdk", transport=transport, token=TOKEN) as env:
            await env.reset()


def test_server_token_defaults_to_envsdk_token_and_is_hidden_in_reprs(monkeypatch):
    monkeypatch.setenv("ENVSDK_TOKEN", TOKEN)
    config = ServerConfig()
    assert isinstance(config.token, SecretStr) and config.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(config)
    monkeypatch.setenv("ENVSDK_TOKEN", "")
    assert ServerConfig().token is None


@pytest.mark.timeout(30)
def test_a_browser_origin_is_refused_unless_listed_or_same_origin():
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, allowed_origins=("https://ok.example",))
    with running_server(app, log_config=None) as url:
        first, code = _refusal(ws_url(url), origin="https://evil.example")
        assert first["data"]["reason"] == "origin_not_allowed" and code == 1008
        assert "allowed_origins" in first["data"]["message"]
        assert httpx.get(url + "/metadata", headers={"Origin": "https://evil.example"}).status_code == 403
        same_origin = url  # the server's own page, e.g. /web
        for origin in ("https://ok.example", "https://OK.example:443", same_origin, None):
            with connect(ws_url(url), origin=origin) as ws:
                ws.send(RESET)
                assert json.loads(ws.recv(timeout=5))["type"] == "observation", origin
        assert httpx.get(url + "/health", headers={"Origin": "https://evil.example"}).status_code == 200


@pytest.mark.timeout(60)
def test_envsdk_serve_binds_loopback_by_default_and_takes_a_token(tmp_path):
    with serve_process("envsdk.testing:EchoEnvironment", tmp_path / "server.log", args=["--token", TOKEN]) as server:
        listening = [c.laddr for c in psutil.Process(server.proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert httpx.get(server.url + "/metadata").status_code == 401
        assert httpx.get(server.url + "/metadata", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_server_code_never_unpickles_evaluates_or_imports_what_a_client_sends():
    """A static audit of the code that handles client bytes: JSON in, pydantic validation,
    no pickle/marshal/eval/exec/dynamic import. (The process pool of `run_in_process` pickles
    between the server and its own workers: server-made data, never client bytes as such.)"""
    root = Path(envsdk.__file__).parent
    files = [*root.joinpath("server").rglob("*.py"), root / "protocol.py"]
    forbidden = re.compile(r"\b(pickle|marshal|shelve|eval|exec|__import__|import_module)\b|yaml\.load")
    hits = [f"{path.name}:{n}: {line.strip()}" for path in files
            for n, line in enumerate(path.read_text().splitlines(), 1) if forbidden.search(line)]
    assert hits == []
