"""A private grade that nothing leaks, the attacks of issue 41 on the path of a leaderboard entry
(`eval submit`, `eval verify`, `eval leaderboard`) and on the job order, with the sandbox on:

- the host imports no file of the submission, whatever name Python imports on its own
  (`tests/sandbox/redteam/host_import.py` as `sitecustomize` and as the package `org`);
- the page never publishes a policy's own words once grading began (a bundle that loaded when
  checked and fails to load when graded);
- a case that counts the cases before it (`tests/sandbox/redteam/os_place.py`) learns its place in
  an order drawn at random, nothing of its job;
- no case and no import reaches a counter of the whole machine
  (`tests/sandbox/redteam/os_counter.py`: the inode numbers of new pipes, sockets, memfds and
  pidfds, sysinfo, unique mount ids, /proc);
- the fork server's own code, run again before every fork, cannot uncover /proc
  (`tests/sandbox/redteam/os_uncover.py`);
- an import gets no more address space than a case (`tests/sandbox/redteam/os_import_memory.py`);
- no hook of the fork server makes a namespace but its cases' (a cgroup namespace showed the
  machine's hierarchy), and no case locks or watches a file another sees, or shares a session
  (`tests/sandbox/redteam/os_shared_state.py`);
- no case starts a thread or a process, whose process ids the fork server would count
  (`tests/sandbox/redteam/os_pid_relay.py`), no hook mounts a filesystem of its own
  (`tests/sandbox/redteam/os_mount.py`) or a case's with other options than the host read
  (`tests/sandbox/redteam/os_mount_options.py`), and no process of the policy's takes a case's exit
  status (`tests/sandbox/redteam/os_reaper.py`), and no case works in a folder another case saw
  (`tests/sandbox/redteam/os_cwd.py`).

Each attack acts on what it finds, so each test fails where the leak is open (they did on
8b36e67). The harness (`attack`, `headline`, the sandbox's skip-or-fail) is
`tests/sandbox/sandbox_harness.py`. Shared mappings and the page cache:
`tests/sandbox/test_shared_channels.py`; models that stall or flood the grader:
`tests/learned/test_model_bounds.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.__main__ import main as eval_cli
from eval.board.bundle import pack
from eval.grading.grader import CHUNK
from eval.grading.runfolder import read_rows
from finality_gym import load_corpus
from finality_gym.corpus import new_master_seed

from agents.sandbox.limits import limits
from tests.sandbox.sandbox_harness import (  # noqa: F401
    REDTEAM, SANDBOX, TASKS, _one_matplotlib_cache, all_refund, attack, grading, headline,
    needs_sandbox)

PROTOCOL = ["--subset", "stratified", "--seeds", "1", "--workers", "1", "--no-progress"]
HOST_IMPORT = (REDTEAM / "host_import.py").read_bytes()


def _verify(base: Path, *bundles: Path) -> int:
    if not (base / "seed").exists():
        (base / "seed").write_text(f"{new_master_seed()}\n")
    return eval_cli(["verify", *map(str, bundles), "--master-seed-file", str(base / "seed"),
                     "--out", str(base / "board"), *PROTOCOL])


@pytest.mark.parametrize("name", ["sitecustomize", "org"])
def test_the_host_imports_no_module_of_the_submission(tmp_path, name):
    """`sitecustomize` is imported when an interpreter starts; `org` when `copy` is (the host
    imports it): first on the host's path, either would run in the host and tell every case of
    the ones before it. The host's path holds no file of the submission, so no case is told."""
    needs_sandbox()
    files = ({"sitecustomize.py": HOST_IMPORT} if name == "sitecustomize"
             else {"org/__init__.py": HOST_IMPORT})
    bundle = tmp_path / f"{name}.finality"
    bundle.write_bytes(pack({"name": name, "kind": "outside", "spec": f"{name}:Told"}, files))
    assert _verify(tmp_path, bundle) == 0
    entry = json.loads((tmp_path / "board" / "entries" / name / "entry.json").read_text())
    assert entry["status"] == "verified", entry
    for split in ("private", "public"):
        rows = read_rows(tmp_path / "board" / split / name / "episodes.jsonl")
        assert len(rows) == 48 and {r["disposition"] for r in rows} == {"refund"}, (
            split, sorted(r["disposition"] for r in rows))


