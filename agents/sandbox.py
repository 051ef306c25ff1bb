"""The operating-system sandbox an outside policy runs in: bubblewrap around its process, and a
pid namespace, no capability, a seccomp filter and limits around every case.

Two layers, because the grade must hold against code that attacks the machine, not only
Python (docs/trust.md):

1. The policy's process (`agents/host.py`) runs under `bwrap` (bubblewrap: unprivileged user
   namespaces, no daemon, the sandbox of Flatpak): new user, pid, network, ipc, uts and cgroup
   namespaces, so it sees no process of the machine, no network (not even the loopback of the
   grader), no System V or POSIX IPC object of anyone else; capabilities dropped; the whole
   filesystem read-only and made of only what the policy needs (the interpreter and its
   site-packages, the repository's `agents/` and `finality_gym/`, the policy's own file or
   package); no `$HOME`, no results folder; the grader's environment never passed. Nothing
   there is writable by the policy's code, the scratch folder and /dev/shm included, so one
   chunk's fork server leaves nothing for the next.
2. The process the cases are forked from (the host's zygote, a fork server, one per chunk of
   work) takes, before the policy's import, a user and mount namespace of its own, a private
   tmpfs for what the import writes, the host's folder read-only, its own seccomp filter (no
   ptrace, no reading another process's memory or descriptors, no IPC object that outlives it,
   no socket anyone could connect to: no bind, no listen, no socket pair, only unix stream
   sockets, which can only connect, and the one listener is the host's) and no capability
   (`enter_worker`). This is kernel state: the import, and the hooks it may
   leave in the fork server (which runs them before every fork), can change the fork server's
   memory, never this. After the import it takes another user namespace, for its cases
   (`isolate_worker`). Every case is two forks away from it: the first (`enter_case`) makes
   fresh pid and mount namespaces and mounts a fresh, size-capped tmpfs on the scratch
   folder (`/scratch`, the case's `$TMPDIR` and `$HOME`) and on `/dev/shm`, then forks the case
   as pid 1 of its namespace and exits; the case (`restrict_case`) connects to the host, keeps
   only that socket and the capped stderr relay, then takes limits (address space, file size,
   CPU time, open files), drops every capability and takes the case filter (no new process,
   only threads; no new socket; no System V or POSIX message-queue IPC object; no keyring, no
   ptrace, no mount, no namespace). Nothing of a writable place, not its times, modes, extended
   attributes or inode numbers, reaches the next case: each gets new ones. No socket, abstract
   or not, is shared between cases or with the fork server: none of them can listen.

   The host, which never imports the policy, checks every case from `/proc` before it hands it
   its brief (`case_problems`): pid 1 of a new pid namespace, a mount namespace of its own,
   exactly the expected mounts with its writable places on filesystems the fork
   server neither mounts nor holds open, no capability, the limits, one thread, only its own
   descriptors, no shared writable mapping. The steps above that run in the fork server's
   memory (the case's filter, say) a hostile import can undo; what the host checks, and the
   kernel state taken before the import, it cannot. The host ends each case by killing its pid
   namespace once the grader says the case ended, and refuses a policy whose import, or whose
   fork server, leaves any other process (`others`).

   (A per-case user namespace and a seccomp filter built per case were measured at 11 ms a
   case and are made once in the fork server; a network namespace per case cost 1.5 ms more,
   and the fork server's filter does its work; fresh pid and mount namespaces and two tmpfs
   cost about 0.5 ms a case: `benchmarks/README.md`.)

`unavailable()` says what is missing where the sandbox cannot start (no `bwrap`, user
namespaces disabled); `self_test()` proves it from inside before the first case.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

from .spec import ROOT

SUBMISSION = "/submission"  # where a policy file is shown inside the sandbox
# A case's writable scratch space ($TMPDIR, $HOME), private to it. /tmp itself is read-only (it
# may hold the repository or the interpreter: a clone under /tmp must keep working).
SCRATCH = "/scratch"
# Where the host listens for its cases: a tmpfs of the host's, read-only to the policy's code.
HOSTDIR = "/run/finality"
MEMORY_MB = 4096  # address space of a case; FINALITY_POLICY_MEMORY_MB changes it
FILE_MB = 64      # the largest file a case may write, and its /tmp and /dev/shm
OPEN_FILES = 256
MAX_LINE = 1 << 20  # the longest protocol line a case may send (a call is a few hundred bytes)
STDERR_CASE, STDERR_TOTAL = 64 << 10, 1 << 20  # what of a policy's standard error is relayed
PASSED = ("FINALITY_POLICY_TIMEOUT", "FINALITY_POLICY_MEMORY_MB")  # the limits, set outside
CASE_ID = 1000  # the user and group the policy's process and its cases run as, inside

INSTALL = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
           "bubblewrap)")
USERNS = ("unprivileged user namespaces are disabled: allow them (Debian: sysctl -w "
          "kernel.unprivileged_userns_clone=1; Ubuntu 24.04 and later: sysctl -w "
          "kernel.apparmor_restrict_unprivileged_userns=0; elsewhere: sysctl -w "
          "user.max_user_namespaces=15000)")
HOW = ("or grade with --sandbox off, which runs outside policies without it (refused for "
       "--split private)")


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None where the sandbox can run here; else what is missing and how to get it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"the sandbox needs bubblewrap, and no bwrap is on PATH: {INSTALL}, {HOW}"
    probe = subprocess.run([bwrap, "--unshare-all", "--cap-drop", "ALL", *_system_binds(),
                            "--proc", "/proc", "--dev", "/dev", "--", "/bin/sh", "-c",
                            "exec true"], capture_output=True, text=True)
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no message"
        return f"bwrap cannot start a sandbox here ({said}): {USERNS}, {HOW}"
    return None


def _system_binds() -> list[str]:
    """The system's programs and libraries, read-only; the merged-/usr links as links."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", name, name]
    return args


