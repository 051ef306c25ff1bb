"""The limits an outside policy runs under: the wall time of a case (the grader's), the
resources of a case (the sandbox's: `agents/sandbox/isolation.py` sets them,
`agents/sandbox/case_checks.py` checks them) and the sizes of what a case may send (the host's
relay, `agents/sandbox/host.py`).

Two of them are set outside, by environment variables that reach the sandbox (`PASSED`): the
grader and every process in the sandbox read them here, so a case's wall time and its CPU time
come from the same value.
"""

from __future__ import annotations

import math
import os

TIMEOUT_VARIABLE = "FINALITY_POLICY_TIMEOUT"
POLICY_TIMEOUT_S = 10.0  # the wall time of a case, unless FINALITY_POLICY_TIMEOUT says otherwise
MEMORY_MB = 4096  # address space of a case; FINALITY_POLICY_MEMORY_MB changes it
FILE_MB = 64      # the largest file a case may write, and its /tmp and /dev/shm
OPEN_FILES = 256
MAX_LINE = 1 << 20  # the longest protocol line a case may send (a call is a few hundred bytes)
STDERR_CASE, STDERR_TOTAL = 64 << 10, 1 << 20  # what of a policy's standard error is relayed
PASSED = (TIMEOUT_VARIABLE, "FINALITY_POLICY_MEMORY_MB")  # the limits, set outside


def policy_timeout() -> float:
    """The wall time of a case, in seconds: FINALITY_POLICY_TIMEOUT, else `POLICY_TIMEOUT_S`.
    A value that is not a positive number of seconds is refused here, in words, rather than
    giving every case no time (0), a deadline already past, or no limit at all."""
    text = os.environ.get(TIMEOUT_VARIABLE)
    if text is None:
        return POLICY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{TIMEOUT_VARIABLE} must be a positive number of seconds (a case's "
                         f"wall time; {POLICY_TIMEOUT_S:g} if unset), not {text!r}")
    return value


def limits() -> dict[str, int]:
    """A case's resource limits: its address space, the largest file it may write, its CPU time
    (the wall time, whole seconds, and 2 more) and its open files."""
    return {"memory_mb": int(os.environ.get("FINALITY_POLICY_MEMORY_MB", MEMORY_MB)),
            "file_mb": FILE_MB, "cpu_s": int(policy_timeout()) + 2, "open_files": OPEN_FILES}
