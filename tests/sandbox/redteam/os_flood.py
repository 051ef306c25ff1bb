"""Red team, the protocol: flood the grader through what it relays.

- `Stderr`: every case writes `MIB` MiB to standard error (the grader's own stderr, through the
  host) before it refunds: the grader must relay a bounded amount and drop the rest.
- `LongLine`: the first call carries an argument of `MIB` MiB with no end of line for the host
  to stop at until the end: a protocol line past the cap is an error naming the policy, never a
  line buffered whole.

The test (tests/sandbox/test_sandbox_protocol.py) copies this file beside its run and bakes `MIB`
into `CONFIG`.
"""

import sys

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


class Stderr(Policy):
    name = "redteam_stderr"

    def plan(self):
        block = "x" * 65535 + "\n"
        for _ in range(16 * CONFIG.get("MIB", 1)):
            sys.stderr.write(block)
        sys.stderr.flush()
        yield ("refund", {})


class LongLine(Policy):
    name = "redteam_long_line"

    def plan(self):
        yield ("wait", {"ticks": "9" * (CONFIG.get("MIB", 2) << 20)})
        yield ("refund", {})