def command(argv: list[str], shown: dict[str, str], env: dict[str, str]) -> list[str]:
    """`argv` under bwrap, seeing only the system, the interpreter, the repository's code and
    `shown` (a path outside -> its path inside), with only `env`."""
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--uid", str(CASE_ID), "--gid", str(CASE_ID),
            *_system_binds()]
    for prefix in dict.fromkeys((sys.base_prefix, sys.prefix)):  # the interpreter, the venv
        args += ["--ro-bind", prefix, prefix]
    for code in ("agents", "finality_gym"):
        args += ["--ro-bind", str(ROOT / code), str(ROOT / code)]
    for outside, inside in shown.items():
        args += ["--ro-bind", outside, inside]
    size = ["--size", str(FILE_MB << 20)] if _sizes_tmpfs() else []
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", SCRATCH, *size, "--tmpfs",
             "/dev/shm", "--tmpfs", HOSTDIR, "--remount-ro", SCRATCH, "--remount-ro",
             "/dev/shm", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/",
             "--clearenv"]
    for key, value in {**env, "TMPDIR": SCRATCH, "HOME": SCRATCH,
                       "FINALITY_SANDBOX": "1"}.items():
        args += ["--setenv", key, value]
    return [*args, "--", *argv]


@lru_cache(maxsize=1)
def _sizes_tmpfs() -> bool:
    """Whether this bwrap caps a tmpfs's size (`--size`, bubblewrap 0.8 and later)."""
    shown = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"], capture_output=True,
                           text=True)
    return "--size" in shown.stdout + shown.stderr


