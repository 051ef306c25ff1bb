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
   package); no `$HOME`, no results folder; the grader's environment never passed.
2. The process the cases are forked from (the host's zygote) enters, once, a user and mount
   namespace of its own with `/proc` hidden (`isolate_worker`). Every case (`isolate_case`,
   called in the fork that plays it) then gets its own pid namespace (it is pid 1 and can name
   no other process: not the process it was forked from, not the host), no capability, a
   seccomp filter (no new process, only threads; no System V or POSIX message-queue IPC object,
   which outlive processes; no keyring, no ptrace, no mount) and resource limits (address
   space, file size, CPU time, open files). Its writable places are the scratch folder
   (`/scratch`, its `$TMPDIR` and `$HOME`) and `/dev/shm`, both size-capped tmpfs that the host
   empties after every case, before the next is forked (`wipe`); everything else, `/tmp` and
   `/dev` included, is read-only. Nothing a case writes or starts outlives it, and it can
   signal no process but itself. (Its sockets die with it: the network namespace of the
   policy's process, which has no route out, is enough.)

   Why not fresh user and mount namespaces per case, as before: they cost 5 ms a case here,
   and the seccomp filter built per case another 6 (Python touching its pages in a fresh
   fork); the namespaces and the filter are now made once, and a case pays for its pid
   namespace and one more fork only (`benchmarks/outside_policy.py`).

`unavailable()` says what is missing where the sandbox cannot start (no `bwrap`, user
namespaces disabled); `self_test()` proves it from inside before the first case.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from .spec import ROOT

SUBMISSION = "/submission"  # where a policy file is shown inside the sandbox
# A case's writable scratch space ($TMPDIR, $HOME), private to it. /tmp itself is read-only (it
# may hold the repository or the interpreter: a clone under /tmp must keep working).
SCRATCH = "/scratch"
MEMORY_MB = 4096  # address space of a case; FINALITY_POLICY_MEMORY_MB changes it
FILE_MB = 64      # the largest file a case may write, and its /tmp and /dev/shm
OPEN_FILES = 256
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


def wipe() -> None:
    """Empty the places a case may write (the scratch folder, /dev/shm), after it ended and
    before the next is forked: no process of the ended case is left to write there (a case
    starts none), and nothing it wrote is read, only removed. Most cases write nothing; what
    one left is removed by `rm` (which handles any depth), its permissions given back first (a
    case may have taken its own write permission away from a folder)."""
    for place in (SCRATCH, "/dev/shm"):
        with os.scandir(place) as found:
            left = [entry.path for entry in found]
        if not left:
            continue
        subprocess.run(["chmod", "-R", "u+rwx", *left], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", *left], capture_output=True)
        if os.listdir(place):
            raise OSError(f"sandbox: could not empty {place} after a case")


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
            "case": "forked from a process in its own user and mount namespaces with /proc "
                    "hidden; own pid namespace; writable only $TMPDIR (/scratch) and /dev/shm, "
                    + ("64 MiB tmpfs each, " if _sizes_tmpfs() else "tmpfs (not size-capped: "
                       "bwrap older than 0.8), ")
                    + "emptied after every case; /tmp and /dev read-only; no new processes, "
                    "namespaces, mounts, System V or message-queue IPC, keyrings or ptrace "
                    "(seccomp)",
            "limits": limits()}


# ----------------------------------------------------------------------------- each case
_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_THREAD = 0x20000, 0x10000000, 0x20000000, 0x10000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 0x4000, 1 << 18


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox: {what}: {os.strerror(errno)}")


_PREPARED: dict = {}  # what isolate_worker made once, for every case forked after it


def isolate_worker() -> None:
    """Called once in the process the cases are forked from (the host's zygote, after the
    policy's import; single-threaded): a user and mount namespace of its own (the same user
    inside as outside: the host is never root, whose mapping would need CAP_SETFCAP), /proc
    hidden, the capability bounding set emptied, and every case's seccomp filter and limits
    built, so that a case pays only for what must be its own."""
    if platform.machine() not in _NUMBERS:
        raise OSError(f"sandbox: no seccomp filter for the {platform.machine()} architecture")
    if _PREPARED:
        return
    import resource
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
    _check(_libc.mount(b"tmpfs", b"/proc", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV,
                       b"size=4k"), "hiding /proc")
    PR_CAPBSET_DROP = 24
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: nothing to drop
    given = limits()
    program = seccomp_program(platform.machine())
    filters = (ctypes.c_ubyte * (8 * len(program)))(
        *b"".join(struct.pack("HBBI", *ins) for ins in program))
    _PREPARED.update(
        filters=filters,  # kept alive: the program below points into it
        program=struct.pack("HxxxxxxP", len(program), ctypes.addressof(filters)),
        limits=[(resource.RLIMIT_AS, given["memory_mb"] << 20),
                (resource.RLIMIT_FSIZE, given["file_mb"] << 20),
                (resource.RLIMIT_CPU, given["cpu_s"]),
                (resource.RLIMIT_NOFILE, given["open_files"]), (resource.RLIMIT_CORE, 0)],
        setrlimit=resource.setrlimit,
        capabilities=(struct.pack("Ii", 0x20080522, 0), bytes(24)))  # v3, this process: none


def isolate_case() -> None:
    """Called in the fork that will play a case, before it reads its brief: from here on this
    process is pid 1 of a pid namespace of its own (its parent waits for it and exits with its
    status), in /scratch, with no capability, the seccomp filter and the limits. Returns in
    that process; never in the parent. A process that did not run `isolate_worker` runs it
    first (the self-test's probe)."""
    isolate_worker()
    _check(_libc.unshare(CLONE_NEWPID), "unshare")
    pid = os.fork()  # the first child in a new pid namespace is its pid 1
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):  # end as it ended, for the host to say
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    os.chdir(SCRATCH)
    prepared = _PREPARED
    for which, value in prepared["limits"]:
        prepared["setrlimit"](which, (value, value))
    PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_NO_NEW_PRIVS = 47, 4, 38
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.syscall(_SYSCALLS["capset"], *prepared["capabilities"]),
           "dropping capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prepared["program"], 0, 0),
           "seccomp")


