"""The three servers benchmarked side by side, each serving the same trivial echo environment.

* ``envsdk``: envsdk's ``create_app`` with ``envsdk.testing.EchoEnvironment``, a plain sync
  env as the README shows one: the default path (each session's calls on its lane thread).
* ``envsdk-inline``: the same with ``inline_sync=True`` (calls on the event loop).
* ``envsdk-awaited``: the default path with ``lane_wait_s=0``: the loop never waits for a lane's
  call (the hand-off of the execution core before waited hand-offs).
* ``envsdk-tools``: ``envsdk`` with one tool (``echo``), for comparing tool calls with steps.
* ``openenv``: openenv's own ``create_app`` with an echo environment written against openenv's
  base classes, reproducing what a user of OpenEnv runs.
* ``bare``: a bare asyncio ``websockets`` server speaking the same frames, with no framework:
  the ceiling for this machine.
* ``envsdk-wait`` / ``openenv-wait``: envsdk (default path) and OpenEnv's ``create_app`` serving
  the environment of OpenEnv's scaling study, whose step sleeps (`bench.openenv_scaling_apps`).

Run one: ``python -m bench.servers KIND --port P --max-sessions N`` (binds 127.0.0.1 only).
``--loop asyncio|uvloop`` picks every server's event loop (the bare server's too); left out,
each server keeps its own default: uvicorn's ``auto`` (uvloop when it is installed) for the
uvicorn servers, asyncio's for the bare one. For OpenEnv it also picks the HTTP parser, as
installing ``uvicorn[standard]`` does: h11 with asyncio, httptools with uvloop (envsdk's `serve`
keeps its own h11 protocol, which bounds how long a request head may take, either way). The
uvicorn servers take ``--ws``, ``--http`` and ``--deflate`` to compare uvicorn's settings; the
defaults are what `envsdk.server.serve` uses (for envsdk) and uvicorn's (for OpenEnv).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
from typing import Any

KINDS = ("envsdk", "envsdk-inline", "openenv", "bare", "envsdk-tools", "envsdk-awaited", "envsdk-wait", "openenv-wait")
LOOPS = ("asyncio", "uvloop")


def envsdk_app(max_sessions: int, inline_sync: bool | None = None, lane_wait_s: float | None = None) -> Any:
    """envsdk serving the echo env: by default on the path every sync env gets (lanes);
    ``inline_sync=True`` runs its calls on the loop, as the bare server does."""
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    extra: dict[str, Any] = {} if lane_wait_s is None else {"lane_wait_s": lane_wait_s}
    return create_app(
        EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=max_sessions, inline_sync=inline_sync,
        web=False, **extra,
    )


def envsdk_tools_app(max_sessions: int, inline_sync: bool | None = None) -> Any:
    """envsdk serving the echo env with one tool, ``echo(message)``, that does what its step
    does (on the default path, like ``envsdk``)."""
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation
    from envsdk.tools import tool

    class EchoToolEnvironment(EchoEnvironment):
        @tool
        def echo(self, message: str) -> str:
            """Echo the message back."""
            self._state.step_count += 1
            return message

    return create_app(
        EchoToolEnvironment, EchoAction, EchoObservation, max_concurrent_envs=max_sessions, inline_sync=inline_sync, web=False
    )


def openenv_app(max_sessions: int) -> Any:
    from envsdk.testing.openenv_echo import make_openenv_app

    return make_openenv_app(max_concurrent_envs=max_sessions)


async def serve_bare(port: int, max_sessions: int) -> None:
    from websockets.asyncio.server import serve

    active = 0

    async def handler(ws: Any) -> None:
        nonlocal active
        if active >= max_sessions:
            await ws.send(json.dumps({"type": "error", "data": {"message": "capacity", "code": "CAPACITY_REACHED"}}))
            return
        active += 1
        step_count = 0
        try:
            async for raw in ws:
                msg = json.loads(raw)
                kind = msg.get("type")
                if kind == "reset":
                    step_count = 0
                    reply = {"observation": {"metadata": {}, "echoed_message": "ready", "message_length": 0}, "reward": 0.0, "done": False}
                    await ws.send(json.dumps({"type": "observation", "data": reply}))
                elif kind == "step":
                    step_count += 1
                    text = msg["data"]["message"]
                    meta = {"step": step_count}
                    reply = {
                        "observation": {"metadata": meta, "echoed_message": text, "message_length": len(text)},
                        "reward": len(text) / 10.0,
                        "done": False,
                        "metadata": meta,
                    }
                    await ws.send(json.dumps({"type": "observation", "data": reply}))
                elif kind == "close":
                    return
        except Exception:
            return
        finally:
            active -= 1

    async with serve(handler, "127.0.0.1", port, max_size=16 * 2**20, ping_interval=None, backlog=4096):
        await asyncio.Future()


def run_bare(port: int, max_sessions: int, loop: str | None) -> None:
    """Serve the bare server until killed, on asyncio's loop or (``loop="uvloop"``) uvloop's."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(serve_bare(port, max_sessions))
    else:
        asyncio.run(serve_bare(port, max_sessions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, default=8192)
    parser.add_argument("--ws", default=None, help="uvicorn ws implementation (default: envsdk.server.serve's)")
    parser.add_argument("--http", default=None, help="uvicorn http implementation")
    parser.add_argument("--loop", default=None, choices=LOOPS, help="event loop (default: each server's own)")
    parser.add_argument("--deflate", action=argparse.BooleanOptionalAction, default=None, help="permessage-deflate")
    args = parser.parse_args()
    # Thousands of sessions need thousands of descriptors.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.kind == "bare":
        run_bare(args.port, args.max_sessions, args.loop)
        return
    settings: dict[str, Any] = {"log_level": "error"}
    if not args.kind.endswith("-wait"):
        # The throughput benchmarks take keepalive pings and the listen backlog out of the
        # picture; the scaling study's servers run as their users run them.
        settings.update(backlog=4096, ws_ping_interval=None)
    for key in ("ws", "http", "loop"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.deflate is not None:
        settings["ws_per_message_deflate"] = args.deflate
    if args.kind.startswith("openenv") and args.loop is not None and args.http is None:
        settings["http"] = "httptools" if args.loop == "uvloop" else "h11"
    if args.kind == "envsdk-tools":
        from envsdk.server import serve

        serve(envsdk_tools_app(args.max_sessions), "127.0.0.1", args.port, **settings)
        return
    if args.kind == "envsdk-wait":
        from bench.openenv_scaling_apps import envsdk_app as wait_app
        from envsdk.server import serve

        serve(wait_app(args.max_sessions), "127.0.0.1", args.port, **settings)
        return
    if args.kind.startswith("envsdk"):
        from envsdk.server import serve

        inline = True if args.kind == "envsdk-inline" else None
        wait = 0.0 if args.kind == "envsdk-awaited" else None
        serve(envsdk_app(args.max_sessions, inline, wait), "127.0.0.1", args.port, **settings)
        return
    import uvicorn

    if args.kind == "openenv-wait":
        from bench.openenv_scaling_apps import openenv_app as openenv_wait_app

        uvicorn.run(openenv_wait_app(args.max_sessions), host="127.0.0.1", port=args.port, **settings)
        return
    uvicorn.run(openenv_app(args.max_sessions), host="127.0.0.1", port=args.port, **settings)


if __name__ == "__main__":
    main()
