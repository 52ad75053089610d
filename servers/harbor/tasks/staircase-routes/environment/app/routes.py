"""Counts the ways to climb a staircase taking 1, 2 or 3 steps at a time without ever landing on
a broken step.

    python3 routes.py STAIRS_FILE

STAIRS_FILE holds "steps <N>" (the top is step N; the climb starts on the floor, step 0) and
"broken <k> <k> ..." (steps that cannot be landed on); it prints the number of ways.
"""

import sys

MOVES = (1, 2, 3)


def read_stairs(path: str) -> tuple[int, set[int]]:
    steps, broken = 0, set[int]()
    with open(path, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "steps":
                steps = int(words[1])
            elif words[0] == "broken":
                broken.update(int(w) for w in words[1:])
    return steps, broken


def ways(position: int, top: int, broken: set[int]) -> int:
    """The number of ways from `position` to exactly `top`."""
    if position == top:
        return 1
    if position > top or position in broken:
        return 0
    return sum(ways(position + move, top, broken) for move in MOVES)


def main() -> None:
    top, broken = read_stairs(sys.argv[1])
    print(ways(0, top, broken))


if __name__ == "__main__":
    main()
