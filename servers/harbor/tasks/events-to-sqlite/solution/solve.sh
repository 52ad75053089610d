#!/bin/bash
# Oracle: parse every line defensively, keep the highest rev per id, convert times with
# datetime.fromisoformat and amounts with Decimal, then write the table in one transaction.
set -euo pipefail
rm -f /data/events.db
python3 - <<'PY'
import datetime
import glob
import json
import sqlite3
from decimal import Decimal

best = {}
for path in sorted(glob.glob("/data/events/*.jsonl")):
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or not all(k in event for k in ("id", "rev", "ts", "user", "kind")):
                continue
            if event["id"] not in best or event["rev"] > best[event["id"]]["rev"]:
                best[event["id"]] = event

rows = []
for event in best.values():
    ts = int(datetime.datetime.fromisoformat(event["ts"]).timestamp())
    amount = event.get("amount")
    cents = None if amount is None else int((Decimal(str(amount)) * 100).to_integral_value())
    rows.append((event["id"], ts, event["user"], event["kind"], cents))

db = sqlite3.connect("/data/events.db")
with db:
    db.execute("""CREATE TABLE events (
        id TEXT PRIMARY KEY,
        ts INTEGER NOT NULL,
        user TEXT NOT NULL,
        kind TEXT NOT NULL,
        amount_cents INTEGER)""")
    db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows)
db.close()
PY
