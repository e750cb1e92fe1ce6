"""kvtier: tiered KV-cache offloading for LLM inference.

Layout (see ``docs/architecture.md``):

* ``kvtier.scheduler`` -- pure Python, no torch: block keys in, decisions out
  (manager, eviction policies, tiering, connector logic).
* ``kvtier.worker`` and ``kvtier.media`` -- torch and I/O: the bytes.
* ``kvtier.engine`` -- the reference engine over Hugging Face transformers.
* ``kvtier.sim`` and ``kvtier.bench`` -- trace replay and benchmarks.
"""

__version__ = "0.1.0"
