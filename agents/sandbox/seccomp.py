"""The seccomp filters of the sandbox (`agents/sandbox/`), as classic-BPF programs: the fork
server's, taken before the policy's import, and every case's, built once in the fork server
(`agents/sandbox/isolation.py` installs them). Both name the system calls they refuse by number, per
architecture; a call from another architecture's table (x32 on x86_64) kills the process. A few
calls are refused by an argument: madvise by its advice, preadv2 and pwritev2 by their flags
(the low word of the argument: the kernel reads these as 32-bit ints).

The page cache is shared by every process that reads the same file, and every case of every
entry reads the same interpreter, libraries and policy files: a case that could see which pages
of a file are cached, or drop pages from the cache, could leave bits there for a later case, of
its chunk, of another chunk or entry, or of a later run. So both filters refuse what reports
what is cached or evicts it (`PAGE_CACHE`, `EVICTING_ADVICE`, `CACHE_FLAGS`): the fork server's
holds for every case whatever the import does (a hostile import can rewrite the case's filter,
which is built in its memory; it cannot remove the fork server's, which every case inherits).
What no filter refuses: a read still caches what it reads, and takes longer when it goes to the
disk (a later case that times its reads reads the bits: docs/trust.md, "What the sandbox does
not cover").

Counters of the whole machine are a channel of the same kind, and exact: what numbers a new
pipe, socket, memfd, pidfd or mount, and the machine's memory and process counts (`COUNTERS`).
Both filters refuse them; the fork server may make no socket at all, so its cases' channels are
made before its filter (`agents/sandbox/fork_server.py`). So are file locks and watches (`WATCHES`,
`LOCKS`: live channels between cases of two workers), and every namespace the fork server does
not make for its cases (`NAMESPACES`).
"""

from __future__ import annotations

import platform

# The system calls a case may not make (numbers per architecture). No new task, thread or
# process (clone3 says ENOSYS, so that the C library falls back to clone, which fails).
# ("fadvise64" is fadvise64_64 on aarch64, the same call.)
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
NUMBERS = {
    "x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "add_key": 248,
               "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308, "mount": 165,
               "umount2": 166, "pivot_root": 155, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "io_uring_setup": 425, "capset": 126, "shmget": 29,
               "semget": 64, "msgget": 68, "mq_open": 240,
               "pidfd_getfd": 438, "close_range": 436, "socket": 41, "socketpair": 53,
               "bind": 49, "listen": 50, "mincore": 27, "madvise": 28, "getrusage": 98,
               "io_setup": 206, "io_submit": 209, "fadvise64": 221, "move_pages": 279,
               "preadv2": 327, "pwritev2": 328, "process_madvise": 440, "cachestat": 451,
               "pipe": 22, "pipe2": 293, "memfd_create": 319, "memfd_secret": 447,
               "pidfd_open": 434, "sysinfo": 99, "open_tree": 428, "move_mount": 429,
               "fsopen": 430, "fsmount": 432, "fspick": 433, "name_to_handle_at": 303,
               "statmount": 457, "listmount": 458, "statx": 332, "fcntl": 72, "flock": 73,
               "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300, "seccomp": 317,
               "prctl": 157},
    "aarch64": {"clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "add_key": 217, "request_key": 218, "keyctl": 219,
                "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
                "capset": 91, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
                "pidfd_getfd": 438, "close_range": 436,
                "socket": 198, "socketpair": 199, "bind": 200, "listen": 201,
                "mincore": 232, "madvise": 233, "getrusage": 165, "io_setup": 0,
                "io_submit": 2, "fadvise64": 223, "move_pages": 239, "preadv2": 286,
                "pwritev2": 287, "process_madvise": 440, "cachestat": 451,
                "pipe2": 59, "memfd_create": 279, "memfd_secret": 447, "pidfd_open": 434,
                "sysinfo": 179, "open_tree": 428, "move_mount": 429, "fsopen": 430,
                "fsmount": 432, "fspick": 433, "name_to_handle_at": 264, "statmount": 457,
                "listmount": 458, "statx": 291, "fcntl": 25, "flock": 32,
                "inotify_init1": 26, "fanotify_init": 262, "seccomp": 277,
                "prctl": 167},
}
SYSCALLS = NUMBERS.get(platform.machine(), {})
# What makes the page cache a channel, refused to the fork server and every case: the queries
# of what is cached (mincore, cachestat; move_pages, whose status says which pages are mapped,
# and so which neighbours a fault mapped from the cache; getrusage, whose fault and block counts
# say whether a read went to the disk), the advice that evicts (fadvise64; process_madvise, the
# advice of madvise on any process, this one too) and Linux AIO (io_setup, io_submit), which
# can ask a read not to wait (RWF_NOWAIT) in memory a filter cannot read. (io_uring_setup is
# refused in both lists anyway.)
PAGE_CACHE = ("mincore", "cachestat", "move_pages", "getrusage", "fadvise64", "process_madvise",
              "io_setup", "io_submit")
