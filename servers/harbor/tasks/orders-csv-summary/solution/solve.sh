#!/bin/bash
# Oracle: csv.DictReader over the file opened as utf-8-sig (drops the byte order mark), the last
# row per order id, Decimal sums, rounding at the end.
set -euo pipefail
python3 - <<'PY'
import csv
import json
from decimal import Decimal

with open("/data/rates.json", encoding="utf-8") as f:
    rates = {k: Decimal(str(v)) for k, v in json.load(f)["eur_per_unit"].items()}
last = {}
with open("/data/orders.csv", encoding="utf-8-sig", newline="") as f:
    for row in csv.DictReader(f):
        last[row["order_id"].strip()] = row
customers, countries = {}, {}
for row in last.values():
    if row["status"].strip().lower() not in ("paid", "shipped"):
        continue
    eur = int(row["quantity"]) * Decimal(row["unit_price"].replace(",", "")) * rates[row["currency"].strip()]
    entry = customers.setdefault(row["customer"].strip(), [0, Decimal(0)])
    entry[0] += 1
    entry[1] += eur
    country = row["country"].strip()
    countries[country] = countries.get(country, Decimal(0)) + eur
ranked = sorted(customers.items(), key=lambda kv: (-kv[1][1], kv[0]))
summary = {
    "customers": [{"customer": name, "orders": n, "total_eur": float(round(total, 2))}
                  for name, (n, total) in ranked],
    "countries": {code: float(round(total, 2)) for code, total in sorted(countries.items())},
    "grand_total_eur": float(round(sum(total for _, total in customers.values()), 2)),
}
with open("/data/summary.json", "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2, ensure_ascii=False)
PY
