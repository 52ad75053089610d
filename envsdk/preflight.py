"""Checks `envsdk rollout` makes before its first episode, each failing in one line that says
what to do: the environment servers answer, accept the token, have room for the concurrency
asked for, and the inference endpoint answers and serves the model.

Standard library HTTP only (``urllib``), with short timeouts: a check never hangs a rollout.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from envsdk.client.pool import health_url
from envsdk.errors import EnvSDKError

__all__ = ["PreflightError", "check_env_servers", "check_inference", "served_env_name"]

_TIMEOUT_S = 5.0


class PreflightError(EnvSDKError):
    """A rollout cannot start; the message says why and what to do."""


def _http_base(url: str) -> str:
    return health_url(url).removesuffix("/health")


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body or None). Raises `OSError` when nothing answers."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as reply:
            status, body = reply.status, reply.read(1 << 20)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1 << 20)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _words(name: str) -> str:
    """A name reduced for comparison: letters and digits, lower case, no ``env``/``environment``
    suffix (``my_env``, ``MyEnv`` and ``MyEnvironment`` all give ``my``)."""
    letters = re.sub(r"[^0-9a-z]", "", name.lower())
    for suffix in ("environment", "env"):
        if letters.endswith(suffix) and len(letters) > len(suffix):
            return letters[: -len(suffix)]
    return letters


def same_env(asked: str, metadata: Any) -> bool:
    """Whether the env the user named (`asked`) is the one a server's ``/metadata`` describes:
    its ``name`` (or ``env_id``) equal after `_words`, or one containing the other. A server
    whose metadata names nothing is taken at its word."""
    served = [str(metadata.get(k)) for k in ("name", "env_id") if isinstance(metadata, dict) and metadata.get(k)]
    want = _words(asked)
    return not served or not want or any(want in _words(s) or _words(s) in want for s in served if _words(s))


def served_env_name(url: str) -> str | None:
    """The env name a server's ``/metadata`` gives (its ``name``), or None when it names none or
    cannot be read (`check_env_servers` then says why)."""
    if not url.startswith(("http://", "https://", "ws://", "wss://")):
        return None
    token = os.environ.get("ENVSDK_TOKEN")
    try:
        status, body = _get(_http_base(url) + "/metadata", {"Authorization": f"Bearer {token}"} if token else {})
    except OSError:
        return None
    name = body.get("name") if status == 200 and isinstance(body, dict) else None
    return name if isinstance(name, str) and name else None


def check_env_servers(urls: Sequence[str], concurrency: int, env_names: Mapping[str, str] | None = None) -> None:
    """Every ``http(s)://``/``ws(s)://`` URL in `urls` answers ``/health``, accepts
    ``$ENVSDK_TOKEN`` (if it asks for one), serves the env `env_names` names for it (if any;
    see `same_env`), and together they have `concurrency` free sessions (servers that do not
    report capacity, such as plain OpenEnv ones, are not counted). Other entries (pool names,
    replicas files) are left to the pool."""
    token = os.environ.get("ENVSDK_TOKEN")
    free_total, counted = 0, []
    for url in urls:
        if not url.startswith(("http://", "https://", "ws://", "wss://")):
            continue
        base = _http_base(url)
        try:
            health_status, health = _get(base + "/health")
        except OSError as exc:
            reason = getattr(exc, "reason", exc)
            raise PreflightError(
                f"no environment server answers at {base} ({reason}): start it (e.g. `envsdk serve "
                "my_module:MyEnv --port 8000`, `python -m servers.sudoku --port 8000`) or fix --base-url"
            ) from None
        if health_status not in (200, 401):  # 401: a token is asked for (said below)
            raise PreflightError(
                f"{base}/health answered HTTP {health_status}: no environment server is at that address"
                " (one answers 200 there): fix --base-url to the server's root, e.g. http://127.0.0.1:8000"
            )
        status, body = _get(base + "/metadata", {"Authorization": f"Bearer {token}"} if token else {})
        if status == 401:
            detail = body.get("detail") if isinstance(body, dict) else None
            reason = detail.get("reason") if isinstance(detail, dict) else None
            if token:
                raise PreflightError(f"{base} refused the token in $ENVSDK_TOKEN ({reason}): set the server's token")
            raise PreflightError(f"{base} requires a token: set ENVSDK_TOKEN=<the server's token> and run again")
        asked = (env_names or {}).get(url)
        if asked is not None and status == 200 and not same_env(asked, body):
            served = body.get("name") if isinstance(body, dict) else None
            raise PreflightError(
                f"{base} serves {served!r}, not {asked!r}: name the server's env (--env {served}) or fix --base-url"
            )
        if isinstance(health, dict) and isinstance(health.get("max_sessions"), int):
            active = int(health.get("active_sessions") or 0)
            free_total += max(0, health["max_sessions"] - active)
            counted.append(f"{base} {active}/{health['max_sessions']} sessions in use")
    if counted and free_total < concurrency:
        raise PreflightError(
            f"{'; '.join(counted)}: {free_total} free, but --concurrency is {concurrency}: lower "
            f"--concurrency to {max(free_total, 1)} or restart the server with MAX_CONCURRENT_ENVS="
            f"{concurrency} (envsdk serve --max-concurrent-envs {concurrency})"
        )


def check_inference(api_base: str, model: str, api_key: str | None = None) -> None:
    """The OpenAI-compatible endpoint `api_base` answers ``GET /models`` (with `api_key`,
    default ``$OPENAI_API_KEY``) and lists `model`."""
    base = api_base.rstrip("/")
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    try:
        status, body = _get(base + "/models", {"Authorization": f"Bearer {key}"} if key else {})
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        raise PreflightError(
            f"no inference server answers at {base} ({reason}): start one (e.g. `vllm serve {model}`) "
            "or fix --api-base (an OpenAI-compatible URL ending in /v1)"
        ) from None
    if status != 200:
        raise PreflightError(f"{base}/models answered HTTP {status}: check --api-base and --api-key ($OPENAI_API_KEY)")
    data = body.get("data") if isinstance(body, dict) else None
    served = [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if served and model not in served:
        raise PreflightError(f"{base} does not serve the model {model!r}; it serves: {', '.join(served)}")
