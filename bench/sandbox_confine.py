"""``python -m bench.sandbox_confine``: what Landlock costs a plain-process sandbox.

Starts a sandbox and runs its first snippet (``print(1)``), then closes it, with the provider's
Landlock confinement on and off, alternated in one run so that both sides see the same machine;
prints p50 and p99 of each and their ratio. Needs a kernel with Landlock (else it says so).
"""

from __future__ import annotations

import argparse
import statistics
import time

from envsdk.sandbox.process import ProcessProvider, landlock_abi


def start_and_run(provider: ProcessProvider) -> float:
    """Seconds from `start` to the first snippet's answer (the close is not counted)."""
    started = time.perf_counter()
    sandbox = provider.start()
    try:
        result = sandbox.run_python("print(1)")
        elapsed = time.perf_counter() - started
        if result.stdout != b"1\n":
            raise RuntimeError(f"the snippet answered {result!r}")
        return elapsed
    finally:
        sandbox.close()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_confine", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="sandboxes started per side (default 20)")
    args = parser.parse_args(argv)
    if landlock_abi() < 1:
        raise SystemExit("this kernel has no Landlock: nothing to compare")
    sides = {"confined": ProcessProvider(), "unconfined": ProcessProvider()}
    sides["unconfined"].confined = False
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, provider in sides.items():
            times[name].append(start_and_run(provider))
    print(f"process sandbox start + first snippet, {args.rounds} rounds alternated, Landlock ABI {landlock_abi()}")
    for name, values in times.items():
        print(f"  {name:<11} p50 {1000 * statistics.median(values):7.1f} ms   p99 {1000 * quantile(values, 0.99):7.1f} ms")
    ratio = statistics.median(times["confined"]) / statistics.median(times["unconfined"])
    print(f"  confined / unconfined p50: {ratio:.2f}x")


if __name__ == "__main__":
    main()
