"""Red team, the protocol: take the grader's own channel from inside a case.

A case used to be a fork of the process that spoke to the grader, and kept that process's ends of
the grader's pipe: walking its call stack to the host's loop (or just scanning its descriptors),
a case could answer the grader's end of its case itself, read the next case's brief and play it
in the same process with every earlier brief in memory. This policy looks for such a channel in
every case: a descriptor that reads from a pipe (the grader's messages came down one; a case's
own channel is now a socket to the host, its standard error a pipe it may only write). It ships
when it finds one, refunds when not.

The test (tests/sandbox/test_sandbox.py) copies this file beside its run; there is nothing to bake
in.
"""

import fcntl
import os
import stat

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def grader_channel() -> int | None:
    """A descriptor this case could read the grader's messages from, if any: an open pipe it
    may read (its own channel is a socket, its standard error a pipe it may only write)."""
    for fd in range(256):
        try:
            mode, flags = os.fstat(fd).st_mode, fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:
            continue
        if stat.S_ISFIFO(mode) and flags & os.O_ACCMODE in (os.O_RDONLY, os.O_RDWR):
            return fd
    return None


class GraderChannel(Policy):
    name = "redteam_grader_channel"

    def plan(self):
        yield ("ship", {}) if grader_channel() is not None else ("refund", {})
