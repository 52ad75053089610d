"""Scores /data/summary.json against expected.json (computed from the shipped export) and writes
/logs/verifier/reward.json with named parts and their mean as reward:
  customers     the same customers, each with the right number of counted orders
  totals        each customer's total within a cent or two
  ordering      customers listed by total, highest first
  countries     the same countries with the right totals
  grand_total   the overall total
A missing or unreadable summary, or one reached through a link, scores 0 in every part."""

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

TOLERANCE = 0.02
SUMMARY = "/data/summary.json"
EXPECTED = json.loads(Path("/tests/expected.json").read_text(encoding="utf-8"))


def number(value: Any) -> float | None:
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return None


def close(value: Any, wanted: float) -> bool:
    got = number(value)
    return got is not None and abs(got - wanted) <= TOLERANCE


def grade(summary: Any) -> dict[str, float]:
    parts = dict.fromkeys(("customers", "totals", "ordering", "countries", "grand_total"), 0.0)
    if type(summary) is not dict:
        return parts
    rows = summary.get("customers")
    wanted_rows = EXPECTED["customers"]
    if type(rows) is list and all(type(r) is dict and type(r.get("customer")) is str for r in rows):
        got = {r["customer"]: r for r in rows}
        wanted = {r["customer"]: r for r in wanted_rows}
        if len(got) == len(rows) and got.keys() == wanted.keys():
            if all(type(got[n].get("orders")) is int and got[n]["orders"] == wanted[n]["orders"] for n in wanted):
                parts["customers"] = 1.0
            if all(close(got[n].get("total_eur"), wanted[n]["total_eur"]) for n in wanted):
                parts["totals"] = 1.0
            if [r["customer"] for r in rows] == [r["customer"] for r in wanted_rows]:
                parts["ordering"] = 1.0
    countries = summary.get("countries")
    if (type(countries) is dict and countries.keys() == EXPECTED["countries"].keys()
            and all(close(countries[c], total) for c, total in EXPECTED["countries"].items())):
        parts["countries"] = 1.0
    if close(summary.get("grand_total_eur"), EXPECTED["grand_total_eur"]):
        parts["grand_total"] = 1.0
    return parts


def read_summary() -> Any:
    """The agent's summary, from a plain file at that very path: a link (or a folder on the way
    that is one) could lead to what these tests bring, such as expected.json itself."""
    if os.path.realpath(SUMMARY) != SUMMARY:
        raise OSError("a link, or reached through one")
    fd = os.open(SUMMARY, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a plain file")
        return json.loads(file.read(1 << 20).decode("utf-8"))


def main() -> None:
    try:
        summary = read_summary()
    except (OSError, ValueError) as exc:
        print(f"{SUMMARY}: {exc}")
        summary = None
    parts = grade(summary)
    print(parts)
    reward = {"reward": round(sum(parts.values()) / len(parts), 4), **parts}
    Path("/logs/verifier/reward.json").write_text(json.dumps(reward) + "\n")


main()
