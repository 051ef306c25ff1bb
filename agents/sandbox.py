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
   tmpfs for what the import writes, the host's folder read-only, /proc hidden (the host reads
   the fork server's state from its own), a case's address-space limit, its own seccomp filter
   (no ptrace, no reading another process's memory or descriptors, no IPC object that outlives
   it, no new socket at all: its cases' channels are made before the filter, and the one
   listener is the host's; no pipe, memfd, pidfd, sysinfo or mount id, whose numbers are
   counters of the whole machine; no unmount; no query or eviction of the page cache) and no
   capability (`enter_worker`); every clone, fork and mount after that filter waits for the
   host's answer (`agents/supervisor.py`). This is kernel state: the import, and the hooks it may leave
   in the fork server (which runs them before every fork), can change the fork server's
   memory, never this. After the import it enters the user namespace it made for its cases
   before the import, and a mount namespace of its own, where every mount made before the
   import is locked: nothing run there can uncover /proc (`isolate_worker`). Every case is two forks away from it: the
   first (`enter_case`) makes fresh pid and mount namespaces and mounts a fresh, size-capped
   tmpfs on the scratch folder (`/scratch`, the case's `$TMPDIR` and `$HOME`) and on
   `/dev/shm`, then forks the case as pid 1 of its namespace and exits; the case
   (`restrict_case`) connects its channel to the host, keeps only that socket and the capped stderr relay,
   then takes limits (address space, file size, CPU time, open files), drops every capability
   and takes the case filter (no new process or thread, which the host refuses too:
   `agents/supervisor.py`; no new socket; no System V or POSIX
   message-queue IPC object; no keyring, no ptrace, no mount, no namespace; no query or
   eviction of the page cache). Nothing of a writable place, not its times, modes, extended
   attributes or inode numbers, reaches the next case: each gets new ones. No socket, abstract
   or not, is shared between cases or with the fork server: none of them can listen.

   The host, which never imports the policy, checks every case from `/proc` before it hands it
   its brief (`case_problems`): pid 1 of a new pid namespace, a mount namespace of its own,
   exactly the expected mounts with its writable places on filesystems the fork
   server neither mounts nor holds open, no capability, the limits, one thread, only its own
   descriptors, no shared mapping that can be written, read-only or not (a case can make a
   read-only one writable with mprotect; a file opened read-only, which nothing can write,
   passes, as the C library's gconv cache in every process does). The steps above that run in
   the fork server's memory (the case's filter, say) a hostile import can undo; what the host
   checks, and the kernel state taken before the import, it cannot. The host ends each case by
   killing its pid namespace once the grader says the case ended, and refuses a policy whose
   import, or whose fork server, leaves any other process (`others`).

   The page cache is the machine's, and every case of every entry reads the same files (the
   interpreter, its libraries, the policy's own): which pages of a file are cached is state a
   case could set (a read caches a page, advice evicts it) and a later one read, in its chunk,
   in another chunk or entry, or in a later run. Both filters refuse what asks what is cached
   and what evicts (mincore, cachestat, fadvise, madvise's MADV_COLD, MADV_PAGEOUT and
   MADV_REMOVE, preadv2's RWF_NOWAIT and RWF_DONTCACHE, Linux AIO; `agents/seccomp.py` says
   which and why). The fork server's holds for every case whatever the import rewrites. What
   is left: a case still caches what it reads, and a read from the disk takes longer (40-300
   us against 1-3 us here: a later case that times its reads reads the bits). docs/trust.md
   says so.

   (A per-case user namespace and a seccomp filter built per case were measured at 11 ms a
   case and are made once in the fork server; a network namespace per case cost 1.5 ms more,
   and the fork server's filter does its work; fresh pid and mount namespaces and two tmpfs
   cost about 0.5 ms a case: `benchmarks/README.md`.)

Where each part lives: the bwrap command line, and where things are inside it, in
`agents/bwrap.py`; the steps the fork server and the cases take (`enter_worker`,
`isolate_worker`, `enter_case`, `restrict_case`) in `agents/isolation.py`, with the seccomp
filters of `agents/seccomp.py`; the host's checks from /proc (`case_problems`, `others`) in
`agents/case_checks.py`; the limits in `agents/limits.py`. Here: `unavailable()` says what is
missing where the sandbox cannot start (no `bwrap`, user namespaces disabled); `self_test()`
proves it from inside before the first case; `layers()` says what was in force.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .bwrap import HOSTDIR, SCRATCH, command, unavailable
from .case_checks import case_problems, expected_mounts, orphaned, others, peer
from .supervisor import Supervisor
from .isolation import close_range, enter_case, enter_worker, isolate_worker, restrict_case
from .limits import (MAX_LINE, STDERR_CASE, STDERR_TOTAL, TIMEOUT_VARIABLE, limits,
                     policy_timeout)
from .spec import ROOT


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
                    "hidden from before the policy's import (locked), its address space "
                    "limited from before the import, filtered itself (no ptrace, no reading of "
                    "other processes' memory or exit statuses, no socket, pipe or other object "
                    "numbered by a counter of the machine's); own pid and mount namespaces; "
                    "writable only $TMPDIR (/scratch) and /dev/shm, a fresh 64 MiB tmpfs each; "
                    "/tmp and /dev read-only; no new processes, threads, sockets, pipes, "
                    "namespaces, mounts, System V or message-queue IPC, keyrings or ptrace, no "
                    "file lock or watch, no query or eviction of the page cache, no counter of "
                    "the machine's (seccomp; every clone, fork and mount after the fork "
                    "server's filter answered by the host); a session of its own",
            "channel": "one socket per case, accepted by the host and checked from /proc "
                       "before the brief (pid namespace, filter, capabilities, descriptors, "
                       "no shared mapping that can be written); the case's pid namespace killed "
                       "at its end; no process but "
                       "the host and the fork server outlives a case",
            "output": f"protocol lines at most {MAX_LINE} bytes; standard error relayed up to "
                      f"{STDERR_CASE} bytes a case, {STDERR_TOTAL} a process",
            "limits": limits()}


