"""kvtier: tiered KV-cache offloading for LLM inference.

Layout (the README's "Layout"; ``docs/connector.md`` for the two sides):

* ``kvtier.scheduler`` -- pure Python, no torch: block keys in, decisions out
  (manager, eviction policies, tiering, background discovery in shared tiers).
* ``kvtier.connector`` -- the connector's scheduler half (pure Python) and worker
  half (torch), and nothing between them but ``kvtier.jobs`` and
  ``kvtier.load_store_specs`` values.
* ``kvtier.worker`` and ``kvtier.media`` -- torch and I/O: the bytes.
* ``kvtier.engine`` -- the reference engine over Hugging Face transformers.
* ``kvtier.sim`` and ``kvtier.bench`` -- trace replay and benchmarks.
"""

__version__ = "0.1.0"