def shown_for(target: str, source: Path) -> tuple[dict[str, str], str, str, list[str],
                                                  tuple[str, str] | None]:
    """What the sandbox shows of a policy: (the binds, its target and source file as seen
    inside, the import path to add, and the (inside, outside) prefix that names its files in
    messages). A file is shown alone, as `/submission/NAME.py`; a module with its whole
    top-level package (or module file) under `/submission`, which goes on the import path; the
    repository's own `agents` and `finality_gym` are shown anyway, where they are."""
    if target.endswith(".py"):
        inside = f"{SUBMISSION}/{source.name}"
        return {str(source): inside}, inside, inside, [], (inside, str(source))
    parts = target.split(".")
    depth = len(parts) if source.name != "__init__.py" else len(parts) + 1
    entry = source.parents[depth - 1]
    if entry == ROOT and parts[0] in ("agents", "finality_gym"):
        return {}, target, str(source), [], None
    top = entry / parts[0]
    top = top if top.is_dir() else top.with_suffix(".py")
    inside = f"{SUBMISSION}/{source.relative_to(entry)}"
    return ({str(top): f"{SUBMISSION}/{top.name}"}, target, inside, [SUBMISSION],
            (SUBMISSION, str(entry)))


def limits() -> dict[str, int]:
    timeout = float(os.environ.get("FINALITY_POLICY_TIMEOUT", 10.0))
    return {"memory_mb": int(os.environ.get("FINALITY_POLICY_MEMORY_MB", MEMORY_MB)),
            "file_mb": FILE_MB, "cpu_s": int(timeout) + 2, "open_files": OPEN_FILES}


def layers() -> dict:
    """What a sandboxed run had in force, for `run.json` and the report."""
    version = subprocess.run([shutil.which("bwrap") or "bwrap", "--version"],
                             capture_output=True, text=True).stdout.strip()
    return {"tool": version,
            "process": "new user, pid, network, ipc, uts and cgroup namespaces; no network; "
                       "capabilities dropped; read-only filesystem of the interpreter, the "
                       "repository's agents/ and finality_gym/, and the policy's own code; "
                       "a bare environment",
            "case": "forked from a fork server in its own user and mount namespaces with /proc "
                    "hidden, filtered itself (no ptrace, no reading of other processes' memory "
                    "or exit statuses); own pid and mount namespaces; writable only "
                    "$TMPDIR (/scratch) and /dev/shm, a fresh 64 MiB tmpfs each; /tmp and /dev "
                    "read-only; no new processes, sockets, namespaces, mounts, System V or "
                    "message-queue IPC, keyrings or ptrace (seccomp)",
            "channel": "one socket per case, accepted by the host and checked from /proc "
                       "before the brief (pid namespace, filter, capabilities, descriptors, "
                       "mappings); the case's pid namespace killed at its end; no process but "
                       "the host and the fork server outlives a case",
            "output": f"protocol lines at most {MAX_LINE} bytes; standard error relayed up to "
                      f"{STDERR_CASE} bytes a case, {STDERR_TOTAL} a process",
            "limits": limits()}


# ----------------------------------------------------------------------------- each case
_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_THREAD = 0x20000, 0x10000000, 0x20000000, 0x10000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 0x4000, 1 << 18)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox: {what}: {os.strerror(errno)}")


_PREPARED: dict = {}  # what isolate_worker made once, for every case forked after it


