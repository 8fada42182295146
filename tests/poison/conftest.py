"""Hypothesis profiles of the hostile-input property test: ``ci`` (the default: bounded, a few
minutes at most) and ``fuzz`` (``make fuzz``: ``GPULENS_FUZZ=1`` or ``HYPOTHESIS_PROFILE=fuzz``; its
size from ``GPULENS_FUZZ_EXAMPLES``). Failing examples are kept under ``.pytest_cache/hypothesis``
(ignored by git) and replayed first on the next run."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.conftest import REPO_ROOT

_DATABASE = DirectoryBasedExampleDatabase(str(REPO_ROOT / ".pytest_cache" / "hypothesis"))
_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

settings.register_profile("ci", max_examples=300, deadline=None, database=_DATABASE, suppress_health_check=_SLOW_DATA,
                          print_blob=True)
settings.register_profile("fuzz", max_examples=int(os.environ.get("GPULENS_FUZZ_EXAMPLES", "20000")), deadline=None,
                          database=_DATABASE, suppress_health_check=_SLOW_DATA, print_blob=True)
settings.load_profile("fuzz" if os.environ.get("GPULENS_FUZZ") == "1" else os.environ.get("HYPOTHESIS_PROFILE", "ci"))
