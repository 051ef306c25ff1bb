"""Red team, the machine's counters: a number the whole machine shares, which one process can
advance and a later one read, is a channel from a private case to any later case, chunk, entry
or run. An outside red team used the kernel's inode counter of pseudo files: every new pipe
takes the next number, so a private case made 2^18 pipes when its probe said "settled" and a
later entry's public cases read the count from a pipe of their own, and published it in rows.

This policy looks for such a counter, at import (in the fork server) and in every case: the
inode number of a new pipe, socket or memfd, a pidfd's (it counts every process the machine
made), the machine's memory and process counts (sysinfo), the unique id of a mount (statx), and
/proc's totals. It escalates where it finds one and refunds where it finds none, so its rows
show whether any is open.

The test (tests/sandbox/test_private_leaks.py) copies this file beside its run; there is nothing to
bake in.
"""

import ctypes
import os
import socket

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
_libc = ctypes.CDLL(None, use_errno=True)


def _pipe() -> int:
    read, write = os.pipe()
    try:
        return os.fstat(read).st_ino
    finally:
        os.close(read)
        os.close(write)


def _socket() -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as made:
        return os.fstat(made.fileno()).st_ino


def _memfd() -> int:
    fd = os.memfd_create("counter")
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _pidfd() -> int:
    fd = os.pidfd_open(os.getpid())
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _sysinfo() -> int:
    if _libc.sysinfo(ctypes.create_string_buffer(256)) != 0:
        raise OSError(ctypes.get_errno(), "sysinfo")
    return 1


def _mount_id() -> int:
    STATX, AT_FDCWD, STATX_MNT_ID_UNIQUE = {"x86_64": 332, "aarch64": 291}[os.uname().machine], \
        -100, 0x4000
    if _libc.syscall(STATX, AT_FDCWD, b"/", 0, STATX_MNT_ID_UNIQUE,
                     ctypes.create_string_buffer(256)) != 0:
        raise OSError(ctypes.get_errno(), "statx")
    return 1


def _proc() -> int:
    with open("/proc/stat") as totals:
        return len(totals.read())


def found() -> list[str]:
    """The counters this process can reach."""
    open_ = []
    for name, reach in (("pipe", _pipe), ("socket", _socket), ("memfd", _memfd),
                        ("pidfd", _pidfd), ("sysinfo", _sysinfo), ("mount id", _mount_id),
                        ("/proc", _proc)):
        try:
            reach()
        except (OSError, AttributeError):
            continue
        open_.append(name)
    return open_


AT_IMPORT = found()


class Counter(Policy):
    name = "redteam_counter"

    def plan(self):
        yield ("escalate", {}) if AT_IMPORT or found() else ("refund", {})
