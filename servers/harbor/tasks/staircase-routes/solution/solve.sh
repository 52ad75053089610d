#!/bin/bash
# Oracle: replace the exponential recursion by a count from the bottom up (one pass over the
# steps), then run the fast script for the answer.
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path

path = Path("/app/routes.py")
source = path.read_text()
start = source.index("def ways(")
end = source.index("def main(")
fast = '''def ways(position: int, top: int, broken: set[int]) -> int:
    """The number of ways from `position` to exactly `top`."""
    if position > top or (position in broken and position != top):
        return 0
    counts = [0] * (top + 1)
    counts[position] = 1
    for step in range(position + 1, top + 1):
        if step not in broken:
            counts[step] = sum(counts[step - move] for move in MOVES if step - move >= position)
    return counts[top]


'''
path.write_text(source[:start] + fast + source[end:])
PY
python3 /app/routes.py /app/stairs.txt > /app/answer.txt
