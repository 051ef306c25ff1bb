"""The host's answers to every new task and every mount in the sandbox after the fork server's
filter: the kernel asks the host (seccomp's user notification), and waits for its word.

The fork server runs the policy's code after its import too (hooks it left), with capabilities
for its cases' namespaces, and so does each case's starter, its child. Two things there were
channels or floods that no filter can tell apart from what the fork server must do:

- Every fork the fork server makes returns the next process id of the sandbox; a case that
  started threads, or processes (its own filter is built in memory the import can rewrite),
  advanced that count and so told the next cases of its chunk what it learned (a red team
  relayed every case's outcome to the next). So the host lets the fork server make a task
  while it imports, and then one process (a starter) each time the host asks it for a case,
  and each starter make one process, its case; anything else, a case's thread included, fails
  with EPERM.
- A hook could mount a tmpfs of its own and fill it, outside any address space (a red team
  took 3.4 GB). So the host lets the fork server change its mounts' propagation only (no
  filesystem named), and a starter mount exactly its case's two places: a tmpfs with the
  case's size, on the scratch folder and /dev/shm, its arguments read from the starter's own
  memory (private, and the starter has one thread: nothing changes them before the kernel
  reads them again).

The listener is sent to the host and closed in the fork server before the import, so no code of
the policy's can answer in the host's place.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct

from .bwrap import SCRATCH, tmpfs_options
from .seccomp import SYSCALLS

_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # _IOWR('!', 0 and 1, their structs)
_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE: the call goes on as asked
# What a plain fork passes to clone (the child's id kept and cleared, the exit signal); any
# other flag (shared memory, CLONE_VM or CLONE_VFORK; a shared parent, CLONE_PARENT; ...) makes
# something other than a process of its own, and is refused once the import was checked.
FORK_FLAGS = 0x01000000 | 0x00200000 | 0xFF  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | CSIGNAL
PLACES = 2  # the mounts a starter makes: its case's scratch folder and /dev/shm
MS_NOSUID, MS_NODEV = 2, 4


def listen(prepared: tuple) -> int:
    """Take the filter `prepared` (`isolation._filter`) with a listener for its user
    notifications; the listener's descriptor."""
    SET_MODE_FILTER, NEW_LISTENER = 1, 1 << 3
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(SYSCALLS["seccomp"], SET_MODE_FILTER, NEW_LISTENER, prepared[1])
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"sandbox: seccomp: {os.strerror(ctypes.get_errno())}")
    return fd


class Supervisor:
    """The host's answers to one fork server's tasks and mounts (`listener`: its filter's)."""

    def __init__(self, listener: int, server: int):
        self.fd, self.server = listener, server
        # The forks the host asked the fork server for and it has not made yet; None until the
        # host has checked its import (the import may fork: whatever it leaves is refused).
        self.requests: int | None = None
        self.forked: set[int] = set()  # starters that made their case
        self.mounted: dict[int, int] = {}  # starter -> the places it mounted
        self.places = {SCRATCH.encode(), b"/dev/shm"}
        self.options = tmpfs_options()

    def answer(self) -> None:
        """Answer the next call waiting."""
        notice = bytearray(80)  # struct seccomp_notif: id, pid, flags, struct seccomp_data
        try:
            fcntl.ioctl(self.fd, _NOTIF_RECV, notice)
        except OSError:  # the caller died meanwhile
            return
        number, pid, _, call = struct.unpack_from("<QIIi", notice)
        args = struct.unpack_from("<6Q", notice, 32)
        try:
            if call == SYSCALLS["mount"]:
                allowed = self._mount(pid, args)
            else:  # clone, fork or vfork (vfork shares the caller's memory: never a plain fork)
                flags = (args[0] if call == SYSCALLS["clone"] else
                         0x4000 if call == SYSCALLS.get("vfork") else 0)
                allowed = self._task(pid, flags)
        except OSError:  # it ended while we looked
            allowed = False
        reply = struct.pack("<QqiI", number, 0, 0 if allowed else -errno.EPERM,
                            _CONTINUE if allowed else 0)
        try:
            fcntl.ioctl(self.fd, _NOTIF_SEND, reply)
        except OSError:  # it died meanwhile
            pass

    def _task(self, pid: int, flags: int) -> bool:
        """The fork server may make a task while it imports, and then a process each time the
        host asks it for a case; a starter one process, its case."""
        if pid == self.server:
            if self.requests is None:
                return True
            if flags & ~FORK_FLAGS or not self.requests:
                return False
            self.requests -= 1
            return True
        if pid in self.forked or flags & ~FORK_FLAGS or not self._starter(pid):
            return False
        self.forked.add(pid)
        return True

    def _mount(self, pid: int, args: tuple) -> bool:
        """The fork server may change its mounts' propagation (no source, filesystem or data); a
        starter, before its fork, mount the case's tmpfs on each of its two places, once."""
        source, target, kind, flags, data = args[:5]
        if pid == self.server:
            return source == kind == data == 0
        if flags != MS_NOSUID | MS_NODEV:
            return False
        if pid in self.forked or self.mounted.get(pid, 0) >= PLACES or not self._starter(pid):
            return False
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
            said = [_string(memory, maps, at) for at in (source, target, kind, data)]
        if said != [b"tmpfs", said[1], b"tmpfs", self.options] or said[1] not in self.places:
            return False
        self.mounted[pid] = self.mounted.get(pid, 0) + 1
        return True

    def _starter(self, pid: int) -> bool:
        """Whether `pid` is a process of one thread that the fork server made: its child, in
        the fork server's own pid namespace (a case is pid 1 of one more)."""
        status, server = _status(pid), _status(self.server)
        return (status.get("Tgid") == str(pid) and status.get("Threads") == "1"
                and status.get("PPid") == str(self.server)
                and len(status.get("NSpid", "").split()) == len(server.get("NSpid", "").split()))

    def close(self) -> None:
        os.close(self.fd)


def _status(pid: int) -> dict[str, str]:
    return {key: value.strip() for key, _, value in
            (line.partition(":\t") for line in open(f"/proc/{pid}/status").read().splitlines())}


def _string(memory, maps: list[str], at: int) -> bytes | None:
    """The C string at `at` in a process's `memory`, if it lies, its end included, in one
    private anonymous mapping (which no other process can write: not shared, and no file
    behind it), else None."""
    for line in maps:
        span, mode, _, _, inode = line.split()[:5]
        low, high = (int(x, 16) for x in span.split("-"))
        if low <= at < high:
            if mode[3] != "p" or inode != "0":
                return None
            memory.seek(at)
            text, end, _ = memory.read(min(256, high - at)).partition(b"\0")
            return text if end else None  # (no end here: the kernel would read on)
    return None