def _own_namespaces() -> None:
    """A user and mount namespace of this process's own (the same user inside as outside: the
    host is never root, whose mapping would need CAP_SETFCAP), its mounts private to it."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{CASE_ID} {uid} 1"),
                       ("gid_map", f"{CASE_ID} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")


def _tmpfs_options() -> bytes:
    """A writable place's tmpfs: open to the case's user, size-capped where bwrap caps one."""
    return (f"size={FILE_MB}m,mode=1777" if _sizes_tmpfs() else "mode=1777").encode()


def _fresh_places(options: bytes) -> None:
    """A fresh tmpfs on the scratch folder and on /dev/shm, in this mount namespace."""
    for place in (SCRATCH, "/dev/shm"):
        _check(_libc.mount(b"tmpfs", place.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
               f"a fresh {place}")


def peer(channel: socket.socket) -> int:
    """The process id, as this process sees it, of what connected on `channel`."""
    return struct.unpack("3i", channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


def enter_worker() -> None:
    """Called in the fork server before the policy's import: the import gets writable places
    of this server's own (a fresh tmpfs on the scratch folder and /dev/shm, which bwrap shows
    read-only: nothing written there reaches another chunk's server, and no case sees it), the
    host's folder read-only, the fork server's seccomp filter and no capability. All of it is
    kernel state, set before any of the policy's code runs: the import, and any hook it leaves
    in this process, can change this process's memory (what `isolate_worker` and the cases
    later do), not this. (`isolate_worker` takes a namespace of its own again after the
    import, for the cases.)"""
    if platform.machine() not in _NUMBERS:
        raise OSError(f"sandbox: no seccomp filter for the {platform.machine()} architecture")
    _own_namespaces()
    _fresh_places(_tmpfs_options())
    _check(_libc.mount(None, HOSTDIR.encode(), None,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           "making the host's folder read-only")
    PR_SET_NO_NEW_PRIVS = 38
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _seccomp(_filter(seccomp_program(platform.machine(), _SERVER_DENIED, processes=True)))
    _check(_libc.syscall(_SYSCALLS["capset"], struct.pack("Ii", 0x20080522, 0), bytes(24)),
           "dropping capabilities")


def isolate_worker() -> None:
    """Called once in the fork server (the host's zygote, after the policy's import and its
    checks; single-threaded): a user and mount namespace of its own, /proc hidden, the
    capability bounding set emptied, exit statuses of its children discarded by the kernel,
    its own seccomp filter, and every case's filter and limits built, so that a case pays only
    for what must be its own."""
    if platform.machine() not in _NUMBERS:
        raise OSError(f"sandbox: no seccomp filter for the {platform.machine()} architecture")
    if _PREPARED:
        return
    import resource
    _own_namespaces()
    _check(_libc.mount(b"tmpfs", b"/proc", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV,
                       b"size=4k"), "hiding /proc")
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
        setrlimit=resource.setrlimit, close_range=_close_range,
        capabilities=(struct.pack("Ii", 0x20080522, 0), bytes(24)),  # v3, this process: none
        case=_filter(seccomp_program(platform.machine(), _DENIED)),
        tmpfs=_tmpfs_options())


def _filter(program: list) -> tuple:
    """A seccomp program as the kernel takes it: (the instructions, kept alive, and the
    `struct sock_fprog` pointing into them)."""
    code = (ctypes.c_ubyte * (8 * len(program)))(
        *b"".join(struct.pack("HBBI", *ins) for ins in program))
    return code, struct.pack("HxxxxxxP", len(program), ctypes.addressof(code))


def _seccomp(prepared: tuple) -> None:
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prepared[1], 0, 0), "seccomp")


def _close_range(first: int) -> None:
    """Close every descriptor from `first` on (close_range(2); 0 on success)."""
    _check(_libc.syscall(_SYSCALLS["close_range"], first, 0xFFFFFFFF, 0), "closing descriptors")


def enter_case() -> None:
    """Called in the fork server's child that starts a case: fresh pid and mount namespaces, a
    fresh tmpfs on the scratch folder and on /dev/shm, then the case itself forked
    as pid 1 of the new pid namespace; this process exits at once (the case is reaped by the
    sandbox's init, never by the fork server). Returns in the case only."""
    _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
    _fresh_places(_PREPARED["tmpfs"])
    if os.fork():  # the first child in a new pid namespace is its pid 1
        os._exit(0)
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
    _check(_libc.syscall(_SYSCALLS["capset"], *prepared["capabilities"]),
           "dropping capabilities")
    _seccomp(prepared["case"])


# ------------------------------------------------------------ what the host checks from /proc
_SHARED_WRITABLE = re.compile(rb"^\S+ .w.s ", re.M)  # a line of /proc/PID/maps: rw-s, -w-s
def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def others(known: set[int]) -> dict[int, str]:
    """The processes of the sandbox but pid 1 (bwrap's init) and `known`: their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != 1 and int(entry) not in known:
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:  # it ended while we looked
                continue
            found[int(entry)] = argv.decode(errors="replace").strip()[:80] or "?"
    return found


def _mounts(pid: int | str) -> list[tuple[str, str]]:
    """A process's mounts, bottom to top: (mount point, the filesystem's device)."""
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return [(line.split()[4], line.split()[2]) for line in lines]


def expected_mounts() -> list[str]:
    """The mount points a case must have, as the host sees its own: the sandbox's, then the
    fork server's private tmpfs (scratch, /dev/shm) and hidden /proc, then the case's own
    fresh tmpfs (scratch, /dev/shm)."""
    return sorted([point for point, _ in _mounts("self")]
                  + [SCRATCH, "/dev/shm", "/proc", SCRATCH, "/dev/shm"])


def case_problems(pid: int, server: int, relay: str, mounts: list[str]) -> list[str]:
    """What is wrong with the process `pid` that connected as a case, checked by the host from
    /proc (kernel state, which no code of the policy's can forge) before the case is handed its
    brief: it must be pid 1 of its own pid namespace, in a mount namespace other than the fork
    server's (`server`), with exactly the `mounts` expected and its writable places on
    filesystems the fork server holds neither mounted nor open, under a seccomp filter with
    no_new_privs, no capability and the limits, one thread, only its own descriptors (0:
    /dev/null; 1, 2: the stderr relay `relay`; 3: its socket) and no shared writable mapping.
    The fork server runs the policy's code (hooks its import left), so whatever it and the
    case's own start did is checked here, not believed."""
    problems = []
    try:
        status = _status(pid)
        if status.get("NSpid", "").split()[-1:] != ["1"] or len(status["NSpid"].split()) < 2:
            problems.append("it is not pid 1 of a pid namespace of its own")
        if status.get("Seccomp") != "2" or status.get("NoNewPrivs") != "1":
            problems.append("it is not under the case's seccomp filter")
        if int(status.get("CapEff", "1"), 16) or int(status.get("CapPrm", "1"), 16):
            problems.append("it holds capabilities")
        if status.get("Threads") != "1":
            problems.append(f"it runs {status.get('Threads')} threads before its first step")
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink(f"/proc/{server}/ns/mnt"):
            problems.append("it shares the fork server's mount namespace")
        own = _mounts(pid)
        if sorted(point for point, _ in own) != mounts:
            problems.append("its mounts are not the sandbox's")
        top = {point: device for point, device in own}  # the last mount of a point is on top
        held = {device for _, device in _mounts(server)} | {
            "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
            for st in _stats(f"/proc/{server}/fd")}
        if {top.get(SCRATCH), top.get("/dev/shm")} & held:
            problems.append("its scratch folder or /dev/shm is not a fresh filesystem of its own")
        limits = Path(f"/proc/{pid}/limits").read_text()
        given = _limit_lines()
        for label, value in given.items():
            if not re.search(rf"^{label}\s+{value}\s+{value}\s", limits, re.M):
                problems.append(f"its limit {label.lower()!r} is not {value}")
        fds = {int(f): os.readlink(f"/proc/{pid}/fd/{f}") for f in os.listdir(f"/proc/{pid}/fd")}
        expected = {0: "/dev/null", 1: relay, 2: relay}
        if set(fds) != {0, 1, 2, 3} or any(fds[f] != v for f, v in expected.items()) \
                or not fds[3].startswith("socket:"):
            problems.append(f"it holds other descriptors ({', '.join(sorted(map(str, fds)))}: "
                            f"{', '.join(fds.values())})")
        shared = _SHARED_WRITABLE.findall(Path(f"/proc/{pid}/maps").read_bytes())
        if shared:
            problems.append(f"it holds {len(shared)} shared writable mapping(s)")
    except (OSError, KeyError, ValueError) as exc:
        problems.append(f"it could not be checked ({exc})")
    return problems


def _stats(folder: str) -> list[os.stat_result]:
    """What each descriptor in a /proc/PID/fd folder is open on."""
    found = []
    for fd in os.listdir(folder):
        try:
            found.append(os.stat(f"{folder}/{fd}"))
        except OSError:  # closed as we looked
            pass
    return found


def _limit_lines() -> dict[str, int]:
    """The case's limits as /proc/PID/limits labels them (label: bytes, seconds or count)."""
    given = limits()
    return {"Max address space": given["memory_mb"] << 20,
            "Max file size": given["file_mb"] << 20, "Max cpu time": given["cpu_s"],
            "Max open files": given["open_files"]}


# The system calls a case may not make (numbers per architecture). Processes: only threads
# (clone with CLONE_THREAD; clone3 says ENOSYS so that the C library falls back to clone).
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NUMBERS = {
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
_SYSCALLS = _NUMBERS.get(platform.machine(), {})
_DENIED = ("fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "add_key",
           "request_key", "keyctl", "unshare", "setns", "mount", "umount2", "pivot_root",
           "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "shmget", "semget",
           "msgget", "mq_open", "pidfd_getfd", "socket", "socketpair")
# The fork server's own, taken before the import (so every case has it too, whatever the import
# does): it may fork (its cases) and make namespaces and mounts (for them), but it may not read
# another process (ptrace, its memory, its descriptors), make IPC objects that outlive it, or
# make a socket anyone could reach: no bind, no listen, no socket pair, no socket but a unix
# stream one (which can only connect: the one listener in the sandbox is the host's).
_SERVER_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "add_key",
                  "request_key", "keyctl", "setns", "pivot_root", "bpf", "perf_event_open",
                  "userfaultfd", "io_uring_setup", "shmget", "semget", "msgget", "mq_open",
                  "bind", "listen", "socketpair")


def seccomp_program(machine: str, denied_names: tuple[str, ...] = _DENIED,
                    processes: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: (code, jt, jf, k) instructions over `struct seccomp_data`; the
    calls `denied_names` fail with EPERM; unless `processes`, so does every clone but a
    thread's; with `processes` (the fork server's), so does every socket but a unix stream
    socket."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    numbers = _NUMBERS[machine]
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


# ---------------------------------------------------------------------------- self-test
class SandboxError(ValueError):
    """The sandbox cannot start here, or failed its self-test: nothing was graded."""


def self_test() -> dict:
    """Prove the sandbox from inside before the first case: two cases started as a policy's
    would be, through the same layers, each checked from /proc as the host checks it; the first
    leaves marks on its writable places (a file, times, mode bits, an extended attribute) and an
    abstract socket; from inside, a case can see no process of the grader, write nowhere but its
    scratch folder, reach no listener the grader holds on the loopback, start no process, and
    the second sees nothing of the first (not even by the inode number of a new file). Returns
    the layers in force; raises if one of these holds."""
    reason = unavailable()
    if reason is not None:
        raise SandboxError(reason)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        argv = [sys.executable, "-m", "agents.sandbox", str(os.getpid()), str(port),
                str(ROOT / "agents")]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
               "FINALITY_POLICY_TIMEOUT": os.environ.get("FINALITY_POLICY_TIMEOUT", "10")}
        done = subprocess.run(command(argv, {}, env), capture_output=True, text=True,
                              timeout=60)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise SandboxError(f"the sandbox's self-test did not run: {done.stderr.strip()[-300:]}")
    broken = [what if held is True else f"{what}: {held}" for what, held in found.items() if held]
    if broken:
        raise SandboxError(f"the sandbox's self-test failed: from inside a case it {broken}")
    return layers()


