"""Run with: python3 -m unittest -v test_ledger  (from /app)."""

import unittest

from ledger import Ledger, parse_amount, split


class ParseAmount(unittest.TestCase):
    def test_plain(self) -> None:
        self.assertEqual(parse_amount("12"), 1200)

    def test_cents_are_exact(self) -> None:
        self.assertEqual(parse_amount("19.99"), 1999)

    def test_thousands_separator(self) -> None:
        self.assertEqual(parse_amount("1,234.50"), 123450)


class Split(unittest.TestCase):
    def test_shares_add_up(self) -> None:
        self.assertEqual(split(100, 3), [34, 33, 33])


class Balance(unittest.TestCase):
    def test_new_ledgers_start_empty(self) -> None:
        first = Ledger()
        first.add("2024-01-01", "salary", 250000)
        self.assertEqual(Ledger().balance(), 0)

    def test_until_is_inclusive(self) -> None:
        book = Ledger([("2024-01-01", "salary", 1000), ("2024-01-31", "rent", -400)])
        self.assertEqual(book.balance(until="2024-01-31"), 600)


if __name__ == "__main__":
    unittest.main()