# The system calls a case may not make (numbers per architecture). Processes: only threads
# (clone with CLONE_THREAD; clone3 says ENOSYS so that the C library falls back to clone).
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NUMBERS = {
    "x86_64": {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "add_key": 248,
               "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308, "mount": 165,
               "umount2": 166, "pivot_root": 155, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "io_uring_setup": 425, "capset": 126, "shmget": 29,
               "semget": 64, "msgget": 68, "mq_open": 240},
    "aarch64": {"clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "add_key": 217, "request_key": 218, "keyctl": 219,
                "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
                "capset": 91, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180},
}
_SYSCALLS = _NUMBERS.get(platform.machine(), {})
_DENIED = ("fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "add_key",
           "request_key", "keyctl", "unshare", "setns", "mount", "umount2", "pivot_root",
           "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "shmget", "semget",
           "msgget", "mq_open")


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: (code, jt, jf, k) instructions over `struct seccomp_data`."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    numbers = _NUMBERS[machine]
    denied = [numbers[name] for name in _DENIED if name in numbers]
    program = [(ld, 0, 0, 4), (jeq, 1, 0, _ARCH[machine]), (ret, 0, 0, kill),  # the arch
               (ld, 0, 0, 0),                                                     # the call
               (jge, 0, 1, 0x40000000) if machine == "x86_64" else (jeq, 0, 1, 0xFFFFFFFF),
               (ret, 0, 0, kill)]                                                 # x32 calls
    for nr in denied:
        program += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys),
                (jeq, 0, 4, numbers["clone"]), (ld, 0, 0, 16),  # clone's flags (low word)
                (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return program + [(ret, 0, 0, allow)]


# ---------------------------------------------------------------------------- self-test
class SandboxError(ValueError):
    """The sandbox cannot start here, or failed its self-test: nothing was graded."""


def self_test() -> dict:
    """Prove the sandbox from inside before the first case: a case started as a policy's
    would be can see no process of the grader, write nowhere but its scratch folder, and reach no
    listener the grader holds on the loopback. Returns the layers in force; raises if one of
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
               "FINALITY_POLICY_TIMEOUT": os.environ.get("FINALITY_POLICY_TIMEOUT", "10")}
        done = subprocess.run(command(argv, {}, env), capture_output=True, text=True,
                              timeout=60)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise SandboxError(f"the sandbox's self-test did not run: {done.stderr.strip()[-300:]}")
    broken = [what for what, held in found.items() if held]
    if broken:
        raise SandboxError(f"the sandbox's self-test failed: from inside a case it {broken}")
    return layers()


def _probe(grader_pid: int, port: int, code: str) -> dict:
    """Run inside a case: what it can reach that it must not."""
    isolate_case()
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
    return found


if __name__ == "__main__":
    # a case is a fork of a host that has imported the project's code (and its threads): so is
    # the probe
    if os.fork() == 0:
        print(json.dumps(_probe(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])), flush=True)
        os._exit(0)
    os.wait()