# madvise's advice that evicts or deactivates pages (MADV_REMOVE, MADV_COLD, MADV_PAGEOUT); the
# C library's malloc needs the rest on its own memory (MADV_DONTNEED drops a mapping's pages,
# not the cache's).
EVICTING_ADVICE = (9, 20, 21)
# preadv2 and pwritev2's flags about the cache: RWF_NOWAIT fails a read of what is not cached
# (a query), RWF_DONTCACHE drops what it read (a read that leaves no trace: a probe by its
# time that every later reader could repeat).
CACHE_FLAGS = 0x08 | 0x80
# What reads or advances a counter the whole machine shares, so that one process could leave a
# number for a later one, of its chunk, another entry or another run (an outside red team did:
# every new pipe takes its inode number from one kernel-wide counter, so a private case made 2^18
# pipes and a later entry's public cases read the count from a pipe of their own): the objects
# numbered by kernel-wide counters (pipes, sockets, which a case's channel is made before the
# import instead, memfds and secret memory, pidfds; and clone's CLONE_PIDFD, statx's unique
# mount id, below), the machine's memory and process counts (sysinfo), and the mount calls
# that number mounts or undo the fork server's (umount2 and the new mount API; statmount and
# listmount name every mount by a counter; name_to_handle_at a mount id).
COUNTERS = ("pipe", "pipe2", "socket", "memfd_create", "memfd_secret", "pidfd_open", "sysinfo",
            "umount2", "open_tree", "move_mount", "fsopen", "fsmount", "fspick",
            "name_to_handle_at", "statmount", "listmount")
# Two processes that read the same file at once (cases of two workers, which share the files the
# sandbox shows) could talk through it: a lock one takes and the other tests, or the events one
# watches the other cause. Both filters refuse locks (flock; fcntl's lock, lease and notify
# commands, `LOCKS`) and file watches.
WATCHES = ("flock", "inotify_init", "inotify_init1", "fanotify_init")
LOCKS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)  # F_GETLK.., F_OFD_GETLK.., F_SETLEASE.., F_NOTIFY
CLONE_PIDFD = 0x1000
PR_SET_CHILD_SUBREAPER = 36
# Every namespace flag of clone and unshare. After its filter the fork server needs new pid and
# mount namespaces (for its cases) and no other: a new user namespace would give the policy's
# code capabilities, and with them a cgroup namespace and the machine's cgroup hierarchy
# mounted, where a red team left directories a later run read.
NAMESPACES = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000
CASE_NAMESPACES = 0x20000 | 0x20000000  # CLONE_NEWNS | CLONE_NEWPID
STATX_MNT_ID_UNIQUE = 0x4000
DENIED = ("fork", "vfork", "clone", "ptrace", "process_vm_readv", "process_vm_writev", "add_key",
          "request_key", "keyctl", "unshare", "setns", "mount", "umount2", "pivot_root",
          "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "shmget", "semget",
          "msgget", "mq_open", "pidfd_getfd", "socketpair", *PAGE_CACHE, *COUNTERS, *WATCHES)
# The fork server's own, taken before the import (so every case has it too, whatever the import
# does): it may fork (its cases), make namespaces and mounts (for them) and enter the user
# namespace it made for them before the import (setns), but it may not read another process
# (ptrace, its memory, its descriptors), make IPC objects that outlive it, make any socket (its
# cases' channels are made before the filter; the one listener in the sandbox is the host's),
# query or evict the page cache, or read or advance a counter of the machine's (`COUNTERS`).
SERVER_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "add_key",
                 "request_key", "keyctl", "pivot_root", "bpf", "perf_event_open",
                 "userfaultfd", "io_uring_setup", "shmget", "semget", "msgget", "mq_open",
                 "bind", "listen", "socketpair", *PAGE_CACHE, *COUNTERS, *WATCHES)

