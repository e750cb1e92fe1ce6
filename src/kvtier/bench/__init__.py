"""Benchmarks behind ``kvtier bench ...``. Benchmarks measure; tests never time."""
