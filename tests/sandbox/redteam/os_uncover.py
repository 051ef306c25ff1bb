"""Red team, the fork server's /proc: once imported, the policy's code runs in the fork server
again before every fork (an at-fork hook), where it held the capabilities the fork server takes
for its cases. An outside red team's hook started a thread there that took a mount namespace of
its own, unmounted what hid /proc and read every later case's process name, which each case set
to its order value and what its probe said: 88 of 96 private cases then played what an earlier
case of their chunk had learned.

This policy's hook does the same: a thread of the fork server, started at its first fork, takes
a mount namespace of its own and tries to uncover /proc (unmount what covers it, or mount a
proc of its own), then looks for other processes there. Every case forked after it sees what the
thread found (the fork server's memory is every case's): a case escalates where /proc showed
another process, and refunds where it did not.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import os
import threading

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
SERVER = os.getpid()  # the import runs in the fork server
SEEN: list[str] = []  # the processes /proc showed the thread, besides the fork server
_libc = ctypes.CDLL(None, use_errno=True)
_started: list = []


def _look() -> None:
    _libc.unshare(0x20000 | 0x200)  # CLONE_NEWNS | CLONE_FS: a mount namespace of its own
    _libc.umount2(b"/proc", 2)  # MNT_DETACH
    if not os.path.isdir("/proc/self"):
        _libc.mount(b"proc", b"/proc", b"proc", 0, None)
    try:
        SEEN.extend(p for p in os.listdir("/proc") if p.isdigit() and int(p) != SERVER)
    except OSError:
        pass


def _before() -> None:
    if os.getpid() == SERVER and not _started:
        _started.append(threading.Thread(target=_look))
        _started[0].start()
        _started[0].join()


os.register_at_fork(before=_before)


class Uncover(Policy):
    name = "redteam_uncover"

    def plan(self):
        yield ("escalate", {}) if SEEN else ("refund", {})
