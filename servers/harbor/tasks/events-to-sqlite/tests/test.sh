#!/bin/bash
# Verifier of events-to-sqlite: check_db.py reads /data/events.db (read-only) and compares it with
# the expected rows that travel with the tests; a fallback writes 0 should it fail.
set -u
trap '[ -s /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt' EXIT
timeout 20 python3 -I /tests/check_db.py
