"""The echo env served as ``envsdk serve envsdk.testing:EchoEnvironment`` serves it, but on
uvloop (`serve`'s ``loop="uvloop"``: asyncio is the default): for the tests that hold a
server's reads to their bounds on both event loops (uvloop ignores asyncio's read size)."""

from __future__ import annotations

import argparse

from envsdk.server import create_app, serve
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    serve(app, port=args.port, log_level=args.log_level, loop="uvloop")


if __name__ == "__main__":
    main()
