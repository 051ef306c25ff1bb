"""Red team, the process ids a fork returns: every fork the fork server makes returns the next
process id of the sandbox, and every thread or process a case starts takes one. An outside red
team's import wrapped the fork server's fork to keep each child's id, and a hook in the next
case's starter read how many ids the case before had taken: each case told the next its
outcome that way, and 318 of 321 rows escalated.

This policy does the same with one number: every case starts `THREADS` threads, one after
another, and then a process; the next case reads how many ids were taken since its fork server
last forked. It escalates where it sees the case before it took more than its own two (its
starter and itself), and refunds where it does not (the first case of a fork server has no
case before it, and refunds).

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import os
import threading

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
THREADS = 40
SERVER = os.getpid()  # the import runs in the fork server
FORKED: list[int] = []  # in the fork server: the id of every child it made
SEEN: list[int] = []  # in a case: how many ids the case before took
_fork = os.fork


def _recording_fork() -> int:
    child = _fork()
    if child and os.getpid() == SERVER:
        FORKED.append(child)
    return child


os.fork = _recording_fork


def _in_starter() -> None:
    if not SEEN and len(FORKED) > 1 and os.getpid() != 1:  # the starter, before its unshare
        SEEN.append(os.getpid() - FORKED[-2] - 2)


os.register_at_fork(after_in_child=_in_starter)


def _take_ids() -> None:
    for _ in range(THREADS):
        try:
            worker = threading.Thread(target=lambda: None)
            worker.start()
            worker.join()
        except RuntimeError:
            break
    try:
        if os.fork() == 0:
            os._exit(0)
    except OSError:
        pass


class PidRelay(Policy):
    name = "redteam_pid_relay"

    def plan(self):
        told = bool(SEEN) and SEEN[0] > 2
        _take_ids()
        yield ("escalate", {}) if told else ("refund", {})
