"""The steps by which the sandbox's processes confine themselves, from inside, beyond what bwrap
gave them (`agents/sandbox/` says why each layer): the fork server before the policy's import
(`enter_worker`) and after it (`isolate_worker`), the child that starts a case (`enter_case`),
and the case before its brief (`restrict_case`). Namespaces, mounts, capabilities, limits and
the seccomp filters of `agents/sandbox/seccomp.py`, through the C library.

What `isolate_worker` builds for the cases lives in this process's memory (`_PREPARED`), which
the policy's code shares once imported: the host checks every case from /proc
(`agents/sandbox/case_checks.py`) instead of believing these steps ran.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct

from .bwrap import CASE_ID, HOSTDIR, SCRATCH, tmpfs_options
from .supervisor import listen
from .limits import limits
from .seccomp import DENIED, NUMBERS, SERVER_DENIED, SYSCALLS, seccomp_program

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 0x4000, 1 << 18)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox: {what}: {os.strerror(errno)}")


_PREPARED: dict = {}  # what isolate_worker made once, for every case forked after it


def _map(process: int | str, uid: int, gid: int) -> None:
    """Map the case's user and group, inside the user namespace of `process`, to `uid` and
    `gid` outside it (no other group: setgroups denied)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{CASE_ID} {uid} 1"),
                       ("gid_map", f"{CASE_ID} {gid} 1")):
        fd = os.open(f"/proc/{process}/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _own_namespaces() -> None:
    """A user and mount namespace of this process's own (the same user inside as outside: the
    host is never root, whose mapping would need CAP_SETFCAP), its mounts private to it."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    _map("self", uid, gid)
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")


def _fresh_places(options: bytes) -> None:
    """A fresh tmpfs on the scratch folder and on /dev/shm, in this mount namespace."""
    for place in (SCRATCH, "/dev/shm"):
        _check(_libc.mount(b"tmpfs", place.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
               f"a fresh {place}")


def _namespace_for_cases() -> int:
    """A user namespace made now, before the import, for the cases (entered after it:
    `isolate_worker`), mapped as this one is; a descriptor of it. A child makes it, and this
    process writes its maps from /proc, which is hidden before the import."""
    ready, told = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:
        try:
            _check(_libc.unshare(CLONE_NEWUSER), "unshare")
            os.write(ready[1], b"u")
            os.read(told[0], 1)
        finally:
            os._exit(0)
    try:
        if os.read(ready[0], 1) != b"u":
            raise OSError("sandbox: the cases' user namespace could not be made")
        _map(child, CASE_ID, CASE_ID)
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.write(told[1], b"x")
        os.waitpid(child, 0)
        for fd in (*ready, *told):
            os.close(fd)


def _hide_proc() -> None:
    """A read-only tmpfs over /proc, holding only a copy of /proc/cpuinfo as it reads now (what
    numerical libraries read at import to size their kernels: a snapshot counts nothing)."""
    cpuinfo = open("/proc/cpuinfo", "rb").read()
    _check(_libc.mount(b"tmpfs", b"/proc", b"tmpfs", MS_NOSUID | MS_NODEV,
                       f"size={len(cpuinfo) + 8192},mode=555".encode()), "hiding /proc")
    with open("/proc/cpuinfo", "wb") as copy:
        copy.write(cpuinfo)
    _check(_libc.mount(None, b"/proc", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
                       None), "hiding /proc")


def enter_worker() -> tuple[int, int]:
    """Called in the fork server before the policy's import: the import gets writable places
    of this server's own (a fresh tmpfs on the scratch folder and /dev/shm, which bwrap shows
    read-only: nothing written there reaches another chunk's server, and no case sees it), the
    host's folder read-only, no /proc (the machine's counters are there, and the host checks
    this process from its own), an address-space limit (a case's), the fork server's seccomp
    filter and no capability. All of it is kernel state, set before any of the policy's code
    runs: the import, and any hook it leaves in this process, can change this process's memory
    (what `isolate_worker` and the cases later do), not this. Mounts made here are locked in
    the cases' namespace: nothing there can uncover /proc. Returns a descriptor of the user
    namespace the cases get, made now (`isolate_worker` enters it), and the listener of the
    filter's clones, which the host answers (`agents/sandbox/supervisor.py`): the caller hands it
    to the host and closes it before the import."""
    if platform.machine() not in NUMBERS:
        raise OSError(f"sandbox: no seccomp filter for the {platform.machine()} architecture")
    import resource
    _own_namespaces()
    _fresh_places(tmpfs_options())
    _check(_libc.mount(None, HOSTDIR.encode(), None,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           "making the host's folder read-only")
    cases = _namespace_for_cases()
    _hide_proc()
    memory = limits()["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    PR_SET_NO_NEW_PRIVS = 38
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    clones = listen(_filter(seccomp_program(platform.machine(), SERVER_DENIED, processes=True)))
    _check(_libc.syscall(SYSCALLS["capset"], struct.pack("Ii", 0x20080522, 0), bytes(24)),
           "dropping capabilities")
    return cases, clones


def isolate_worker(cases: int) -> None:
    """Called once in the fork server (the host's zygote, after the policy's import and the
    host's checks of it; single-threaded): the user namespace `cases` made before the import,
    and a mount namespace of its own (every mount made before the import locked in it: /proc
    stays hidden), the capability bounding set emptied, exit statuses of its children discarded
    by the kernel, and every case's filter and limits built, so that a case pays only for what
    must be its own."""
    if platform.machine() not in NUMBERS:
        raise OSError(f"sandbox: no seccomp filter for the {platform.machine()} architecture")
    if _PREPARED:
        return
    import resource
    _check(_libc.syscall(SYSCALLS["setns"], cases, CLONE_NEWUSER), "entering the cases' user "
           "namespace")
    os.close(cases)
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")
    PR_CAPBSET_DROP = 24
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: nothing to drop
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped unread
    given = limits()
    _PREPARED.update(
        limits=[(resource.RLIMIT_AS, given["memory_mb"] << 20),
                (resource.RLIMIT_FSIZE, given["file_mb"] << 20),
                (resource.RLIMIT_CPU, given["cpu_s"]),
                (resource.RLIMIT_NOFILE, given["open_files"]), (resource.RLIMIT_CORE, 0)],
        setrlimit=resource.setrlimit, close_range=close_range,
        capabilities=(struct.pack("Ii", 0x20080522, 0), bytes(24)),  # v3, this process: none
        case=_filter(seccomp_program(platform.machine(), DENIED)),
        tmpfs=tmpfs_options())


def _filter(program: list) -> tuple:
    """A seccomp program as the kernel takes it: (the instructions, kept alive, and the
    `struct sock_fprog` pointing into them)."""
    code = (ctypes.c_ubyte * (8 * len(program)))(
        *b"".join(struct.pack("HBBI", *ins) for ins in program))
    return code, struct.pack("HxxxxxxP", len(program), ctypes.addressof(code))


def _seccomp(prepared: tuple) -> None:
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prepared[1], 0, 0), "seccomp")


def close_range(first: int) -> None:
    """Close every descriptor from `first` on (close_range(2); 0 on success)."""
    _check(_libc.syscall(SYSCALLS["close_range"], first, 0xFFFFFFFF, 0), "closing descriptors")


def enter_case() -> None:
    """Called in the fork server's child that starts a case: fresh pid and mount namespaces, a
    fresh tmpfs on the scratch folder and on /dev/shm, then the case itself forked
    as pid 1 of the new pid namespace, in a session of its own; this process exits at once (the
    case is reaped by the sandbox's init, never by the fork server). Returns in the case only."""
    _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
    _fresh_places(_PREPARED["tmpfs"])
    if os.fork():  # the first child in a new pid namespace is its pid 1
        os._exit(0)
    os.setsid()  # a session of its own: no signal of its reaches a group of the sandbox's
    os.chdir(SCRATCH)


def restrict_case(channel: int) -> None:
    """Called in the case, as pid 1 of its namespace, before it reads its brief: only standard
    input (/dev/null), output and error (the host's capped relay) and `channel` (moved to 3) are
    kept; then the limits, no capability, the case's seccomp filter."""
    prepared = _PREPARED
    if channel != 3:
        os.dup2(channel, 3, inheritable=False)
    prepared["close_range"](4)
    for which, value in prepared["limits"]:
        prepared["setrlimit"](which, (value, value))
    PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.syscall(SYSCALLS["capset"], *prepared["capabilities"]),
           "dropping capabilities")
    _seccomp(prepared["case"])
