"""Benchmarks behind ``kvtier bench ...``; each module exposes ``add_arguments``/``main``."""
