"""The seccomp filters of the sandbox (`agents/sandbox.py`), as classic-BPF programs: the fork
server's, taken before the policy's import, and every case's, built once in the fork server
(`agents/isolation.py` installs them). Both name the system calls they refuse by number, per
architecture; a call from another architecture's table (x32 on x86_64) kills the process.
"""

from __future__ import annotations

import platform

CLONE_THREAD = 0x10000  # the one clone a case may make: a thread

# The system calls a case may not make (numbers per architecture). Processes: only threads
# (clone with CLONE_THREAD; clone3 says ENOSYS so that the C library falls back to clone).
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
NUMBERS = {
    "x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "add_key": 248,
               "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308, "mount": 165,
               "umount2": 166, "pivot_root": 155, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "io_uring_setup": 425, "capset": 126, "shmget": 29,
               "semget": 64, "msgget": 68, "mq_open": 240,
               "pidfd_getfd": 438, "close_range": 436, "socket": 41, "socketpair": 53,
               "bind": 49, "listen": 50},
    "aarch64": {"clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "add_key": 217, "request_key": 218, "keyctl": 219,
                "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
                "capset": 91, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
                "pidfd_getfd": 438, "close_range": 436,
                "socket": 198, "socketpair": 199, "bind": 200, "listen": 201},
}
SYSCALLS = NUMBERS.get(platform.machine(), {})
DENIED = ("fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "add_key",
          "request_key", "keyctl", "unshare", "setns", "mount", "umount2", "pivot_root",
          "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "shmget", "semget",
          "msgget", "mq_open", "pidfd_getfd", "socket", "socketpair")
# The fork server's own, taken before the import (so every case has it too, whatever the import
# does): it may fork (its cases) and make namespaces and mounts (for them), but it may not read
# another process (ptrace, its memory, its descriptors), make IPC objects that outlive it, or
# make a socket anyone could reach: no bind, no listen, no socket pair, no socket but a unix
# stream one (which can only connect: the one listener in the sandbox is the host's).
SERVER_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "add_key",
                 "request_key", "keyctl", "setns", "pivot_root", "bpf", "perf_event_open",
                 "userfaultfd", "io_uring_setup", "shmget", "semget", "msgget", "mq_open",
                 "bind", "listen", "socketpair")


def seccomp_program(machine: str, denied_names: tuple[str, ...] = DENIED,
                    processes: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: (code, jt, jf, k) instructions over `struct seccomp_data`; the
    calls `denied_names` fail with EPERM; unless `processes`, so does every clone but a
    thread's; with `processes` (the fork server's), so does every socket but a unix stream
    socket."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    numbers = NUMBERS[machine]
    denied = [numbers[name] for name in denied_names if name in numbers]
    program = [(ld, 0, 0, 4), (jeq, 1, 0, _ARCH[machine]), (ret, 0, 0, kill),  # the arch
               (ld, 0, 0, 0),                                                     # the call
               (jge, 0, 1, 0x40000000) if machine == "x86_64" else (jeq, 0, 1, 0xFFFFFFFF),
               (ret, 0, 0, kill)]                                                 # x32 calls
    for nr in denied:
        program += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    if processes:
        AF_UNIX = SOCK_STREAM = 1
        return program + [(jeq, 0, 6, numbers["socket"]),
                          (ld, 0, 0, 16), (jeq, 0, 3, AF_UNIX),        # the domain (low word)
                          (ld, 0, 0, 24), (0x54, 0, 0, 0xF),           # the type, less its flags
                          (jeq, 1, 0, SOCK_STREAM), (ret, 0, 0, eperm),
                          (ret, 0, 0, allow)]
    program += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys),
                (jeq, 0, 4, numbers["clone"]), (ld, 0, 0, 16),  # clone's flags (low word)
                (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return program + [(ret, 0, 0, allow)]
