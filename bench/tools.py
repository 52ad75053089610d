"""Tool calls vs steps: steps/s of MCP ``tools/call`` and of ``step`` on one envsdk server.

One server (``python -m bench.servers envsdk-tools``: the echo env plus a tool ``echo(message)``
doing what its step does) and the trivial benchmark's load generator. Every session loops
``reset`` then three requests: either ``step`` frames, or ``{"type": "mcp"}`` frames carrying a
JSON-RPC ``tools/call`` of ``echo`` (what envsdk's ``EnvClient.call_tool`` sends). The two kinds
alternate ``--rounds`` times on the same server in one run, so the machine's noise hits both.

    python -m bench tools --sessions 256 --duration 3 --rounds 2 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.trivial import (
    STEP,
    STEPS_PER_RESET,
    LevelResult,
    default_procs,
    machine_line,
    raise_open_files_limit,
    run_level,
    start_server,
    stop_server,
    write_section,
)

CALL_TOOL = json.dumps(
    {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "hello"}}}}
)
FRAMES = {"step": STEP, "call_tool": CALL_TOOL}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of load per round and kind")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--procs", type=int, default=default_procs(), help="load-generator processes")
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for bench.servers (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="RESULTS.md to update")


def render(results: list[tuple[str, LevelResult]], args: argparse.Namespace, command: str) -> str:
    lines = [
        "## Tool calls vs steps (MCP tools/call on /ws vs step)",
        "",
        f"Command: `{command}`  ",
        machine_line() + " Absolute numbers move with the machine's load; the two kinds alternate on one "
        "server so the ratio is the figure to read.  ",
        f"{args.sessions} sessions, each looping reset + {STEPS_PER_RESET} requests for {args.duration:g} s per round; "
        "every request/reply counts.",
        "",
        "| round | kind | requests/s | p50 ms | p99 ms | errors | server CPU µs/request |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (kind, r) in enumerate(results):
        lines.append(
            f"| {i // 2 + 1} | {kind} | {r.steps_per_s:,.0f} | {r.pct(0.5):.2f} | {r.pct(0.99):.2f} | {r.errors} | {r.cpu_us_per_step:.0f} |"
        )
    total = {k: sum(r.steps for kk, r in results if kk == k) / max(sum(r.elapsed_s for kk, r in results if kk == k), 1e-9) for k in FRAMES}
    cpu = {k: sum(r.server_cpu_s for kk, r in results if kk == k) * 1e6 / max(sum(r.steps for kk, r in results if kk == k), 1) for k in FRAMES}
    lines += [
        "",
        f"call_tool / step requests/s: **{total['call_tool'] / max(total['step'], 1e-9):.2f}×**; "
        f"server CPU per request: {cpu['call_tool']:.0f} µs (call_tool) vs {cpu['step']:.0f} µs (step).",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, command: str) -> list[tuple[str, LevelResult]]:
    raise_open_files_limit()
    proc, url = start_server("envsdk-tools", args.sessions + 16, args.server_arg)
    results: list[tuple[str, LevelResult]] = []
    try:
        for _ in range(args.rounds):
            for kind, frame in FRAMES.items():
                res = run_level("envsdk-tools", url, args.sessions, args.duration, proc.pid, args.procs, frame)
                print(
                    f"{kind:9s} n={args.sessions} req/s={res.steps_per_s:9.0f} p50={res.pct(0.5):7.2f}ms "
                    f"p99={res.pct(0.99):8.2f}ms cpu/req={res.cpu_us_per_step:6.0f}us errors={res.errors} {res.first_error[:160]}",
                    flush=True,
                )
                results.append((kind, res))
                time.sleep(0.5)
    finally:
        stop_server(proc)
    report = render(results, args, command)
    print(report)
    if args.out:
        write_section(args.out, "## Tool calls vs steps", report)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run(args, "python -m bench tools " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