SAYS_WHAT_IT_READ = b'''from finality_gym.policy import Policy

raise RuntimeError("private words 7a51 pri-00c0ffee: order 31337 settles")


class Fine(Policy):
    name = "fine"

    def plan(self):
        yield ("refund", {})
'''


def test_the_page_never_carries_a_policys_words_once_grading_began(tmp_path, monkeypatch):
    """A bundle that loaded when `verify` checked it and fails to load when it is graded, in
    words (as one that carried what a private case read back would: stood in for here by
    leaving out the check, so that its import fails only when graded): the board fails it, the
    operator gets its words, the page and its data fixed text."""
    needs_sandbox()
    import eval.board.verify as verify
    monkeypatch.setattr(verify, "check_loads", lambda bundle: None)
    bundle = tmp_path / "sayer.finality"
    bundle.write_bytes(pack({"name": "sayer", "kind": "outside", "spec": "sayer.py:Fine"},
                            {"sayer.py": SAYS_WHAT_IT_READ}))
    assert _verify(tmp_path, bundle) == 0
    entry = json.loads((tmp_path / "board" / "entries" / "sayer" / "entry.json").read_text())
    assert entry["status"] == "failed" and "private words 7a51" in entry["reason"], entry
    assert eval_cli(["leaderboard", str(tmp_path / "board"), "--out", str(tmp_path / "site")]) == 0
    for path in (tmp_path / "site").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"7a51" not in data and b"31337" not in data and b"pri-" not in data, path
    assert "could not be loaded when graded" in (tmp_path / "site" / "index.html").read_text()


def test_a_case_that_counts_learns_nothing_of_its_job(tmp_path):
    """Every task of the public split, one seed, one worker: three chunks. The canary counts
    the cases before it by process id and escalates where it counts itself in the second chunk.
    Its count works (about a chunk's worth of escalations); with chunks that were consecutive
    slices of the job order they would be the second slice's jobs, and in a random order they
    are spread over the run as chance spreads them."""
    needs_sandbox()
    tasks = load_corpus("public").tasks
    assert len(tasks) > 2 * CHUNK
    spec = attack(tmp_path, "os_place", "Place", CHUNK=CHUNK, CHUNK_INDEX=1)
    run = headline(tmp_path, [spec], "on", workers=1,
                   tasks=tuple(t.task_id for t in tasks))
    assert run.code == 0, run
    index = {t.task_id: i for i, t in enumerate(tasks)}
    found = sorted(index[r["task_id"]] for r in run.rows() if r["disposition"] == "escalate")
    assert CHUNK - 8 <= len(found) <= CHUNK + 8, (len(found), run)  # it counts
    second = [i for i in found if CHUNK <= i < 2 * CHUNK]
    # a random order: about CHUNK * CHUNK / len(tasks) (51 of 128) land there by chance; the
    # chance of 90 or more is below 1e-12
    assert len(second) < 90, (len(second), found)


@pytest.mark.parametrize("sandbox", SANDBOX)
@pytest.mark.parametrize("module,cls", [("os_counter", "Counter"), ("os_uncover", "Uncover"),
                                        ("os_import_memory", "ImportMemory"),
                                        ("os_shared_state", "SharedState")])
