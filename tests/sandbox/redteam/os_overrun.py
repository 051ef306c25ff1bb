"""Red team, the protocol: say something after the case has ended.

At its disposition this policy writes two messages at once straight into its channel to the
host (its descriptors: the one socket it holds), then makes the disposition: the host relays one
message a turn, and anything a case sends past its turn or its end must be an error that names
the policy, the task and the seed, never read as the next case's (or anyone's) call.

The test (tests/sandbox/test_sandbox_protocol.py) copies this file beside its run; there is
nothing to bake in.
"""

import json
import os
import stat

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def channels() -> list[int]:
    found = []
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            pass
    return found


class Overrun(Policy):
    name = "redteam_overrun"

    def plan(self):
        # Two messages in one write: they arrive together, so the host always holds a message
        # past the first one's turn (a lone extra line races the host's end of the case).
        extra = 2 * (json.dumps({"call": {"name": "refund", "arguments": {}}}).encode() + b"\n")
        for fd in channels():
            try:
                os.write(fd, extra)
            except OSError:
                pass
        yield ("ship", {})
