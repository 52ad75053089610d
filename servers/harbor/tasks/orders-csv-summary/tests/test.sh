#!/bin/bash
# Verifier of orders-csv-summary: grade.py compares /data/summary.json with the expected summary
# that travels with the tests; a fallback writes a zero reward.json should grading itself fail.
set -u
trap '[ -s /logs/verifier/reward.json ] || echo "{\"reward\": 0}" > /logs/verifier/reward.json' EXIT
timeout 20 python3 -I /tests/grade.py
