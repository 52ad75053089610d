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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envsdk.client.pool import health_url, is_pool_spec, pools, url_source
from envsdk.errors import EnvSDKError, mask_secrets

__all__ = ["PreflightError", "check_env_servers", "check_inference", "first_answering", "served_env_name"]

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


def _pool_servers(spec: str) -> tuple[str, list[str]]:
    """(how to name `spec` in a message, the base URLs it lists now) for a pool name or a file of
    base URLs (``--replicas-file``)."""
    what = f"of the pool {spec!r}" if spec in pools else f"listed in {spec}"
    try:
        listed = [u.strip() for u in url_source(spec)() if u and u.strip()]
    except (OSError, ValueError, EnvSDKError) as exc:
        raise PreflightError(f"cannot read the environment servers {what}: {exc}: fix it or --base-url") from None
    if not listed:
        raise PreflightError(f"no environment server is {what}: start the servers or fix --base-url")
    return what, list(dict.fromkeys(listed))


def _health(base: str) -> tuple[int, Any] | OSError:
    """`_get` of ``base/health``, or the `OSError` when nothing answers there."""
    try:
        return _get(base + "/health")
    except OSError as exc:
        return exc
    except ValueError as exc:  # no URL urllib can open (a line of a file of base URLs)
        return OSError(str(exc))


def _reason(exc: OSError) -> object:
    return getattr(exc, "reason", exc)


def first_answering(base_url: str | Sequence[str]) -> str:
    """The server to ask what a list of base URLs serves (its tools, its chat form): the first
    whose ``/health`` answers (one given alone is that one), else the first listed."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if len(urls) > 1:
        for url in urls:
            if url.startswith(("http://", "https://", "ws://", "wss://")) and not isinstance(_health(_http_base(url)), OSError):
                return url
    return urls[0] if urls else ""


def _pool_members(
    listed: Sequence[str], what: str, left: str, warn: Callable[[str], None] | None
) -> list[tuple[str, tuple[int, Any] | OSError]]:
    """Each server of a pool with its ``/health`` reply (or why none came), asked all at once;
    `PreflightError` when none answers (`what` names the pool, `left` adds a hint), a line to
    `warn` when some do not."""
    listed = list(dict.fromkeys(listed))
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(listed)))) as threads:  # a few s at most, not N × 5 s
        members = list(zip(listed, threads.map(lambda u: _health(_http_base(u)), listed)))
    gone = [(url, reply) for url, reply in members if isinstance(reply, OSError)]
    if gone:
        first = mask_secrets(f"{gone[0][0]}: {_reason(gone[0][1])}") + (
            f", and {len(gone) - 1} more" if len(gone) > 1 else ""
        )
        if len(gone) == len(members):
            raise PreflightError(
                f"none of the {len(members)} environment servers {what} answers ({first}){left}: "
                "start them or fix --base-url"
            )
        if warn is not None:
            warn(f"{len(gone)} of the {len(members)} environment servers {what} "
                 f"{'does' if len(gone) == 1 else 'do'} not answer ({first}): playing on the "
                 f"{len(members) - len(gone)} that answer")
    return members


#: At most this many servers of a list are named in a message about them.
_NAMED = 3


def _listed(urls: Sequence[str]) -> str:
    """How to name a list of base URLs in a message: ``listed (A, B, C)``, the first few."""
    shown = ", ".join(mask_secrets(u) for u in urls[:_NAMED]) + (", …" if len(urls) > _NAMED else "")
    return f"listed ({shown})"


def check_env_servers(
    urls: Sequence[str | Sequence[str]],
    concurrency: int,
    env_names: Mapping[str | tuple[str, ...], str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> None:
    """Every ``http(s)://``/``ws(s)://`` URL in `urls` answers ``/health``, accepts
    ``$ENVSDK_TOKEN`` (if it asks for one), serves the env `env_names` names for it (if any;
    see `same_env`; a list is named by its tuple), and together they have `concurrency` free
    sessions (servers that do not report capacity, such as plain OpenEnv ones, are not counted).

    A list of base URLs (``--base-url A B C``), a pool name or a file of base URLs
    (``--replicas-file``) is a pool: its servers are checked the same way, but as the pool plays
    them: one that does not answer is left out (the pool skips it and tries it again later),
    said to `warn` in one line; none answering is refused (a replicas file left by a supervisor
    that was killed lists servers that are all gone). Entries of other kinds are left to the
    pool."""
    token = os.environ.get("ENVSDK_TOKEN")
    free_total, counted = 0, []
    checked: set[str] = set()
    for entry in urls:
        asked = (env_names or {}).get(entry if isinstance(entry, str) else tuple(entry))
        if not isinstance(entry, str):
            members = _pool_members(entry, _listed(list(entry)), "", warn)
        elif entry.startswith(("http://", "https://", "ws://", "wss://")):
            members = [(entry, _health(_http_base(entry)))]
            failed = members[0][1]
            if isinstance(failed, OSError):
                raise PreflightError(
                    f"no environment server answers at {_http_base(entry)} ({_reason(failed)}): start it (e.g. "
                    "`envsdk serve my_module:MyEnv --port 8000`, `python -m servers.sudoku --port 8000`) or fix "
                    "--base-url"
                )
        elif is_pool_spec(entry):
            what, listed = _pool_servers(entry)
            left = ("; a replicas file may be left from a supervisor that was stopped (`envsdk serve … "
                    f"--replicas N --replicas-file {entry}` writes it again)" if entry not in pools else "")
            members = _pool_members(listed, what, left, warn)
        else:
            continue
        for url, reply in members:
            base = _http_base(url)
            if isinstance(reply, OSError) or base in checked:
                continue
            checked.add(base)
            health_status, health = reply
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
