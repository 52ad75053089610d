"""Checks /data/events.db against the rows expected from the shipped files and writes
/logs/verifier/reward.txt: the share of three checks passed (0 without a readable database):
  schema   table events with the five columns, their types, id as primary key
  ids      one row per valid event id, no more
  values   every row's ts, user, kind and amount_cents exactly as expected (exact SQL types)"""

import json
import sqlite3
from pathlib import Path

REWARD = Path("/logs/verifier/reward.txt")
EXPECTED = [tuple(row) for row in json.loads(Path("/tests/expected_rows.json").read_text())]
COLUMNS = [("id", "TEXT", 1), ("ts", "INTEGER", 0), ("user", "TEXT", 0), ("kind", "TEXT", 0),
           ("amount_cents", "INTEGER", 0)]


def main() -> None:
    path = Path("/data/events.db")
    if not path.is_file():
        print(f"no {path}")
        REWARD.write_text("0\n")
        return
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        info = db.execute("PRAGMA table_info(events)").fetchall()
        rows = db.execute(
            "SELECT id, ts, user, kind, amount_cents, typeof(ts), typeof(amount_cents) FROM events ORDER BY id"
        ).fetchall()
    except sqlite3.Error as exc:
        print(f"{path}: {exc}")
        REWARD.write_text("0\n")
        return
    columns = [(name, kind.upper(), pk) for _, name, kind, _, _, pk in info]
    checks = {"schema": columns == COLUMNS}
    checks["ids"] = [row[0] for row in rows] == [row[0] for row in EXPECTED]
    got = [tuple(row[:5]) for row in rows if row[5] == "integer" and row[6] in ("integer", "null")]
    checks["values"] = len(got) == len(rows) and got == EXPECTED
    for name, ok in checks.items():
        print(f"{name}: {'ok' if ok else 'FAILED'}")
    if not checks["schema"]:
        print(f"columns {columns}")
    if not checks["values"]:
        wrong = [(g, w) for g, w in zip(got, EXPECTED) if g != w][:3]
        print(f"first differences (got, wanted): {wrong}")
    REWARD.write_text(f"{sum(checks.values()) / len(checks):.4f}\n")


main()
