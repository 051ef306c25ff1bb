"""Red team, the fork server: count the cases it forks.

The import registers a hook that Python runs in the process the cases are forked from, before
each fork: a counter there goes 1, 2, 3, ... and each case is forked with the count so far. Kept
across chunks of work, the count would tell a case which chunk, and so which jobs, it plays
(the job order is public). Every case's first call is a wait of as many ticks as its count, so
the test can read the counts from the rows; then it refunds.

The test (tests/sandbox/test_sandbox_protocol.py) copies this file beside its run; there is nothing
to bake in.
"""

import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
COUNT = [0]
os.register_at_fork(before=lambda: COUNT.__setitem__(0, COUNT[0] + 1))


class Count(Policy):
    name = "redteam_count"

    def plan(self):
        yield ("wait", {"ticks": COUNT[0]})
        yield ("refund", {})