def test_no_case_or_import_reaches_a_counter_proc_or_memory_of_the_machine(tmp_path, sandbox,
                                                                           module, cls):
    """Each attack escalates where its channel (a counter of the machine's, /proc uncovered from
    the fork server, address space past a case's at import) is open and refunds where it is
    closed. Sandboxed, all are closed: every case refunds. Without the sandbox, each is open, so
    the test can fail (and did, sandboxed, on the tree before this one)."""
    grading(sandbox)
    spec = attack(tmp_path, module, cls, MB=limits()["memory_mb"] + 512)
    run = headline(tmp_path, [spec], sandbox, workers=1)
    if sandbox == "on":
        all_refund(run, spec)
    else:
        assert run.code == 0 and run.dispositions(spec) == {"escalate": TASKS}, run


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_case_tells_the_next_by_the_process_ids_it_takes(tmp_path, sandbox):
    """Each case takes process ids (threads, a process), and the next reads how many from its
    fork server's forks: it escalates where the case before it took any. Sandboxed, the host
    refuses a case every new task (the fork server's filter hands every clone to it), so none
    is told; without the sandbox most are (on an idle machine every case but the first two of
    its fork server, since the host forks a case before the one before it has played; on a busy
    one a few more cases are forked after their predecessor's threads ended, and refund)."""
    grading(sandbox)
    spec = attack(tmp_path, "os_pid_relay", "PidRelay")
    run = headline(tmp_path, [spec], sandbox, workers=1)
    if sandbox == "on":
        all_refund(run, spec)
    else:
        told = run.dispositions(spec)
        assert run.code == 0 and set(told) == {"refund", "escalate"}, run
        assert told["escalate"] >= TASKS // 2 and sum(told.values()) == TASKS, told


def test_no_hook_mounts_a_filesystem_of_its_own(tmp_path):
    """A hook in every case's starter tries to mount a 1 GiB tmpfs (memory no limit counts); the
    host answers every mount after the fork server's filter, and lets a starter mount only its
    case's two places, so every case refunds. (Without the sandbox no process of the policy's
    holds the capability to mount at all.)"""
    needs_sandbox()
    spec = attack(tmp_path, "os_mount", "Mount")
    run = headline(tmp_path, [spec], "on", workers=1)
    assert run.code == 0 and run.dispositions(spec) == {"refund": TASKS}, run


def test_no_process_of_the_policys_takes_a_cases_exit_status(tmp_path):
    """The fork server makes itself a subreaper and reaps the exit codes cases choose (each
    writes its last call on its channel itself, then exits), and gives cases a filter that lets
    them start a process: the fork server's filter refuses the subreaper, the host checks that
    a case's starter is gone before its brief (its parent is the sandbox's init) and takes no
    case for a starter, so every case refunds. (On the tree before, every case after the first
    escalated.)"""
    needs_sandbox()
    spec = attack(tmp_path, "os_reaper", "Reaper")
    run = headline(tmp_path, [spec], "on", workers=1)
    assert run.code == 0 and run.dispositions(spec) == {"refund": TASKS}, run


def test_a_cases_tmpfs_is_mounted_with_the_options_the_host_read(tmp_path):
    """The starter's mount options end on the page after the one the host read to: the host
    reads a string only where it ends in the mapping it starts in, so it refuses the mount,
    no case starts, and the run stops naming the policy; none of its cases wrote past its
    64 MiB. (On the tree before, every case wrote 80 MiB and escalated.)"""
    needs_sandbox()
    spec = attack(tmp_path, "os_mount_options", "MountOptions")
    run = headline(tmp_path, [spec], "on", workers=1,
                   tasks=("pub-000a-pending_settle", "pub-000b-pending_fail"))
    assert run.code == 2 and spec in run.stderr and not run.rows(), run


def test_no_case_works_in_a_folder_an_earlier_case_wrote(tmp_path):
    """The starter keeps its case's working directory in the fork server's own scratch folder,
    beneath the case's fresh one: the host checks that a case's working directory is on its own
    scratch folder and its root the sandbox's, so the first such case is refused, naming the
    policy, and no case reads what another wrote. (On the tree before, every case after the
    first escalated.)"""
    needs_sandbox()
    spec = attack(tmp_path, "os_cwd", "Cwd")
    run = headline(tmp_path, [spec], "on", workers=1)
    assert run.code == 2 and "working directory" in run.stderr, run
    assert run.dispositions(spec).get("escalate", 0) == 0, run
