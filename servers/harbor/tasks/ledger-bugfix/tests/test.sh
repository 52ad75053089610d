#!/bin/bash
# Verifier of ledger-bugfix: probe.py runs the agent's module as uid/gid 65534 (nobody, named by
# number: the agent may have renamed accounts; a copy of the probe is the only test file it can
# read), grade.py (as root, isolated mode) scores its output.
# A fallback writes a zero reward.json should grading itself fail.
set -u
trap '[ -s /logs/verifier/reward.json ] || echo "{\"reward\": 0}" > /logs/verifier/reward.json' EXIT

chmod 700 /tests
probe_dir=$(mktemp -d)
cp /tests/probe.py "$probe_dir/probe.py"
chmod 755 "$probe_dir"
chmod 644 "$probe_dir/probe.py"
cd "$probe_dir"
timeout 20 setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp python3 -I "$probe_dir/probe.py" 2> "$probe_dir/stderr" \
    | tail -c 100000 | timeout 20 python3 -I /tests/grade.py
tail -n 5 "$probe_dir/stderr"
