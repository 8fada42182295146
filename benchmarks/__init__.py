"""Benchmarks: figures printed, never asserted. Run all with ``make bench`` (``python -m benchmarks``)."""
