"""Suite-wide settings: Hypothesis profiles.

No test asserts on time (STYLE.md), and Hypothesis' default ``deadline`` of 200 ms per
example is one: a loaded 2-core machine, or one full garbage collection of the heap that
torch and transformers fill (0.4 s here), fails whichever example it lands in (and a
state machine's example is all of its steps). A hang still fails, at the per-test
timeout. For the same reason the ``too_slow`` health check (data generation timed
against the clock) is off. Every profile below has both.

``HYPOTHESIS_PROFILE`` picks the profile:

* ``dev`` (unset, outside CI): a fresh random draw each run, failures kept in
  ``.hypothesis/`` and replayed first: the search goes on with every run.
* ``ci`` (unset with ``CI`` set, and ``.ci/run``): derandomized, each test's examples
  fixed by its name, no example database. A CI run fails for a change in the code, never
  for the luck of a draw; the random search is the ``dev`` runs' job.
* ``mutation`` (``scripts/mutate.sh``): a tenth of the examples, so that each of a
  thousand mutants is checked in seconds.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

settings.register_profile("dev", UNTIMED)
settings.register_profile("ci", UNTIMED, derandomize=True, database=None, print_blob=True)
settings.register_profile("mutation", UNTIMED, max_examples=10)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
