"""Red team, the operating system: tell a later case something through what the writable places
hold besides their files.

Emptying the scratch folder and /dev/shm after every case removed what a case wrote, not the
folders' own metadata: their modification times, their mode bits, their extended attributes;
and the inode number of a new file on a shared tmpfs counts the files made there before (2, 3,
4, ... a case), which with the job order narrows the task down. Every case here looks for the
marks an earlier case left (the scratch folder's times set to `MARK`, an extended attribute,
/dev/shm's mode bits changed), leaves them, and makes one new file. Its first call is a wait
whose length encodes that file's inode number (`1 + inode % 97` ticks), so the test can see
whether the numbers count; then it ships when it found a mark, refunds when not.

The test (tests/sandbox/test_sandbox.py) copies this file beside its run and bakes `PLACE` (a
folder of its own, the scratch folder of the unsandboxed run) into `CONFIG`.
"""

import os
import tempfile

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
MARK = 123456789  # the time an earlier case set


def scratch() -> str:
    """The sandbox's scratch folder; unsandboxed, a folder of the test's (`PLACE`): never the
    machine's own /tmp."""
    return CONFIG["PLACE"] if os.environ.get("FINALITY_SANDBOX") != "1" else tempfile.gettempdir()


def marked() -> bool:
    """Whether an earlier case left a mark, and leave ours."""
    place, found = scratch(), False
    found |= os.stat(place).st_mtime == MARK
    try:
        found |= "user.finality-redteam" in os.listxattr(place)
        os.setxattr(place, "user.finality-redteam", b"x")
    except OSError:  # no user xattrs on this filesystem
        pass
    if os.environ.get("FINALITY_SANDBOX") == "1":  # never the machine's own /dev/shm
        try:
            found |= os.stat("/dev/shm").st_mode & 0o7777 == 0o1770
            os.chmod("/dev/shm", 0o1770)
        except OSError:  # not ours to change
            pass
    os.utime(place, (MARK, MARK))
    return found


def inode() -> int:
    with tempfile.NamedTemporaryFile(dir=scratch()) as made:
        return os.fstat(made.fileno()).st_ino


class Metadata(Policy):
    name = "redteam_metadata"

    def plan(self):
        ticks = 1 + inode() % 97
        found = marked()
        yield ("wait", {"ticks": ticks})
        yield ("ship", {}) if found else ("refund", {})
