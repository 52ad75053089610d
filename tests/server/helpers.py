"""Helpers of the server tests: URLs, frames, bounded polling of /health."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx


def ws_url(base_url: str, query: str = "") -> str:
    return base_url.replace("http://", "ws://", 1) + "/ws" + (f"?{query}" if query else "")


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def wait_for_active(base_url: str, expected: int, timeout_s: float = 10.0) -> int:
    """Poll /health until active_sessions == expected (bounded); return the last value seen."""
    deadline = time.monotonic() + timeout_s
    active = -1
    while time.monotonic() < deadline:
        active = httpx.get(base_url + "/health").json()["active_sessions"]
        if active == expected:
            return active
        time.sleep(0.02)
    return active
