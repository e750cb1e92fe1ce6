"""``kvtier run``, the main job: a multi-turn chat workload with and without offloading.

Runs in its own process. Modules, one concept each: ``workload`` (the seeded chat plan
and the histories), ``configs`` (the offloading configurations, each a dict), ``job``
(one engine per configuration, side by side, turn by turn; the outputs check),
``report`` (TTFT statistics, speedups, hit ratios, JSON), ``plot`` (the PNG), ``cli``
(the command). See ``docs/run.md``.
"""
