#!/bin/bash
# Verifier of staircase-routes: /app/answer.txt must hold the count for /app/stairs.txt as shipped
# (the expected number is written here), and the agent's /app/routes.py, run as uid/gid 65534
# (nobody, named by number: the agent may have renamed accounts) on a 200-step staircase it has
# never seen, must print that count within the time the instruction allows (with margin for a
# slow machine). Both must hold for reward 1.
set -u
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT

answer=$(tr -d '[:space:]' 2>/dev/null < /app/answer.txt)
if [ "$answer" != 151408587 ]; then
    echo "answer.txt holds '${answer:0:40}', not the count for stairs.txt"
    exit 0
fi

chmod 700 /tests
work=$(mktemp -d)
cp /tests/long_stairs.txt "$work/stairs.txt"
chmod 755 "$work"
chmod 644 "$work/stairs.txt"
printed=$(cd "$work" && timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -i PATH=/usr/local/bin:/usr/bin:/bin python3 /app/routes.py "$work/stairs.txt" 2>/dev/null | tr -d '[:space:]')
if [ "$printed" == 26434408837169283483836985171813069328895523840 ]; then
    reward=1
else
    echo "routes.py on a 200-step staircase printed '${printed:0:60}' (or ran out of time)"
fi
