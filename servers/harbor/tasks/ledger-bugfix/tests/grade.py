"""Compares probe.py's results (the JSON line given on stdin) with the expected values and
writes /logs/verifier/reward.json: one part per fixed behaviour, and their mean as reward."""

import json
import sys
from pathlib import Path
from typing import Any

EXPECTED: dict[str, dict[str, Any]] = {
    "parse": {"parse": [1200, 1999, 29, 123450, 100000001, -350, 700, 10, 435]},
    "split": {
        "split": [[34, 33, 33], [3, 3, 2, 2], [1, 1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0],
                  [-33, -33, -34], [143, 143, 143, 143, 143, 143, 143]],
        "split_zero": {"error": "ValueError"},
    },
    "isolation": {"isolation": [250000, -350, 0]},
    "balance_until": {"balance": [65750, 155750, 245750, 0, 65750]},
}


def main() -> None:
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    try:
        results = json.loads(lines[-1]) if lines else {}
    except ValueError:
        results = {}
    if not isinstance(results, dict):
        results = {}
    parts: dict[str, float] = {}
    for part, wanted in EXPECTED.items():
        ok = all(results.get(key) == value for key, value in wanted.items())
        parts[part] = 1.0 if ok else 0.0
        if not ok:
            print(f"{part}: wanted {wanted}, got { {key: results.get(key) for key in wanted} }")
    reward = {"reward": round(sum(parts.values()) / len(parts), 4), **parts}
    Path("/logs/verifier/reward.json").write_text(json.dumps(reward) + "\n")


main()
