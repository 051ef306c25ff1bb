"""Whether the sandbox of this room (its layers: `agents/sandbox/__init__.py`) can run here and
whether it holds: `unavailable()` says what is missing where it cannot start (no `bwrap`, user
namespaces disabled); `self_test()` proves it from inside before the first case of a grading
(`python -m agents.sandbox.self_test` is the inside half); `layers()` says what was in force, for
`run.json` and the report.
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
from ..spec import ROOT


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


def describe(sandbox) -> str:
    """A run's sandbox (its manifest's `sandbox`: `layers()`, or a sentence such as `off`) as
    one line a reader takes in at a glance: the layers in words and the limits. The manifest
    keeps every layer's full description."""
    if not isinstance(sandbox, dict):
        return str(sandbox)
    limits_ = sandbox.get("limits") or {}
    bounds = ", ".join(f"{limits_[key]} {unit}" for key, unit in (
        ("memory_mb", "MB of memory"), ("file_mb", "MB a file"), ("cpu_s", "s of CPU"),
        ("open_files", "open files")) if key in limits_)
    return (f"{sandbox.get('tool') or 'bubblewrap'}: the policy's process in its own namespaces "
            "without network or capabilities, its files read-only; each case forked into its "
            "own pid and mount namespaces under a seccomp filter, writing only a scratch "
            "folder; one checked socket a case, its output capped"
            + (f"; at most {bounds} a case" if bounds else ""))


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
        argv = [sys.executable, "-m", "agents.sandbox.self_test", str(os.getpid()), str(port),
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
