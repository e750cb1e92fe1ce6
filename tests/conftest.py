"""Suite-wide settings: Hypothesis profiles.

``HYPOTHESIS_PROFILE=mutation`` (set by ``scripts/mutate.sh``) runs every property test
with a tenth of its examples, so that each of a thousand mutants is checked in seconds;
the normal run uses Hypothesis' defaults and each test's own ``max_examples``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("mutation", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
