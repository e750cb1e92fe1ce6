"""Engines other than kvtier's own that load kvtier (``kvtier.integrations.vllm``).

Engines depend on kvtier, never the reverse: nothing outside this package imports it.
"""