class SandboxError(ValueError):
    """The sandbox cannot start here, or failed its self-test: nothing was graded."""


def self_test() -> dict:
    """Prove the sandbox from inside before the first case: two cases started as a policy's
    would be, through the same layers, each checked from /proc as the host checks it; the first
    leaves marks on its writable places (a file, times, mode bits, an extended attribute) and an
    abstract socket; from inside, a case can see no process of the grader, write nowhere but its
    scratch folder, reach no listener the grader holds on the loopback, start no process, ask
    what the page cache holds or evict from it, and the second sees nothing of the first (not
    even by the inode number of a new file). Returns the layers in force; raises if one of
    these holds."""
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
               TIMEOUT_VARIABLE: str(policy_timeout())}
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
    try:
        threading.Thread(target=lambda: None).start()
        found["started a thread"] = True
    except RuntimeError:
        found["started a thread"] = False
    new = Path(SCRATCH, "mark")
    new.write_text("x")
    found["inode"] = new.stat().st_ino
    try:  # none: no case can reach another's
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        abstract = None
    found["made a socket"] = abstract is not None
    found["queried or evicted the page cache"] = _page_cache_calls() or False
    found["reached a counter of the machine's"] = _counters() or False
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


def _page_cache_calls() -> list[str]:
    """The calls that ask what the page cache holds, or evict from it, that ran here (on a
    page of the interpreter); none may."""
    import ctypes
    import mmap
    import resource
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    fd = os.open(sys.executable, os.O_RDONLY)
    page = ctypes.c_void_p(libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd,
                                     0))
    calls = {"mincore": lambda: libc.mincore(page, mmap.PAGESIZE, (ctypes.c_ubyte * 1)()),
             "cachestat": lambda: libc.syscall(451, fd, (ctypes.c_uint64 * 2)(0, mmap.PAGESIZE),
                                               (ctypes.c_uint64 * 5)(), 0),
             "madvise (MADV_PAGEOUT)": lambda: libc.madvise(page, mmap.PAGESIZE, 21),
             "posix_fadvise": lambda: os.posix_fadvise(fd, 0, 1, os.POSIX_FADV_DONTNEED),
             "preadv2 (RWF_NOWAIT)": lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT),
             "getrusage": lambda: resource.getrusage(resource.RUSAGE_SELF)}
    ran = []
    for name, call in calls.items():
        try:
            if call() != -1:  # (a C call's -1: it failed, refused or not there)
                ran.append(name)
        except BlockingIOError:  # RWF_NOWAIT's answer: not cached
            ran.append(name)
        except OSError:  # refused, or not there: it told nothing
            pass
    os.close(fd)
    return ran


def _counters() -> list[str]:
    """The objects numbered by a counter of the whole machine that this case could make (a new
    pipe's or memfd's inode number, a pidfd's), or its memory and process counts; none may."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    calls = {"pipe": os.pipe, "memfd_create": lambda: os.memfd_create("probe"),
             "pidfd_open": lambda: os.pidfd_open(os.getpid()),
             "sysinfo": lambda: libc.sysinfo(ctypes.create_string_buffer(256))}
    ran = []
    for name, call in calls.items():
        try:
            if call() != -1:  # (a C call's -1: it failed)
                ran.append(name)
        except OSError:
            pass
    return ran


def _answer(clones: Supervisor) -> None:
    """Answer the fork server's clones until it is gone."""
    watch = select.poll()
    watch.register(clones.fd, select.POLLIN)
    while all(event & select.POLLIN for _, event in watch.poll()):
        clones.answer()


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
        close_range(4)
        channels = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        cases, clones = enter_worker()  # (no socket can be made after it: made before)
        control = socket.socket(fileno=3)
        socket.send_fds(control, [b"i"], [clones])
        os.close(clones)
        isolate_worker(cases)
        for first, channel in ((True, channels[0]), (False, channels[1])):
            control.recv(1)
            if os.fork() == 0:
                control.close()
                enter_case()
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
    _, passed, _, _ = socket.recv_fds(ours, 1, 1)  # the fork server's clones, answered here
    clones = Supervisor(passed[0], server)
    threading.Thread(target=_answer, args=(clones,), daemon=True).start()
    findings, inodes, problems = {}, [], []
    mounts = expected_mounts()
    relay = f"pipe:[{os.fstat(read_end).st_ino}]"
    for _ in range(2):
        ours.send(b"c")  # the first case is killed, and gone, before the second is forked
        channel, _ = listener.accept()
        pid = peer(channel)
        channel.settimeout(30)
        channel.recv(1)
        orphaned(pid, 2)
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
