#!/bin/bash
# Each file is a part; the reward is their mean. WEIGHT comes from task.toml's [verifier] env.
a=0; b=0
[ -f /app/a.txt ] && a=1
[ -f /app/b.txt ] && b=1
printf '{"a": %d, "b": %d, "weight": %s, "reward": %s, "note": "parts"}\n' "$a" "$b" "$WEIGHT" "$(( (a + b) * 5 ))e-1" > /logs/verifier/reward.json
