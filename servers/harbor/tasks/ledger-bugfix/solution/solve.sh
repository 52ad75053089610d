#!/bin/bash
# Oracle: Decimal arithmetic (and no thousands separators) in parse_amount, the remainder spread
# over the first shares in split, a fresh list per Ledger (not one shared empty list), and an
# inclusive `until`.
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path

path = Path("/app/ledger.py")
source = path.read_text()
fixes = [
    ("import re\n", "import re\nfrom decimal import Decimal\n"),
    ('    cleaned = text.strip().lstrip("€$")\n    return int(float(cleaned) * 100)\n',
     '    cleaned = text.strip().lstrip("€$").replace(",", "")\n'
     '    return int((Decimal(cleaned) * 100).to_integral_value())\n'),
    ("    share = total_cents // parts\n    return [share] * parts\n",
     "    share, rest = divmod(total_cents, parts)\n"
     "    return [share + 1] * rest + [share] * (parts - rest)\n"),
    ("        self.entries = entries or _NO_ENTRIES\n",
     "        self.entries = list(entries) if entries is not None else []\n"),
    ("date < until)", "date <= until)"),
]
for old, new in fixes:
    assert source.count(old) == 1, old
    source = source.replace(old, new)
path.write_text(source)
PY
python3 -m unittest -q test_ledger