_LD, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06  # ld [k] is 32-bit
_ALLOW, _KILL, _EPERM, _ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
_NOTIFY = 0x7FC00000  # SECCOMP_RET_USER_NOTIF: the host answers (`agents/sandbox/supervisor.py`)


def _argument(nr: int, index: int, values: tuple[int, ...] = (), mask: int = 0) -> list[tuple]:
    """The call `nr` fails with EPERM when its argument `index` (the low word of `struct
    seccomp_data`'s args[index], at 16 + 8 * index on a little-endian machine) is one of
    `values`, or has a bit of `mask`; else it is allowed (no later check is about it)."""
    tests = ([(_JEQ, len(values) - i, 0, value) for i, value in enumerate(values)] if values
             else [(_JSET, 1, 0, mask)])
    body = [(_LD, 0, 0, 16 + 8 * index), *tests, (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _EPERM)]
    return [(_JEQ, 0, len(body), nr), *body]


def seccomp_program(machine: str, denied_names: tuple[str, ...] = DENIED,
                    processes: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: (code, jt, jf, k) instructions over `struct seccomp_data`; the
    calls `denied_names` fail with EPERM, and so do madvise with `EVICTING_ADVICE`, preadv2
    and pwritev2 with `CACHE_FLAGS` and statx asking for `STATX_MNT_ID_UNIQUE`; clone3 says
    ENOSYS; with `processes` (the fork server's), a clone that makes a pidfd or a namespace
    fails, and every other clone and fork waits for the host's answer
    (`agents/sandbox/supervisor.py`: the fork server and a case's starter may make a process, a
    case nothing, not even a thread, whatever the filter the case took)."""
    numbers = NUMBERS[machine]
    denied = [numbers[name] for name in denied_names if name in numbers]
    program = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _ARCH[machine]), (_RET, 0, 0, _KILL),  # the arch
               (_LD, 0, 0, 0),                                                       # the call
               (_JGE, 0, 1, 0x40000000) if machine == "x86_64" else (_JEQ, 0, 1, 0xFFFFFFFF),
               (_RET, 0, 0, _KILL)]                                                  # x32 calls
    for nr in denied:
        program += [(_JEQ, 0, 1, nr), (_RET, 0, 0, _EPERM)]
    program += _argument(numbers["madvise"], 2, values=EVICTING_ADVICE)  # (int advice)
    for name in ("preadv2", "pwritev2"):  # (fd, iov, iovcnt, pos_l, pos_h, int flags)
        program += _argument(numbers[name], 5, mask=CACHE_FLAGS)
    # (dirfd, path, flags, unsigned int mask, buffer): the unique mount id counts mounts
    program += _argument(numbers["statx"], 3, mask=STATX_MNT_ID_UNIQUE)
    program += _argument(numbers["fcntl"], 1, values=LOCKS)  # (fd, int cmd, arg)
    # (int option, ...): no child subreaper, which would take the exit statuses of the cases
    # its children start (a red team's fork server read every case's that way)
    program += _argument(numbers["prctl"], 0, values=(PR_SET_CHILD_SUBREAPER,))
    # (int flags): no namespace but the cases' (the case's own list refuses unshare whole)
    program += _argument(numbers["unshare"], 0, mask=NAMESPACES & ~CASE_NAMESPACES)
    # clone3's arguments are in memory a filter cannot read: ENOSYS, so that the C library falls
    # back to clone, whose flags it can
    program += [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, _ENOSYS)]
    if processes:  # no clone that makes a pidfd or a namespace; the host answers the rest
        program += [(_JEQ, 0, 4, numbers["clone"]), (_LD, 0, 0, 16),  # clone's flags (low word)
                    (_JSET, 1, 0, CLONE_PIDFD | NAMESPACES), (_RET, 0, 0, _NOTIFY),
                    (_RET, 0, 0, _EPERM)]
        for name in ("fork", "vfork", "mount"):
            if name in numbers:
                program += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, _NOTIFY)]
        return program + [(_RET, 0, 0, _ALLOW)]
    return program + [(_RET, 0, 0, _ALLOW)]
