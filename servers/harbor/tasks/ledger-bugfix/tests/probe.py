"""Calls the agent's /app/ledger.py on the graded cases and prints the results as one JSON line.

Runs as an unprivileged user in its own process: it hands back plain data only (exact ints, lists
of exact ints, or the name of what came back instead), so nothing the module returns can pretend
to be equal to an expected value; the comparison happens in grade.py.
"""

import json
import sys
from typing import Any

CASES_PARSE = ["12", "19.99", "0.29", "1,234.50", "€1,000,000.01", "-3.5", " 7 ", "$0.10", "4.35"]
CASES_SPLIT = [(100, 3), (10, 4), (5, 5), (2, 4), (0, 3), (-100, 3), (1001, 7)]


def plain(value: Any) -> Any:
    if type(value) is int:
        return value
    if type(value) is list and all(type(item) is int for item in value):
        return list(value)
    return {"type": type(value).__name__}


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return plain(fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - any failure of the module is a result here
        return {"error": type(exc).__name__}


def isolation(ledger: Any) -> Any:
    first = ledger.Ledger()
    first.add("2024-02-01", "salary", 250000)
    second = ledger.Ledger()
    second.add("2024-02-02", "coffee", -350)
    return [first.balance(), second.balance(), ledger.Ledger().balance()]


def balances(ledger: Any) -> Any:
    book = ledger.Ledger([("2024-01-31", "rent", -90000), ("2024-01-01", "salary", 250000)])
    book.add("2024-02-01", "rent", -90000)
    book.add("2024-01-15", "books", -4250)
    return [book.balance(), book.balance(until="2024-01-31"), book.balance(until="2024-01-15"),
            book.balance(until="2023-12-31"), book.balance(until="2024-02-01")]


def main() -> None:
    sys.path.insert(0, "/app")
    results: dict[str, Any] = {}
    try:
        import ledger  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"import": {"error": type(exc).__name__}}))
        return
    results["parse"] = [call(ledger.parse_amount, text) for text in CASES_PARSE]
    results["split"] = [call(ledger.split, total, parts) for total, parts in CASES_SPLIT]
    results["split_zero"] = call(ledger.split, 7, 0)
    results["isolation"] = call(isolation, ledger)
    results["balance"] = call(balances, ledger)
    sys.stdout.write("\n" + json.dumps(results) + "\n")


main()
