"""What every case shares without being given it (issue 41, classes 2 and 3): a shared mapping
the fork server held when it forked them (`tests/sandbox/redteam/os_shared_map.py`), and the
machine's page cache of the files they all read (`tests/sandbox/redteam/os_page_cache.py`), through
the command line, sandboxed (each finds nothing, or is refused naming the policy) and not (each
works, so the test can fail); and the seccomp filters' verdicts on the page cache's calls, argument
by argument, on both architectures. The harness is `tests/sandbox/sandbox_harness.py`.

The page cache's medium is a file in the attacks' own package (`medium`), which every case of
every entry graded from it reads; each grading gets slots of its own, in a block of it no other
grading here has, evicted by the test before it (`_fresh_slots`), so a run finds no bits an
earlier one left.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import re
import struct
from pathlib import Path

import pytest

from tests.sandbox.sandbox_harness import (  # noqa: F401
    PLACEHOLDER, REDTEAM, ROOT, SANDBOX, TASKS, _one_matplotlib_cache, all_refund, attack, grading,
    headline)

CALLS = ("mincore", "cachestat", "preadv2", "fadvise64", "madvise", "getrusage", "io_setup")
SLOTS, SPACING = 16, 1 << 17  # as tests/sandbox/redteam/os_page_cache.py reads them (and a spare)
BLOCK, BLOCKS = 32 * SPACING, 8  # the slots of a grading and their spare page lie in one block


# ----------------------------------------------------------------- class 2: shared mappings
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_read_only_shared_mapping_made_at_import_is_refused(tmp_path, sandbox):
    """Every case would make it writable and count the cases before it: the import is refused,
    named, before any case is told anything."""
    grading(sandbox)
    spec = attack(tmp_path, "os_shared_map", "Counter", MODE="IMPORT")
    run = headline(tmp_path, [spec], sandbox, workers=1)
    assert run.code == 2 and not run.rows(), run
    assert (f"{spec} could not be loaded: importing it left shared read-only mappings open "
            "(anonymous)") in run.stderr, run
    assert "failed on task" not in run.stderr, run


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_shared_mapping_a_hook_makes_after_the_import_fails_every_cases_check(tmp_path,
                                                                                 sandbox):
    """A hook of the import's maps it in the fork server before the first fork, after the import
    was checked: sandboxed, the host's check of the first case refuses it and no case plays;
    unsandboxed (nothing checks a case) every case after the first counts."""
    grading(sandbox)
    spec = attack(tmp_path, "os_shared_map", "Counter", MODE="AT_FORK")
    run = headline(tmp_path, [spec], sandbox, workers=1)
    if sandbox == "on":
        assert run.code == 2 and not run.rows(), run
        assert re.search(rf"{re.escape(spec)}.* failed on task \S+ seed 0: the case did not "
                         r"start isolated: it holds 1 shared mapping\(s\) that can be written "
                         r"\(anonymous\)", run.stderr), run
    else:
        assert run.code == 0, run
        assert run.dispositions(spec) == {"refund": 1, "ship": TASKS - 1}, run.dispositions(spec)


READ_ONLY_FILE = '''import ctypes
import mmap
import os

from agents.scripted import FinalityGate

libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long)
own = os.open(__file__, os.O_RDONLY)  # its own file, mapped shared and read-only
MAPPED = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, own, 0)
os.close(own)


class MapsItsFile(FinalityGate):
    name = "maps_its_file"

    def plan(self):
        assert ctypes.string_at(MAPPED, 6) == b"import"
        yield from super().plan()
'''


def test_a_file_mapped_shared_and_read_only_is_no_shared_mapping_that_can_be_written(tmp_path):
    """A file opened read-only and mapped shared (as the C library maps its gconv cache in
    every process) can never be written, mprotect or not (the kernel maps it as private): it
    passes both checks and plays."""
    grading("on")
    path = tmp_path / "policy" / "maps_its_file.py"
    path.parent.mkdir()
    path.write_text(READ_ONLY_FILE)
    spec = f"{path}:MapsItsFile"
    run = headline(tmp_path, [spec], "on", workers=1)
    assert run.code == 0 and len(run.rows()) == TASKS, run


# ----------------------------------------------------------------- class 3: the page cache
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)


def _cached(fd: int, offsets: list[int]) -> list[int]:
    """Which of the pages at `offsets` of the file `fd` are cached (mincore, in this process)."""
    found = []
    for offset in offsets:
        address = _libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, offset)
        vector = (ctypes.c_ubyte * 1)()
        assert _libc.mincore(ctypes.c_void_p(address), mmap.PAGESIZE, vector) == 0
        _libc.munmap(ctypes.c_void_p(address), mmap.PAGESIZE)
        found.append(vector[0] & 1)
    return found


@pytest.fixture(scope="module")
def medium(tmp_path_factory) -> Path:
    """The package the page-cache attacks are graded as (`MODULE:CLASS`), and in it the file
    they all read, `medium.bin`: the sandbox shows the whole package to every case of every
    entry in it, and no other process of the machine reads the file (a library of the venv
    would do as well as a channel, but another process's use of it would set bits)."""
    package = tmp_path_factory.mktemp("page-cache") / f"finality_page_cache_{os.getpid()}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    with open(package / "medium.bin", "wb") as medium:
        medium.write(b"\1" * BLOCKS * BLOCK)
        os.fsync(medium.fileno())  # clean pages, which advice can evict
    return package


def _fresh_slots(medium: Path, sandbox: str) -> int:
    """The offset of a block of the medium that no grading here has had, its slots and spare
    page evicted here (and checked, unsandboxed: the attack needs a clean start to work)."""
    fd = os.open(medium / "medium.bin", os.O_RDONLY)
    try:
        for block in random.sample(sorted(set(range(BLOCKS)) - _TAKEN), 1):
            _TAKEN.add(block)
            os.posix_fadvise(fd, block * BLOCK, BLOCK, os.POSIX_FADV_DONTNEED)
            if sandbox == "off" and any(
                    _cached(fd, [block * BLOCK + i * SPACING for i in range(SLOTS + 2)])):
                pytest.skip(f"the page cache of {medium}'s filesystem keeps pages advice "
                            "cannot evict (a tmpfs?): the attack cannot work there")
            return block * BLOCK
    finally:
        os.close(fd)


_TAKEN: set[int] = set()  # the blocks of the medium a grading here has had


def _pattern() -> list[int]:
    """The slots to mark: half of them, drawn (neither none nor every slot cached reads as it)."""
    marked = random.sample(range(SLOTS), SLOTS // 2)
    return [int(i in marked) for i in range(SLOTS)]


def _channel(medium: Path, name: str, offset: int, pattern: list[int], role: str) -> str:
    """The spec of tests/sandbox/redteam/os_page_cache.py as the module `name` of the package, its
    values baked in (as `attack` bakes them)."""
    source = (REDTEAM / "os_page_cache.py").read_text()
    config = {"FILE": "medium.bin", "OFFSET": offset, "PATTERN": pattern, "ROLE": role}
    (medium / f"{name}.py").write_text(source.replace(PLACEHOLDER, f"CONFIG: dict = {config!r}"))
    return f"{medium.name}.{name}:PageCache"


def _worked(rows: list[dict], spec: str) -> tuple[set[str], set[str]]:
    """The calls os_page_cache said worked, in its cases and in its fork servers' imports."""
    ticks = {call[2] for row in rows if row["policy"] == spec for call in row["calls"]
             if call[1] == "wait"}
    return ({CALLS[t - 1] for t in ticks if t <= len(CALLS)},
            {CALLS[t - 1 - len(CALLS)] for t in ticks if t > len(CALLS)})


@pytest.fixture(scope="module")
def page_cache(tmp_path_factory, medium):
    """`page_cache(sandbox)`: two runs, graded when a test first asks. The first: a policy that
    reads and writes its own slots in every case (`both`), and two entries on other slots, one
    that only writes, one that only reads; the second run: that reader again, alone."""
    runs = {}

    def get(sandbox: str):
        if sandbox not in runs:
            base = tmp_path_factory.mktemp(f"page-cache-{sandbox}")
            found = {"PYTHONPATH": f"{ROOT}{os.pathsep}{medium.parent}"}
            specs = {"both": _channel(medium, f"both_{sandbox}", _fresh_slots(medium, sandbox),
                                      _pattern(), "both")}
            offset, pattern = _fresh_slots(medium, sandbox), _pattern()  # theirs, the same
            for role in ("write", "read"):
                specs[role] = _channel(medium, f"{role}_{sandbox}", offset, pattern, role)
            first = headline(base, list(specs.values()), sandbox, workers=1, env=found)
            second = headline(base, [specs["read"]], sandbox, out="second", workers=1,
                              env=found)
            runs[sandbox] = specs, first, second
        return runs[sandbox]
    return get


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_case_reads_the_page_cache_an_earlier_case_set(page_cache, sandbox):
    """Across the cases of one entry: sandboxed every query and every eviction fails (EPERM),
    in the cases and at import, and no case learns anything."""
    grading(sandbox)
    specs, run, _ = page_cache(sandbox)
    spec = specs["both"]
    in_cases, at_import = _worked(run.rows(), spec)
    if sandbox == "on":
        all_refund(run, spec)
        assert in_cases == at_import == set(), (in_cases, at_import)
    else:  # the first case finds nothing, and writes
        assert run.code == 0, run
        assert run.dispositions(spec) == {"refund": 1, "ship": TASKS - 1}, run.dispositions(spec)
        assert in_cases >= set(CALLS) - {"io_setup"}, in_cases  # (AIO may be off)
        assert at_import >= {"mincore", "cachestat", "preadv2", "getrusage"}, at_import


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_entry_reads_the_page_cache_another_entry_set(page_cache, sandbox):
    """Across entries: a reader graded beside a writer on the same slots (their cases in one
    random order), and again in a later run, alone."""
    grading(sandbox)
    specs, first, second = page_cache(sandbox)
    reader = specs["read"]
    if sandbox == "on":
        all_refund(first, specs["write"], reader)
        all_refund(second, reader)
        for run in (first, second):
            for spec in (specs["write"], reader):
                assert _worked(run.rows(), spec) == (set(), set()), _worked(run.rows(), spec)
    else:
        assert first.code == second.code == 0, (first, second)
        assert first.dispositions(specs["write"]) == {"refund": TASKS}
        assert first.dispositions(reader)["ship"] >= 1, first.dispositions(reader)
        assert second.dispositions(reader) == {"ship": TASKS}, second.dispositions(reader)
        assert "fadvise64" in _worked(first.rows(), specs["write"])[0]
        assert "mincore" in _worked(second.rows(), reader)[0]


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_chunk_reads_the_page_cache_an_earlier_chunk_set(medium, monkeypatch, sandbox):
    """Across chunks of one entry (a fresh fork server each): the second chunk's import and
    cases find nothing of what the first chunk's cases set. Two chunks of 6 jobs through one
    worker's cached policy."""
    grading(sandbox)
    import eval.grading.grader as grader
    monkeypatch.setenv("PYTHONPATH", str(medium.parent))
    spec = _channel(medium, f"chunks_{sandbox}", _fresh_slots(medium, sandbox), _pattern(),
                    "both")
    tasks = tuple(task.task_id for task in grader.load_corpus("public").tasks[:12])
    config = grader.RunConfig((spec,), seeds=(0,), tasks=tasks, sandbox=sandbox == "on")
    inputs = {spec: grader.input_identity(spec)}
    rows = []
    try:
        for chunk in (tasks[:6], tasks[6:]):
            lines, _, error = grader._run_chunk(
                grader.Chunk.of(config, [(spec, t, 0) for t in chunk], inputs))
            assert error is None and len(lines) == len(chunk), error
            rows.append([json.loads(line) for line in lines])
    finally:
        grader._close_external()
    second = [row["disposition"] for row in rows[1]]
    if sandbox == "on":
        assert second == ["refund"] * 6 and _worked(rows[1], spec) == (set(), set()), rows[1]
    else:  # the import of the second chunk learns it: every case ships
        assert second == ["ship"] * 6, second
        assert "mincore" in _worked(rows[1], spec)[1], rows[1]


# ----------------------------------------------------------------- the filters, call by call
def _verdict(program: list, machine: str, call: str, *args: int) -> str:
    """What the classic-BPF `program` answers to `call` with `args` on `machine`: run over a
    `struct seccomp_data` (nr, arch, instruction pointer, six 64-bit arguments, little-endian)."""
    from agents.sandbox.seccomp import _ARCH, NUMBERS
    data = struct.pack("<iIQ6Q", NUMBERS[machine][call], _ARCH[machine], 0,
                       *[a & (1 << 64) - 1 for a in (*args, 0, 0, 0, 0, 0, 0)[:6]])
    pc = accumulator = 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x06:  # ret
            return {0x7FFF0000: "allow", 0x00050001: "EPERM", 0x00050026: "ENOSYS",
                    0x80000000: "kill", 0x7FC00000: "the host answers"}[k]
        if code == 0x20:  # ld [k]: 32 bits of the data
            accumulator, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x54:  # and k
            accumulator, pc = accumulator & k, pc + 1
        else:  # jeq, jge, jset k
            taken = {0x15: accumulator == k, 0x35: accumulator >= k,
                     0x45: bool(accumulator & k)}[code]
            pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("which", ["case", "fork server"])
def test_the_filters_refuse_the_page_cache_calls_by_their_arguments(machine, which):
    """Both filters, both architectures: the queries and evictions fail with EPERM; madvise
    only with advice that evicts (malloc's MADV_DONTNEED goes on, whatever the argument's high
    word: the kernel reads an int), preadv2 and pwritev2 only with RWF_NOWAIT or RWF_DONTCACHE
    in their flags (their sixth argument, not the fifth); the rest as before."""
    from agents.sandbox.seccomp import DENIED, SERVER_DENIED, seccomp_program
    program = (seccomp_program(machine, DENIED) if which == "case"
               else seccomp_program(machine, SERVER_DENIED, processes=True))

    def verdict(call, *args):
        return _verdict(program, machine, call, *args)
    for call in ("mincore", "cachestat", "fadvise64", "process_madvise", "move_pages",
                 "getrusage", "io_setup", "io_submit", "ptrace", "bpf"):
        assert verdict(call) == "EPERM", call
    for advice, said in ((9, "EPERM"), (20, "EPERM"), (21, "EPERM"), (0x1_00000015, "EPERM"),
                         (4, "allow"), (8, "allow"), (14, "allow"), (0x1_00000004, "allow")):
        assert verdict("madvise", 0, 4096, advice) == said, advice
    for call in ("preadv2", "pwritev2"):
        for flags, said in ((0, "allow"), (1, "allow"), (4, "allow"), (8, "EPERM"),
                            (0x80, "EPERM"), (0x89, "EPERM")):
            assert verdict(call, 3, 0, 1, 0, 0, flags) == said, (call, flags)
        assert verdict(call, 3, 0, 1, 0, 8, 0) == "allow"  # RWF_NOWAIT in pos_h: not flags
    unix, inet, thread, pidfd = (1, 1), (2, 1), 0x10000, 0x1000
    server = which == "fork server"
    assert verdict("clone", thread) == ("the host answers" if server else "EPERM")
    assert verdict("clone", 0x11) == ("the host answers" if server else "EPERM")
    assert verdict("clone", 0x11 | pidfd) == "EPERM"  # a pidfd's number counts processes
    assert verdict("clone3") == "ENOSYS"  # the C library falls back to clone
    assert verdict("socket", *unix) == verdict("socket", *inet) == "EPERM"
    # what reads or advances a counter of the machine's, in both filters
    for call in ("pipe2", "memfd_create", "pidfd_open", "sysinfo", "umount2", "open_tree",
                 "move_mount", "statmount", "listmount", "name_to_handle_at"):
        assert verdict(call) == "EPERM", call
    assert verdict("statx", 3, 0, 0, 0x7FF) == "allow"  # what os.stat asks
    assert verdict("statx", 3, 0, 0, 0x7FF | 0x4000) == "EPERM"  # the unique mount id
    assert verdict("setns") == ("allow" if which == "fork server" else "EPERM")
    assert verdict("mount") == ("the host answers" if server else "EPERM")
    # locks and watches of a file two workers' cases both see; namespaces but the cases'
    assert verdict("flock") == verdict("inotify_init1") == "EPERM"
    for cmd, said in ((1, "allow"), (2, "allow"), (4, "allow"), (5, "EPERM"), (6, "EPERM"),
                      (37, "EPERM"), (1024, "EPERM"), (1026, "EPERM")):  # F_GETFD.. F_NOTIFY
        assert verdict("fcntl", 3, cmd) == said, cmd
    case_namespaces = 0x20000 | 0x20000000
    assert verdict("unshare", case_namespaces) == ("allow" if which == "fork server" else "EPERM")
    for flag in (0x80, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x40000000):
        assert verdict("unshare", case_namespaces | flag) == "EPERM", flag
        assert verdict("clone", 0x11 | flag) == "EPERM", flag
    assert verdict("close_range") == "allow"
