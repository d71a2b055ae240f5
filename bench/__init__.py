"""Benchmarks, each run as `python -m bench.NAME`; BENCHMARKS.md says how and what they gave."""
