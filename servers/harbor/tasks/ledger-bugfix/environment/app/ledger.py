"""A tiny household ledger: amounts are kept as integer cents."""

from __future__ import annotations

import re

_NO_ENTRIES: list[tuple[str, str, int]] = []


def parse_amount(text: str) -> int:
    """Parse a money amount such as "12", "-3.5", "1,234.50" or "€19.99" into integer cents."""
    cleaned = text.strip().lstrip("€$")
    return int(float(cleaned) * 100)


def split(total_cents: int, parts: int) -> list[int]:
    """Split an amount into `parts` shares that differ by at most one cent and add up to the
    amount; the larger shares come first (split(100, 3) == [34, 33, 33])."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    share = total_cents // parts
    return [share] * parts


class Ledger:
    """Dated entries (ISO dates, "YYYY-MM-DD") with a running balance."""

    def __init__(self, entries: list[tuple[str, str, int]] | None = None) -> None:
        self.entries = entries or _NO_ENTRIES

    def add(self, date: str, label: str, cents: int) -> None:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ValueError(f"not an ISO date: {date!r}")
        self.entries.append((date, label, cents))

    def balance(self, until: str | None = None) -> int:
        """The sum of all entries, or of those dated on or before `until` when given."""
        return sum(cents for date, _, cents in self.entries if until is None or date < until)
