"""The three servers benchmarked side by side, each serving the same trivial echo environment.

* ``envsdk``: envsdk's ``create_app`` with ``envsdk.testing.EchoEnvironment``, a plain sync
  env as the README shows one: the default path (each session's calls on its lane thread).
* ``envsdk-inline``: the same with ``inline_sync=True`` (calls on the event loop).
* ``openenv``: openenv's own ``create_app`` with an echo environment written against openenv's
  base classes, reproducing what a user of OpenEnv runs.
* ``bare``: a bare asyncio ``websockets`` server speaking the same frames, with no framework:
  the ceiling for this machine.

Run one: ``python -m bench.servers KIND --port P --max-sessions N`` (binds 127.0.0.1 only).
The uvicorn servers take ``--ws``, ``--http``, ``--loop`` and ``--deflate`` to compare uvicorn's
settings; the defaults are what `envsdk.server.serve` uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
from typing import Any

KINDS = ("envsdk", "envsdk-inline", "openenv", "bare")


def envsdk_app(max_sessions: int, inline_sync: bool | None = None) -> Any:
    """envsdk serving the echo env: by default on the path every sync env gets (lanes);
    ``inline_sync=True`` runs its calls on the loop, as the bare server does."""
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    return create_app(
        EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=max_sessions, inline_sync=inline_sync, web=False
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, default=8192)
    parser.add_argument("--ws", default=None, help="uvicorn ws implementation (default: envsdk.server.serve's)")
    parser.add_argument("--http", default=None, help="uvicorn http implementation")
    parser.add_argument("--loop", default=None, help="uvicorn event loop: auto, asyncio, uvloop")
    parser.add_argument("--deflate", action=argparse.BooleanOptionalAction, default=None, help="permessage-deflate")
    args = parser.parse_args()
    # Thousands of sessions need thousands of descriptors.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.kind == "bare":
        asyncio.run(serve_bare(args.port, args.max_sessions))
        return
    settings: dict[str, Any] = {"log_level": "error", "backlog": 4096, "ws_ping_interval": None}
    for key in ("ws", "http", "loop"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.deflate is not None:
        settings["ws_per_message_deflate"] = args.deflate
    if args.kind.startswith("envsdk"):
        from envsdk.server import serve

        inline = True if args.kind == "envsdk-inline" else None
        serve(envsdk_app(args.max_sessions, inline), "127.0.0.1", args.port, **settings)
        return
    import uvicorn

    uvicorn.run(openenv_app(args.max_sessions), host="127.0.0.1", port=args.port, **settings)


if __name__ == "__main__":
    main()