def _probe(grader_pid: int, port: int, code: str, first: bool) -> dict:
    """Run inside a case: what it can reach that it must not; the first case leaves marks."""
    found = {}
    try:
        os.kill(grader_pid, 0)
        found["signalled the grader"] = True
    except OSError:
        found["signalled the grader"] = False
    found["saw another process"] = any(p.isdigit() for p in os.listdir("/proc"))
    wrote = False
    for place in (code, "/", "/usr", "/tmp"):
        try:
            Path(place, ".sandbox-probe").write_text("x")
            wrote = True
        except OSError:
            pass
    found["wrote outside its scratch folder"] = wrote
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        found["reached the grader's loopback listener"] = True
    except OSError:
        found["reached the grader's loopback listener"] = False
    try:
        os.fork()
        found["started a process"] = True
    except OSError:
        found["started a process"] = False
    new = Path(SCRATCH, "mark")
    new.write_text("x")
    found["inode"] = new.stat().st_ino
    try:  # none: no case can reach another's
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        abstract = None
    found["made a socket"] = abstract is not None
    if first:
        os.utime(SCRATCH, (1, 1))
        os.chmod("/dev/shm", 0o700)
        Path("/dev/shm/mark").write_text("x")
        try:
            os.setxattr(SCRATCH, "user.mark", b"x")
        except OSError:  # a tmpfs without user xattrs: nothing to carry there
            pass
        if abstract is not None:
            abstract.bind("\0finality-self-test")
            abstract.listen(1)
        return found
    seen = (sorted(os.listdir(SCRATCH)) != ["mark"] or os.listdir("/dev/shm")
            or os.stat(SCRATCH).st_mtime == 1 or os.stat("/dev/shm").st_mode & 0o777 != 0o777)
    try:
        seen = seen or bool(os.listxattr(SCRATCH))
    except OSError:
        pass
    try:
        if abstract is not None:
            abstract.connect("\0finality-self-test")
            seen = True
    except OSError:
        pass
    found["saw what an earlier case left"] = bool(seen)
    return found


