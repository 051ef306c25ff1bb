"""What the host checks of a case from /proc before it hands the case its brief: that the process
that connected (`peer`) is pid 1 of its own pid namespace, with exactly the sandbox's mounts, its
writable places on filesystems of its own, no capability, the limits, one thread, only its own
descriptors and no shared mapping that can be written (`case_problems`); what the fork server's
import left that every case would inherit (`server_state`, `left_by_import`: the fork server
sees no /proc of its own); and that no process but the host, the fork server and the case runs
in the sandbox (`others`). This is kernel state,
read by the host, which never imports the policy: what the fork server and the case did to
confine themselves (`agents/sandbox/isolation.py`) runs in memory the policy's code shares, so it is
checked here, not believed.

A shared mapping the fork server held when a case was forked is every case's: one that can be
written is refused read-only too, since a case can make it writable again (mprotect) and leave
in it what the next case reads (`writable_shared`: the kernel's own word, `mw`, may write).
What cannot be written (a file opened read-only and mapped shared, which the kernel maps as
private: the C library's gconv cache, which every Python process holds) carries nothing a read
of the file would not.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from functools import lru_cache
from pathlib import Path

from .bwrap import SCRATCH, sizes_tmpfs
from .limits import FILE_MB, limits


def peer(channel: socket.socket) -> int:
    """The process id, as this process sees it, of what connected on `channel`."""
    return struct.unpack("3i", channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


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


def _places_sized(pid: int) -> bool:
    """Whether the case's own places (the top scratch folder and /dev/shm) have the case's
    size, as the kernel mounted them (the options a starter passed were checked as strings;
    these are what the kernel made of them)."""
    if not sizes_tmpfs():
        return True
    top = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        top[fields[4]] = fields[-1].split(",")  # the last mount of a point is on top
    return all(f"size={FILE_MB << 10}k" in top.get(place, []) for place in (SCRATCH, "/dev/shm"))


def orphaned(pid: int, seconds: float) -> bool:
    """Whether the case `pid` is, or within `seconds` becomes, a child of the sandbox's init:
    its starter gone, so no process of the policy's takes its exit status."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if _status(pid).get("PPid", "").strip() == "1":
                return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def expected_mounts() -> list[str]:
    """The mount points a case must have, as the host sees its own: the sandbox's, then the
    fork server's private tmpfs (scratch, /dev/shm) and hidden /proc, then the case's own
    fresh tmpfs (scratch, /dev/shm)."""
    return sorted([point for point, _ in _mounts("self")]
                  + [SCRATCH, "/dev/shm", "/proc", SCRATCH, "/dev/shm"])


def server_state(pid: int) -> dict:
    """What the fork server `pid` holds that could carry something from one fork of it to the
    next, read from /proc before and after its import (it sees no /proc of its own once the
    sandbox is on): its threads, its file descriptors, its shared mappings that can be written
    (read-only ones too: a case can make them writable again, `writable_shared`), its native
    signal handlers, its namespaces, root, working directory and mounts (a filesystem mounted
    at import would be every case's). Python's own handlers and hooks it checks itself."""
    shared = writable_shared(pid)
    status = _status(pid)
    fds = set()
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds.add((int(f), os.readlink(f"/proc/{pid}/fd/{f}")))
        except OSError:  # closed while we looked
            continue
    return {
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "file descriptors": fds,
        "shared writable mappings": {mapped(line) for line in shared
                                     if line.split()[1][1:2] == b"w"},
        "shared read-only mappings": {mapped(line) for line in shared
                                      if line.split()[1][1:2] != b"w"},
        "signal handlers": (status.get("SigCgt", "").strip(), status.get("SigIgn", "").strip()),
        "namespaces": (tuple(os.readlink(f"/proc/{pid}/ns/{ns}")
                             for ns in sorted(os.listdir(f"/proc/{pid}/ns"))),
                       os.readlink(f"/proc/{pid}/root"), os.readlink(f"/proc/{pid}/cwd")),
        "mounts": Path(f"/proc/{pid}/mountinfo").read_text(),
    }


def left_by_import(before: dict, after: dict) -> list[str]:
    """What importing the policy left that every case would share (nothing is allowed)."""
    found = []
    if after["threads"] > before["threads"]:
        found.append(f"{after['threads'] - before['threads']} thread(s) running")
    if extra := after["file descriptors"] - before["file descriptors"]:
        found.append(f"file descriptors open ({', '.join(str(f) for f, _ in sorted(extra))})")
    for kind in ("shared writable mappings", "shared read-only mappings"):
        if extra := after[kind] - before[kind]:
            found.append(f"{kind} open ({', '.join(map(str, sorted(extra)))})")
    if after["signal handlers"] != before["signal handlers"]:
        found.append("signal handlers set")
    if after["namespaces"] != before["namespaces"]:
        found.append("its namespaces, root or working directory changed")
    if after["mounts"] != before["mounts"]:
        found.append("its mounts changed")
    return found


