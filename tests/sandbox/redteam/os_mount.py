"""Red team, mounts after the import: the fork server holds capabilities for its cases' mount
namespaces, and so does each case's starter, its child, which runs the policy's at-fork hooks.
An outside red team's hook mounted a tmpfs of its own and filled it, outside any address space
(3.4 GB from a 1 KB policy); a hook could also mount what its case then sees.

This policy's hook, in each case's starter, takes a mount namespace of its own and tries to
mount a tmpfs of 1 GiB on /tmp. The case escalates where the mount was let through and refunds
where it was not. (On the tree before the host answered mounts, the mount was let through, and
the host's check of the case then found a mount it did not expect.)

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
SERVER = os.getpid()  # the import runs in the fork server
MOUNTED: list[str] = []
_libc = ctypes.CDLL(None, use_errno=True)


def _in_starter() -> None:
    if os.getppid() != SERVER or os.getpid() == 1:
        return
    _libc.unshare(0x20000)  # CLONE_NEWNS
    if _libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 6, b"size=1g") == 0:
        MOUNTED.append("/tmp")


os.register_at_fork(after_in_child=_in_starter)


class Mount(Policy):
    name = "redteam_mount"

    def plan(self):
        yield ("escalate", {}) if MOUNTED else ("refund", {})
