"""Benchmarks: datasets, timing, end-to-end and kernel benches, reports."""