def _self_test_cases(argv: list[str]) -> dict:
    """Inside bwrap: the host's part of two cases (a fork server, a listener, the checks)."""
    grader_pid, port, code = int(argv[0]), int(argv[1]), argv[2]
    address = f"{HOSTDIR}/self-test"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(2)
    listener.settimeout(30)
    null = os.open(os.devnull, os.O_RDONLY)
    read_end, write_end = os.pipe()
    ours, theirs = socket.socketpair()
    server = os.fork()
    if server == 0:  # the fork server: a case each time the host says so
        os.dup2(null, 0)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.dup2(theirs.fileno(), 3)
        _close_range(4)
        enter_worker()
        isolate_worker()
        control = socket.socket(fileno=3)
        for first in (True, False):
            control.recv(1)
            if os.fork() == 0:
                control.close()
                enter_case()
                channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                channel.connect(address)
                restrict_case(channel.detach())
                with socket.socket(fileno=3) as channel:
                    channel.sendall(b"r")  # restricted: check me
                    channel.recv(1)  # checked: go on
                    channel.sendall(json.dumps(_probe(grader_pid, port, code, first)).encode())
                    channel.recv(1)
                os._exit(0)
        control.recv(1)  # alive until the host has checked both cases
        os._exit(0)
    theirs.close()
    findings, inodes, problems = {}, [], []
    mounts = expected_mounts()
    relay = f"pipe:[{os.fstat(read_end).st_ino}]"
    for _ in range(2):
        ours.send(b"c")  # the first case is killed, and gone, before the second is forked
        channel, _ = listener.accept()
        pid = peer(channel)
        channel.settimeout(30)
        channel.recv(1)
        problems += case_problems(pid, server, relay, mounts)
        channel.sendall(b"g")
        said = b""
        while not said.endswith(b"}"):
            said += channel.recv(65536) or b"}"
        found = json.loads(said)
        inodes.append(found.pop("inode"))
        for what, held in found.items():
            findings[what] = findings.get(what, False) or held
        os.kill(pid, signal.SIGKILL)
        channel.close()
        deadline = time.monotonic() + 2
        while others({os.getpid(), server}) and time.monotonic() < deadline:
            time.sleep(0.001)
    findings["told apart by inode numbers"] = len(set(inodes)) > 1
    findings["left a process running"] = bool(others({os.getpid(), server}))
    findings["failed the host's checks"] = problems or False
    os.kill(server, signal.SIGKILL)
    return findings


if __name__ == "__main__":
    print(json.dumps(_self_test_cases(sys.argv[1:])), flush=True)
