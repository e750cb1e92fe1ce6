"""``kvtier soak``: the reference engine under random faults, every token checked.

Runs in the ``kvtier soak`` process, which controls everything else as children: its
own ``redis-server``, two engine processes sharing it (each with a CPU and a disk
tier), and the faults. A reference engine without offloading, in the soak process,
computes every answer first; each token an engine returns is compared with it.

| module | holds |
| --- | --- |
| ``redis_proc`` | the soak's ``redis-server`` (kill, stop, continue, restart) |
| ``child`` | the engine process (``python -m kvtier.soak.child``): JSON lines in and out |
| ``engines`` | the soak's side of an engine process: start, ask, SIGKILL |
| ``disk`` | the disk area (a tmpfs when root), filling it, damaging and checking block files |
| ``workload`` | seeded conversations, answered by the reference engine |
| ``runner`` | the loop: faults, requests, comparisons, figures |
| ``cli`` | ``kvtier soak`` |

See ``docs/soak.md``.
"""
