"""``python -m bench COMMAND``: envsdk's benchmarks, each bounded in time, on 127.0.0.1 only.

* ``trivial`` — envsdk (default path, INLINE_SYNC) vs OpenEnv vs bare websockets, trivial env,
  1 … 4,096 sessions.
* ``core`` — the execution core: default path vs OpenEnv vs bare at 256 and 1,024 sessions,
  32 hung calls among 255 stepping sessions, RSS under 8 MiB observations (`bench.core`).
* ``scale`` — N sessions on one `envsdk serve` from one client: open, reset, idle, step, RSS, SIGTERM (``--sessions 16384``).
* ``client`` — one process of envsdk ``EnvClient``s, 256 vs 2,048 sessions.
* ``tools`` — MCP tool calls vs steps, requests/s at 256 sessions on one server.
* ``handoff`` — CPU per call of each way to hand a sync env call to a thread, in-process.
* ``openenv-scaling`` — OpenEnv's published scaling harness (its study's client, reimplemented)
  against envsdk and OpenEnv in one run: sessions vs success % and latency (`bench.openenv_scaling`).
* ``sudoku`` — Sudoku games/s vs an OpenEnv-style server (`bench.sudoku_bench`; its own flags).
* ``all`` — trivial, scale and client with their defaults (about 8–10 minutes on 2 cores),
  each writing its section of ``--out`` (default bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import client_scale, core, handoff, openenv_scaling, scale, tools, trivial

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module in (
        ("trivial", trivial), ("scale", scale), ("client", client_scale), ("core", core), ("tools", tools), ("handoff", handoff),
        ("openenv-scaling", openenv_scaling),
    ):
        module.add_arguments(commands.add_parser(name, help=(module.__doc__ or "").splitlines()[0]))
    commands.add_parser("sudoku", help="Sudoku games/s (bench.sudoku_bench), remaining arguments passed on", add_help=False)
    everything = commands.add_parser("all", help="trivial, scale and client with their defaults")
    everything.add_argument("--out", type=Path, default=RESULTS)
    if argv and argv[0] == "sudoku":
        from bench import sudoku_bench

        sys.argv = ["bench.sudoku_bench", *argv[1:]]
        sudoku_bench.main()
        return
    args = parser.parse_args(argv)
    command = "python -m bench " + " ".join(argv)
    if args.command == "all":
        for name, module in (("trivial", trivial), ("scale", scale), ("client", client_scale)):
            sub = argparse.ArgumentParser()
            module.add_arguments(sub)
            sub_args = sub.parse_args(["--out", str(args.out)])
            module.run(sub_args, f"{command}  (part: python -m bench {name})")
        return
    modules = {
        "trivial": trivial, "scale": scale, "client": client_scale, "core": core, "tools": tools, "handoff": handoff,
        "openenv-scaling": openenv_scaling,
    }
    modules[args.command].run(args, command)


if __name__ == "__main__":
    main()
