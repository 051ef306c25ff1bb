"""The operating-system sandbox for outside policies (`python -m eval headline --sandbox on`, the
default): every attack of `tests/sandbox/redteam/os_*.py` on the grader's machine, through the
command line, unsandboxed (`--sandbox off`: each attack works) and sandboxed (each attack fails and
the run goes on); honest policies give the very same rows either way; the run records it.

The harness (`attack`, `headline`, the shared run of the attacks that let a run go on, the
sandbox's skip-or-fail) is `tests/sandbox/sandbox_harness.py`. The attacks that end the run
(killing the grader, or the process their case was forked from; the sandboxed memory hog) have runs
of their own. A run has one worker where an attack counts on it (files or a listener that one
worker's cases share; no orphaned worker grading on after its grader is killed); elsewhere the
command line's default.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sandbox.sandbox_harness import (  # noqa: F401
    PRIVATE_SEED, SANDBOX, TASKS, Attacks, Run, _one_matplotlib_cache, ptrace_restricted, sha,
    snapshot, all_refund, all_ship, attack, end_leftovers, grading, headline, needs_sandbox,
    private_ids, rarest_order_value)


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    """`attacks(sandbox)`: the module's one `Attacks` grading under that setting, graded when
    a test first asks for it."""
    graded: dict[str, Attacks] = {}
    failed: dict[str, BaseException] = {}

    def get(sandbox: str) -> Attacks:
        if sandbox in failed:  # the grading itself failed in an earlier test: said there
            pytest.fail(f"the attacks' grading under --sandbox {sandbox} failed: "
                        f"{failed[sandbox]!r}")
        if sandbox not in graded:
            graded[sandbox] = Attacks(tmp_path_factory.mktemp(f"attacks-{sandbox}"), sandbox)
            try:
                graded[sandbox].grade()
            except BaseException as exc:
                failed[sandbox] = exc
                raise
        return graded[sandbox]

    yield get
    for each in graded.values():
        each.clean()


# ----------------------------------------------------------------- 1-3: the grader's /proc
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_policy_reads_the_graders_command_line_environment_or_memory(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run = graded.run
    cmdline, environ, memory = (graded.specs[k] for k in ("cmdline", "environ", "memory"))
    found = [cmdline, environ] + ([] if sandbox == "off" and ptrace_restricted() else [memory])
    expected = {"refund": TASKS} if sandbox == "on" else {"ship": TASKS}
    assert run.code == 0, run
    assert {spec: run.dispositions(spec) for spec in found} == {spec: expected for spec in found}


def test_unsandboxed_a_policy_reads_a_private_graders_master_seed(tmp_path):
    """The attack on a private grading, shown unsandboxed (a private split is never graded so:
    see the next tests): a process that looks like one (`eval headline --split private
    --master-seed-file PATH`, FINALITY_MASTER_SEED in its environment) gives up its seed to a
    policy graded beside it, through its command line and the file it names (relative to its
    working directory), or through its environment."""
    seed = str(1 << 128 | secrets.randbits(128))  # a master seed as keygen draws it
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "seed.txt").write_text(seed + "\n")
    grader = f"{tmp_path}{os.sep}"
    cmdline = attack(tmp_path, "os_proc", "GraderCommandLine", GRADER=grader,
                     SEED_SHA=sha(seed))
    environ = attack(tmp_path, "os_proc", "GraderEnvironment",
                     SECRETS={"FINALITY_MASTER_SEED": sha(seed)})
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "-m", "eval", "headline",
         "--split", "private", "--master-seed-file", "secret/seed.txt", "--out",
         str(tmp_path / "private")], cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "FINALITY_MASTER_SEED": seed})
    try:
        run = headline(tmp_path, [cmdline, environ], "off")
    finally:
        decoy.kill()
        decoy.wait()
    assert run.code == 0, run
    assert run.dispositions(cmdline) == run.dispositions(environ) == {"ship": TASKS}, run


@pytest.mark.parametrize("given", ["file", "env"])
def test_a_sandboxed_private_grading_keeps_its_master_seed(tmp_path, given):
    needs_sandbox()  # needs the sandbox
    seed = str(1 << 128 | secrets.randbits(128))  # 39 digits: in no task id (hex)
    path = tmp_path / "secret" / "seed.txt"
    path.parent.mkdir()
    path.write_text(seed + "\n")
    grader = f"{tmp_path}{os.sep}"
    cmdline = attack(tmp_path, "os_proc", "GraderCommandLine", GRADER=grader,
                     SEED_SHA=sha(seed))
    environ = attack(tmp_path, "os_proc", "GraderEnvironment",
                     SECRETS={"FINALITY_MASTER_SEED": sha(seed)})
    run = headline(tmp_path, [cmdline, environ], "on", tasks=private_ids(int(seed)), extra=(
        "--split", "private", *(("--master-seed-file", str(path)) if given == "file" else ())),
        env={"FINALITY_MASTER_SEED": seed} if given == "env" else None)
    all_refund(run, cmdline, environ)
    assert seed not in run.stdout and seed not in run.stderr
    for written in run.out.iterdir():
        assert seed.encode() not in written.read_bytes(), written


@pytest.mark.parametrize("given", ["file", "env"])
def test_a_private_split_is_never_graded_unsandboxed(tmp_path, given):
    path = tmp_path / "seed.txt"
    path.write_text(f"{PRIVATE_SEED}\n")
    run = headline(tmp_path, ["agents.scripted:FinalityGate"], "off",
                   tasks=private_ids(PRIVATE_SEED),
                   extra=("--split", "private",
                          *(("--master-seed-file", str(path)) if given == "file" else ())),
                   env={"FINALITY_MASTER_SEED": str(PRIVATE_SEED)} if given == "env" else None)
    assert run.code == 2, run
    assert "sandbox" in run.stderr and "Traceback" not in run.stderr, run
    assert not run.rows()


# ----------------------------------------------------------------- 4: files that later cases read
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_file_a_case_leaves_reaches_a_later_case(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run, spec, left = graded.run, graded.specs["files"], graded.left
    if sandbox == "on":
        all_refund(run, spec)
        assert not left, f"markers left on the grader's disk: {sorted(left)}"
    else:
        assert run.code == 0, run
        assert run.dispositions(spec) == {"refund": 1, "ship": TASKS - 1}, run.dispositions(spec)
        assert left == set(graded.places)


# ----------------------------------------------------------------- 5: the network
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_policy_opens_a_network_connection(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run, spec = graded.run, graded.specs["network"]
    if sandbox == "on":
        all_refund(run, spec)
        assert graded.accepted == 0
    else:
        all_ship(run, spec)
        assert graded.accepted >= TASKS


# ----------------------------------------------------------------- 6: processes left behind
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_process_left_behind_edits_the_results_after_the_run(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run, spec, pids = graded.run, graded.specs["edits"], graded.pids["edits"]
    try:
        assert run.code == 0, run
        detached = run.dispositions(spec)["ship"]  # the cases of the rarest order value
        before = graded.before  # as the run ended
        deadline = run.ended + (6 if sandbox == "on" else 20)
        while time.monotonic() < deadline and snapshot(run.out) == before:
            time.sleep(0.2)
        after = snapshot(run.out)
    finally:
        leftovers = end_leftovers(pids, graded.policy_file("edits"))
    if sandbox == "on":
        assert detached == 0 and after == before and not leftovers
        assert not pids.exists()
    else:
        assert detached == graded.picked, run.dispositions(spec)
        assert after != before
        assert b"planted after the run" in after[Path("episodes.jsonl")]


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_process_left_behind_answers_a_later_case(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run, spec, pids = graded.run, graded.specs["socket"], graded.pids["socket"]
    try:
        time.sleep(max(0.0, run.ended + 0.5 - time.monotonic()))
    finally:
        leftovers = end_leftovers(pids, graded.policy_file("socket"))  # they end within 60 s
    assert run.code == 0, run
    found = run.dispositions(spec)
    if sandbox == "on":
        assert found == {"refund": TASKS} and not leftovers, found
        assert not pids.exists()
    else:  # the first case leaves a listener; a new one after 60 s, when the last has ended
        assert found["ship"] >= TASKS - 2, found


# ----------------------------------------------------------------- 7: signals
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_policy_kills_the_process_it_was_forked_from(tmp_path, sandbox):
    grading(sandbox)
    spec = attack(tmp_path, "os_signal", "KillParent")
    run = headline(tmp_path, [spec], sandbox)  # unsandboxed it ends its run: a run of its own
    if sandbox == "on":
        all_refund(run, spec)
        assert "Traceback" not in run.stderr, run
    else:  # the host is gone, so its case fails, named (it cannot even say it shipped: the
        # host alone speaks to the grader)
        assert run.code == 2, run
        assert re.search(rf"{re.escape(spec)}.* failed on task \S+ seed 0", run.stderr), run
        assert run.dispositions(spec).get("refund", 0) == 0, run.dispositions(spec)


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_policy_kills_the_grader(tmp_path, sandbox):
    grading(sandbox)
    spec = attack(tmp_path, "os_signal", "KillGrader", GRADER=f"{tmp_path}{os.sep}")
    # unsandboxed it ends its run: a run of its own, with one worker (a pool's worker would go
    # on grading its chunk, holding the output, after its grader was killed)
    run = headline(tmp_path, [spec], sandbox, workers=1)
    if sandbox == "on":
        all_refund(run, spec)
        assert "Traceback" not in run.stderr, run
    else:  # the grader itself was killed
        assert run.code == -signal.SIGKILL, run


# ----------------------------------------------------------------- 8-9: resources
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_policy_forks(attacks, sandbox):
    grading(sandbox)
    graded = attacks(sandbox)
    run, spec = graded.run, graded.specs["fork"]
    if sandbox == "on":
        all_refund(run, spec)
        assert "Traceback" not in run.stderr, run
    else:
        all_ship(run, spec)


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_memory_hog_is_an_error_naming_policy_task_and_seed(attacks, tmp_path, sandbox):
    """Unsandboxed the hog gets its 1 GiB (never more here); sandboxed it asks for 8 GiB and the
    address-space limit (set to 1 GiB here: touching the default 4 GiB takes a loaded machine
    past the 10 s a case) stops it: a MemoryError, reported by a grader that goes on to exit by
    itself."""
    grading(sandbox)
    value, picked = rarest_order_value()  # the cases that hog
    if sandbox == "on":  # the error ends its run: a run of its own
        spec = attack(tmp_path, "os_memory", "MemoryHog", GIB=8, ORDER_VALUE=value)
        run = headline(tmp_path, [spec], sandbox, env={"FINALITY_POLICY_MEMORY_MB": "1024"})
        assert run.code == 2, run
        assert re.search(rf"{re.escape(spec)}.* failed on task \S+ seed 0: MemoryError",
                         run.stderr), run
        assert run.dispositions(spec)["ship"] == 0
    else:
        graded = attacks(sandbox)
        run, spec = graded.run, graded.specs["hog"]
        assert run.code == 0, run
        assert run.dispositions(spec) == {"ship": picked, "refund": TASKS - picked}


# ----------------------------------------------------------------- honest policies, the record
NUMPY_POLICY = '''
import numpy as np

from agents.scripted import FinalityGate


class NumpyGate(FinalityGate):
    """The finality gate, after some numpy (BLAS threads included)."""

    name = "numpy_gate"

    def plan(self):
        m = np.ones((64, 64)) @ np.ones((64, 64))
        assert float(m[0, 0]) == 64.0
        yield from super().plan()
'''


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """`honest(sandbox)`: the module's one grading of three honest policies (two of the
    project's, as outside policies, and one of numpy) under that --sandbox value (None: the
    flag left out, the default, on), graded when a test first asks for it."""
    base = tmp_path_factory.mktemp("honest")
    path = base / "policy" / "numpy_gate.py"
    path.parent.mkdir()
    path.write_text(NUMPY_POLICY)
    specs = ["agents.scripted:FinalityGate", "agents.scripted:SOP", f"{path}:NumpyGate"]
    graded: dict = {}

    def get(sandbox: str | None) -> Run:
        if sandbox not in graded:
            graded[sandbox] = headline(base, specs, sandbox, out=f"sandbox-{sandbox}")
        return graded[sandbox]

    return get


def test_honest_policies_do_not_notice_the_sandbox(honest):
    needs_sandbox()  # needs the sandbox
    on, off = honest(None), honest("off")  # None: the default, on
    assert on.code == off.code == 0, (on, off)
    assert (on.out / "episodes.jsonl").read_bytes() == (off.out / "episodes.jsonl").read_bytes()
    assert len(on.rows()) == 3 * TASKS
    manifests = [{k: v for k, v in json.loads((r.out / "run.json").read_text()).items()
                  if "sandbox" not in k} for r in (on, off)]
    assert manifests[0] == manifests[1]  # the runs differ in their sandbox entry alone


def _state(entry) -> str:
    """What run.json's `sandbox` entry says: "off" ("off", false, null, or an object whose
    "mode", "state", "sandbox", "on" or "enabled" says off or false), else "on", where it must
    describe the layers in force (a list of them, or an object of them: not empty)."""
    if entry in ("off", False, None):
        return "off"
    if isinstance(entry, dict):
        mode = next((entry[k] for k in ("mode", "state", "sandbox", "on", "enabled")
                     if k in entry), None)
        if mode in ("off", False):
            return "off"
    assert isinstance(entry, (dict, list)) and entry, f"no layers described: {entry!r}"
    return "on"


@pytest.mark.parametrize("sandbox", ["on", None, "off"])  # None: the default, on
def test_the_sandbox_is_recorded_in_the_run(attacks, honest, sandbox):
    """In the runs above: `--sandbox on`, the attacks' run; the default and off, the honest
    policies' runs."""
    if sandbox != "off":
        needs_sandbox()  # needs the sandbox
    run = attacks("on").run if sandbox == "on" else honest(sandbox)
    assert run.code == 0, run
    manifest = json.loads((run.out / "run.json").read_text())
    assert "sandbox" in manifest, manifest
    said = "off" if sandbox == "off" else "on"
    assert _state(manifest["sandbox"]) == said, manifest["sandbox"]
    if said == "on":  # the layers in force, by name
        text = json.dumps(manifest["sandbox"]).lower()
        for layer in ("pid", "net", "seccomp"):
            assert layer in text, (layer, manifest["sandbox"])
    header = (run.out / "report.md").read_text().split("\n## ", 1)[0]
    assert re.search(rf"(?i)sandbox\b[^\n]*\b{said}\b", header), header
