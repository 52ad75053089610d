"""Benchmark harness: servers and load generators measured side by side in one run."""
