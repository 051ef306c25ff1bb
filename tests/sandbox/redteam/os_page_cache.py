"""Red team, the operating system: leave bits in the page cache for a later case to read.

The page cache is one for the whole machine: a file that every case of every entry may read
(a library of the venv or /usr, a file of the policy's own package) has its pages cached or
not, and a case can set that, page by page: a read caches a page, advice evicts it
(posix_fadvise DONTNEED, madvise MADV_PAGEOUT). Another process can then ask which pages are
cached (mincore, cachestat, a read that may not wait: preadv2 RWF_NOWAIT), in a later case of
the same chunk, of another chunk, of another entry, or of a later run, and at import in a later
chunk's fork server. This policy's slots are `len(PATTERN)` pages of `FILE` (beside this file,
unless absolute), 128 KiB apart past `OFFSET` (a read caches a few pages past the one asked
for, never the next slot): a writer (`ROLE` "write" or "both") evicts them all and reads those
`PATTERN` marks; a reader ("read" or "both") asks
which are cached, at import and in every case, and ships when it finds `PATTERN`, refunds when
not. Every case first says which calls worked, in the fork server's import and in itself: a
wait of `1 + i` ticks for the call `CALLS[i]` that worked in the case, of `1 + len(CALLS) + i`
for one that worked at import (the test reads them from the rows). A call "works" unless it
fails with EPERM, the filter's answer.

The test (tests/sandbox/test_shared_channels.py) copies this file into a package of its own, beside
the file it reads, as one module per entry, and bakes `FILE`, `OFFSET`, `PATTERN` and `ROLE`
into `CONFIG`.
"""

import ctypes
import errno
import mmap
import os
import platform
import resource

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here
CALLS = ("mincore", "cachestat", "preadv2", "fadvise64", "madvise", "getrusage", "io_setup")
SPACING = 1 << 17
FILE = os.path.join(os.path.dirname(__file__), CONFIG["FILE"])  # (an absolute one: as it is)
IO_SETUP = {"x86_64": (206, 207), "aarch64": (0, 1)}  # io_setup, io_destroy
CACHESTAT = 451
MADV_PAGEOUT = 21
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.syscall.restype = ctypes.c_long


def _slot(i: int) -> int:
    """Where slot `i` is: never at `OFFSET` itself, so that the page before every slot is one
    the writer evicted (a cached page just before a read makes the kernel read ahead)."""
    return CONFIG["OFFSET"] + (i + 1) * SPACING


def _spare() -> int:
    """A page past the slots, for the calls that would change what they hold."""
    return _slot(len(CONFIG["PATTERN"]) + 1)


def _failed(result: int) -> bool:
    """Whether a C call failed with the filter's EPERM (any other failure: it ran)."""
    return result == -1 and ctypes.get_errno() == errno.EPERM


def _mincore(fd: int, worked: set) -> list[int] | None:
    length = len(CONFIG["PATTERN"]) * SPACING
    address = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, _slot(0))
    vector = (ctypes.c_ubyte * (length // mmap.PAGESIZE))()
    try:
        if _failed(_libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vector)):
            return None
    finally:
        _libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(length))
    worked.add("mincore")
    return [vector[i * SPACING // mmap.PAGESIZE] & 1 for i in range(len(CONFIG["PATTERN"]))]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def _cachestat(fd: int, worked: set) -> list[int] | None:
    found = []
    for i in range(len(CONFIG["PATTERN"])):
        span, stat = (ctypes.c_uint64 * 2)(_slot(i), mmap.PAGESIZE), _Stat()
        if _failed(_libc.syscall(CACHESTAT, fd, span, ctypes.byref(stat), 0)):
            return None
        found.append(int(stat.cache > 0))
    worked.add("cachestat")
    return found


def _nowait(fd: int, worked: set, slots: list[int]) -> list[int] | None:
    """Whether each page at `slots` is cached, by a read that may not wait (it starts the read
    of what is not: the slots it asks about are cached after it)."""
    found = []
    for offset in slots:
        try:
            os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT)
            found.append(1)
        except PermissionError:
            return None
        except OSError:  # EAGAIN: not cached
            found.append(0)
    worked.add("preadv2")
    return found


def read_channel(worked: set) -> bool:
    """Whether the slots hold `PATTERN`, asked with the first query that works; every query is
    tried (the read that may not wait on a spare page only, unless it is the one that works)."""
    fd = os.open(FILE, os.O_RDONLY)
    try:
        held, stat = _mincore(fd, worked), _cachestat(fd, worked)
        held = stat if held is None else held
        if _nowait(fd, worked, [_spare()]) is not None and held is None:
            held = _nowait(fd, worked, [_slot(i) for i in range(len(CONFIG["PATTERN"]))])
        return held == list(CONFIG["PATTERN"])
    finally:
        os.close(fd)


def write_channel(worked: set) -> None:
    """Evict every slot (posix_fadvise; madvise MADV_PAGEOUT is tried on a spare page), then
    read the slots `PATTERN` marks."""
    fd = os.open(FILE, os.O_RDONLY)
    try:
        try:
            for i in range(len(CONFIG["PATTERN"])):
                os.posix_fadvise(fd, _slot(i), mmap.PAGESIZE, os.POSIX_FADV_DONTNEED)
            worked.add("fadvise64")
        except PermissionError:
            pass
        with mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ, offset=_spare()) as page:
            page.madvise(mmap.MADV_RANDOM)  # only this page, no read around it
            page[0]
            try:
                page.madvise(MADV_PAGEOUT)
                worked.add("madvise")
            except PermissionError:
                pass
        for i, mark in enumerate(CONFIG["PATTERN"]):
            if mark:
                os.pread(fd, 1, _slot(i))
    finally:
        os.close(fd)


def other_calls(worked: set) -> None:
    """The counters of a process's own reads (getrusage: a read from the disk counts blocks
    and a major fault), and Linux AIO (io_setup), which could ask RWF_NOWAIT unseen."""
    try:
        resource.getrusage(resource.RUSAGE_SELF)
        worked.add("getrusage")
    except PermissionError:
        pass
    setup, destroy = IO_SETUP[platform.machine()]
    context = ctypes.c_ulong(0)
    if not _failed(_libc.syscall(setup, 1, ctypes.byref(context))):
        worked.add("io_setup")
        _libc.syscall(destroy, context)


AT_IMPORT: set = set()  # the calls that worked in the fork server, at import
other_calls(AT_IMPORT)
LEARNED_AT_IMPORT = CONFIG["ROLE"] != "write" and read_channel(AT_IMPORT)


class PageCache(Policy):
    name = "redteam_page_cache"

    def plan(self):
        worked: set = set()
        learned = CONFIG["ROLE"] != "write" and read_channel(worked)
        if CONFIG["ROLE"] != "read":
            write_channel(worked)
        other_calls(worked)
        for i, call in enumerate(CALLS):
            if call in worked:
                yield ("wait", {"ticks": 1 + i})
        for i, call in enumerate(CALLS):
            if call in AT_IMPORT:
                yield ("wait", {"ticks": 1 + len(CALLS) + i})
        yield ("ship", {}) if learned or LEARNED_AT_IMPORT else ("refund", {})
