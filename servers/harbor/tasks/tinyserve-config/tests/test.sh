#!/bin/bash
# Verifier of tinyserve-config: starts the tests' own copy of tinyserve (the same code as
# /opt/tinyserve, so only the agent's configuration is under test) with
# /etc/tinyserve/tinyserve.ini, queries it with check.py, and stops it again. Its log goes to a
# new file (mktemp): a fixed name in /tmp could be one the agent planted (a link, say).
set -u
trap '[ -s /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt; [ -n "${server:-}" ] && kill "$server" 2>/dev/null' EXIT

log=$(mktemp)
python3 -I /tests/tinyserve.py --config /etc/tinyserve/tinyserve.ini > "$log" 2>&1 &
server=$!
timeout 40 python3 -I /tests/check.py "$server"
tail -n 5 "$log"
