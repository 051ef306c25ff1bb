import os
import signal

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def sigint_handler_kept():
    """Every test leaves Ctrl-C's handler as it found it: an ignored SIGINT outlives the test in
    this worker and is inherited by every process a later test starts (a sweep deaf to Ctrl-C,
    whose Ctrl-C test then fails far from the cause)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after != before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test changed SIGINT's handler from {before!r} to {after!r}")
