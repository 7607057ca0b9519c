"""Benchmarks of the real train step and of the input pipeline (JSON out)."""
