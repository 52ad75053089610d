"""Soak: many sessions opened and closed against ONE server, half of them abruptly.

``python -m bench.soak [--sessions 20000] [--workers 32] [--json out.json]``

Starts ``envsdk serve envsdk.testing:EchoEnvironment`` in a child process on a free loopback
port, then runs ``--sessions`` sessions from ``--workers`` concurrent loops. Each session
connects, resets, steps once, and ends in one of four ways, in turn:

* ``close``: the protocol's ``{"type":"close"}``;
* ``ws-close``: a plain WebSocket close;
* ``abort``: the TCP connection dropped after the reply (no close frame);
* ``abort-mid-step``: a step sent and the TCP connection dropped before its reply.

The last two are the abrupt half. Reported: the server's RSS at start, after half the
sessions and at the end; sessions per second; ``/health``'s ``active_sessions`` once the load
stops (must reach 0); the server's opened/closed session counters (must be equal). The run is
bounded: ``--timeout`` seconds in all. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from websockets.asyncio.client import connect

from envsdk.testing import free_port, stop_process

ENDINGS = ("close", "ws-close", "abort", "abort-mid-step")
RESET = json.dumps({"type": "reset", "data": {}})
STEP = json.dumps({"type": "step", "data": {"message": "soak"}})
CLOSE = json.dumps({"type": "close"})


async def one_session(ws_url: str, ending: str) -> None:
    ws = await connect(ws_url, compression=None)
    await ws.send(RESET)
    await ws.recv()
    await ws.send(STEP)
    if ending == "abort-mid-step":
        ws.transport.abort()
        return
    await ws.recv()
    if ending == "close":
        await ws.send(CLOSE)
        await ws.wait_closed()
    elif ending == "ws-close":
        await ws.close()
    else:
        ws.transport.abort()


async def load(ws_url: str, start: int, stop: int, workers: int) -> None:
    async def worker(w: int) -> None:
        for i in range(start + w, stop, workers):
            await one_session(ws_url, ENDINGS[i % len(ENDINGS)])

    await asyncio.gather(*(worker(w) for w in range(workers)))


def wait_health(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            httpx.get(base_url + "/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("the server did not start")


def active_after_load(base_url: str, timeout_s: float) -> int:
    """/health's active_sessions, polled until 0 or `timeout_s` (abrupt ends are noticed late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        active = int(httpx.get(base_url + "/health").json()["active_sessions"])
        if active == 0 or time.monotonic() > deadline:
            return active
        time.sleep(0.05)


def counter(metrics: str, name: str) -> int:
    match = re.search(rf"^{name} (\d+)", metrics, re.MULTILINE)
    return int(match.group(1)) if match else -1


def run(sessions: int, workers: int, timeout_s: float) -> dict[str, Any]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "ENVSDK_TOKEN")}
    env.update({"ENVSDK_WEB": "0", "MAX_CONCURRENT_ENVS": str(max(256, 4 * workers))})
    proc = subprocess.Popen(
        [sys.executable, "-m", "envsdk.cli", "serve", "envsdk.testing:EchoEnvironment",
         "--port", str(port), "--log-level", "warning"],
        env=env,
    )
    try:
        wait_health(base_url, proc, 30)
        server = psutil.Process(proc.pid)
        ws_url = f"ws://127.0.0.1:{port}/ws"
        mib = 1024 * 1024
        rss = {"start": server.memory_info().rss / mib}
        half = sessions // 2
        started = time.monotonic()

        async def both_halves() -> None:
            await load(ws_url, 0, half, workers)
            rss["half"] = server.memory_info().rss / mib
            await load(ws_url, half, sessions, workers)

        asyncio.run(asyncio.wait_for(both_halves(), timeout_s))
        elapsed = time.monotonic() - started
        active = active_after_load(base_url, 15)
        rss["end"] = server.memory_info().rss / mib
        metrics = httpx.get(base_url + "/metrics").text
        return {
            "sessions": sessions,
            "workers": workers,
            "seconds": round(elapsed, 1),
            "sessions_per_s": round(sessions / elapsed),
            "rss_mib": {k: round(v, 1) for k, v in rss.items()},
            "rss_growth_mib": round(rss["end"] - rss["start"], 1),
            "active_sessions_after": active,
            "opened": counter(metrics, "envsdk_sessions_opened_total"),
            "closed": counter(metrics, "envsdk_sessions_closed_total"),
        }
    finally:
        stop_process(proc, 15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=32, help="concurrent client loops")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole load, seconds")
    parser.add_argument("--max-growth-mib", type=float, default=64.0, help="RSS growth that fails the run")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    result = run(args.sessions, args.workers, args.timeout)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = (
        result["active_sessions_after"] == 0
        and result["opened"] == result["closed"] == args.sessions
        and result["rss_growth_mib"] <= args.max_growth_mib
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