def case_problems(pid: int, server: int, relay: str, mounts: list[str]) -> list[str]:
    """What is wrong with the process `pid` that connected as a case, checked by the host from
    /proc (kernel state, which no code of the policy's can forge) before the case is handed its
    brief: it must be pid 1 of its own pid namespace and lead a session of its own, in a mount
    namespace other than the fork server's (`server`), its working directory on its own scratch
    folder and its root the sandbox's, with exactly the `mounts` expected and its writable places on
    filesystems the fork server holds neither mounted nor open, under a seccomp filter with
    no_new_privs, no capability and the limits, one thread, only its own descriptors (0:
    /dev/null; 1, 2: the stderr relay `relay`; 3: its socket) and no shared mapping that can be
    written, read-only or not. The fork server runs the policy's code (hooks its import left),
    so whatever it and the case's own start did is checked here, not believed."""
    problems = []
    try:
        status = _status(pid)
        if status.get("NSpid", "").split()[-1:] != ["1"] or len(status["NSpid"].split()) < 2:
            problems.append("it is not pid 1 of a pid namespace of its own")
        if status.get("Seccomp") != "2" or status.get("NoNewPrivs") != "1":
            problems.append("it is not under the case's seccomp filter")
        if int(status.get("CapEff", "1"), 16) or int(status.get("CapPrm", "1"), 16):
            problems.append("it holds capabilities")
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        if stat[2] != str(pid) or stat[3] != str(pid):  # its process group and session
            problems.append("it is not in a session of its own (it could signal the sandbox's "
                            "processes by group)")
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
        cwd, root, mine = (os.stat(f"/proc/{pid}/cwd"), os.stat(f"/proc/{pid}/root"),
                           os.stat("/"))
        if "%d:%d" % (os.major(cwd.st_dev), os.minor(cwd.st_dev)) != top.get(SCRATCH) or (
                root.st_dev, root.st_ino) != (mine.st_dev, mine.st_ino):
            problems.append("its working directory or root is not its own")
        if not _places_sized(pid):
            problems.append("its scratch folder or /dev/shm is not sized as a case's")
        if status.get("PPid", "").strip() != "1":
            problems.append("its starter is still running (it would take its exit status)")
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
        if _shared(pid) - _unwritable_own() and (held := writable_shared(pid)):
            problems.append(f"it holds {len(held)} shared mapping(s) that can be written "
                            f"({', '.join(sorted({mapped(line) for line in held}))})")
    except (OSError, KeyError, ValueError) as exc:
        problems.append(f"it could not be checked ({exc})")
    return problems


def _shared(pid: int | str) -> set[bytes]:
    """The lines of a process's /proc/PID/maps that map something shared (`r--s`, `rw-s`, ...)."""
    return {line for line in Path(f"/proc/{pid}/maps").read_bytes().splitlines()
            if line.split(maxsplit=2)[1].endswith(b"s")}


def writable_shared(pid: int | str) -> set[bytes]:
    """The lines (as /proc/PID/maps shows them) of a process's shared mappings that can be
    written, now or once mprotect makes them writable: `mw` (may write) among their flags in
    /proc/PID/smaps. A file opened read-only and mapped shared has none: nothing can write it."""
    found, line = set(), b""
    for entry in Path(f"/proc/{pid}/smaps").read_bytes().splitlines():
        if not entry.split(maxsplit=1)[0].endswith(b":"):  # a mapping's line, as in the maps
            line = entry
        elif entry.startswith(b"VmFlags:") and b"mw" in entry.split():
            found.add(line)
    return {line for line in found if line.split(maxsplit=2)[1].endswith(b"s")}


@lru_cache(maxsize=1)
def _unwritable_own() -> frozenset[bytes]:
    """The shared mappings of this process (the host, or the self-test's checker: neither runs
    the policy's code) that cannot be written: the C library's gconv cache. Every case inherits
    them unchanged, at the same address, through the fork server; a line the same as one of
    them maps the same file at the same place, a file no process of the sandbox can open for
    writing (all it may write is tmpfs of its own). So a case whose shared mappings are all
    among these has only its maps read; another has its smaps read too (a millisecond or two
    against a quarter of one)."""
    return frozenset(_shared("self") - writable_shared("self"))


def mapped(line: bytes) -> str:
    """What a line of /proc/PID/maps maps: a file, or anonymous memory (shown as /dev/zero)."""
    name = " ".join(line.decode(errors="replace").split()[5:])
    return "anonymous" if not name or name.startswith("/dev/zero") else name


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
