"""Red team, state one process of the sandbox shares with others, live or kept: a hook the
import leaves runs in the fork server before every fork, where it holds capabilities for its
cases' namespaces. An outside red team's hook took a new cgroup namespace there, mounted the
machine's cgroup hierarchy and made directories in it that a later run read back; cases of two
workers running at once can talk through a lock on, or a watch of, a file both see; and a case
in its fork server's process group can signal the processes of that group.

This policy tries each: a hook in each case's starter (the fork server's child, which holds the
same capabilities) makes new user, cgroup, network, IPC and UTS namespaces (any one would do); each case takes a lock on its own file and opens a file watch,
and looks at whether it leads a session of its own. A case escalates where any of them worked
and refunds where none did.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import fcntl
import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
SERVER = os.getpid()  # the import runs in the fork server
HOOK: list[str] = []  # what the starter's hook could make (the case inherits the list)
_libc = ctypes.CDLL(None, use_errno=True)


def _in_starter() -> None:
    if os.getppid() != SERVER or os.getpid() == 1 or HOOK:
        return
    HOOK.append("tried")
    for name, flag in (("user", 0x10000000), ("cgroup", 0x02000000), ("net", 0x40000000),
                       ("ipc", 0x08000000), ("uts", 0x04000000)):
        if _libc.unshare(flag) == 0:
            HOOK.append(name)


os.register_at_fork(after_in_child=_in_starter)


def shared() -> list[str]:
    found = [name for name in HOOK if name != "tried"]
    try:
        with open(__file__, "rb") as own:
            fcntl.flock(own, fcntl.LOCK_SH | fcntl.LOCK_NB)
            found.append("flock")
    except OSError:
        pass
    watch = _libc.inotify_init1(0)
    if watch >= 0:
        os.close(watch)
        found.append("inotify")
    if os.getsid(0) != os.getpid():
        found.append("a session it shares")
    return found


class SharedState(Policy):
    name = "redteam_shared_state"

    def plan(self):
        yield ("escalate", {}) if shared() else ("refund", {})
