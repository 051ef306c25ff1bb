"""Red team, exit statuses: a case's parent learns how it ended. An outside red team's hook made
the fork server a child subreaper, so every case was reparented to it once its starter exited;
each case wrote its last call on its channel itself and exited with a code of its choosing, and
the hook collected the codes before the next fork, so every later case of the chunk knew how
the cases before it ended. The same hook gave every case a filter that let it start a process,
and the host, which saw the fork server as the case's parent, took the case for a starter.

This policy does both: the hook makes the fork server a subreaper, reaps what it can and keeps
the exit codes, and rewrites the case's filter to allow everything; each case tries to start a
process, and ends by writing its call itself and exiting with code 77. A case escalates where
it inherited a code or could start a process, and refunds where neither worked.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import json
import os
import signal

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
SERVER = os.getpid()  # the import runs in the fork server
CODES: list[int] = []  # in the fork server: the exit codes it collected
_libc = ctypes.CDLL(None, use_errno=True)
_fork = os.fork


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 77:
            CODES.append(77)


def _server_fork() -> int:
    if os.getpid() != SERVER:
        return _fork()
    _libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _reap()
    try:
        from agents.sandbox import isolation
        if isolation._PREPARED:
            isolation._PREPARED["case"] = isolation._filter([(0x06, 0, 0, 0x7FFF0000)])
    except (ImportError, AttributeError):
        pass
    child = _fork()
    if child:  # the starter exits at once: reaped here (else a zombie the host would count)
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass
    return child


os.fork = _server_fork


def _started_a_process() -> bool:
    try:
        child = _fork()
    except OSError:
        return False
    if child == 0:
        os._exit(0)
    return True


class Reaper(Policy):
    name = "redteam_reaper"

    def plan(self):
        told = bool(CODES) or _started_a_process()
        call = ("escalate", {}) if told else ("refund", {})
        os.write(3, json.dumps({"call": {"name": call[0], "arguments": call[1]}},
                               separators=(",", ":")).encode() + b"\n")
        os._exit(77)
        yield call  # (never reached: the call went out above)
