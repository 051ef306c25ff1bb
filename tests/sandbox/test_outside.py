"""Policies from outside the project, as their authors meet them: code that does not load is
said to be so (where, and with no task blamed), a time limit names its setting, a grader that
goes away leaves no traceback behind, the rows keep the class's own name, and the code graded
is the code hashed."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import brief_for, run_episode
from agents.sandbox.external import ExternalPolicy, PolicyLoadError
from agents.spec import PolicySpec
from eval.__main__ import main
from eval.grading.grader import RunConfig, grade
from finality_gym import load_corpus

ROOT = Path(__file__).resolve().parents[2]
TASKS = tuple(t.task_id for t in load_corpus("public").tasks[:3])


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def policy_file(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("from agents import Policy\n\n" + body)
    return path


ALWAYS = ("class Always(Policy):\n    name = {name!r}\n    def plan(self):\n"
          "        yield ({call!r}, {{}})\n")


# ----------------------------------------------------------------- code that does not load
@pytest.mark.parametrize("body,cls,needle", [
    ("class C(Policy)\n    pass\n", "C", "SyntaxError: expected ':' ({path}, line 3)"),
    ("import no_such_module_xyz\n", "C",
     "ModuleNotFoundError: No module named 'no_such_module_xyz' ({path}, line 3)"),
    ("class C(Policy):\n    pass\n", "Missing", "{path} has no Policy subclass named 'Missing'"),
])
def test_code_that_does_not_load_is_said_to_be_so_naming_no_task(tmp_path, capsys, body, cls,
                                                                 needle):
    path = policy_file(tmp_path / "broken.py", body)
    spec = f"{path}:{cls}"
    assert main(["headline", "--out", str(tmp_path / "run"), "--seeds", "1", "--workers", "1",
                 "--policies", f"finality_gate,{spec}"]) == 2
    err = capsys.readouterr().err
    assert f"{spec} could not be loaded: {needle.format(path=path)}" in err, err
    assert "failed on task" not in err and "Traceback" not in err, err


def test_a_load_error_surfaces_before_the_first_case(tmp_path):
    """`preflight()` is what the grader calls once per spec before grading; a case started
    without it (`python -m eval show`) fails the same way, before any call."""
    path = policy_file(tmp_path / "broken.py", "class C(Policy)\n    pass\n")
    policy = ExternalPolicy(PolicySpec.parse(f"{path}:C"))
    with pytest.raises(PolicyLoadError, match=rf"^{path}:C could not be loaded: SyntaxError"):
        policy.preflight()
    assert policy.proc is None  # closed: nothing left running
    task = load_corpus("public").task(TASKS[0])
    with pytest.raises(PolicyLoadError, match="could not be loaded"):
        policy.reset(brief_for(task, 0, "full"))


# ----------------------------------------------------------------- the time limit
def test_the_time_limit_names_the_variable_that_sets_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FINALITY_POLICY_TIMEOUT", "1")
    path = policy_file(tmp_path / "slow.py", "class Slow(Policy):\n    def plan(self):\n"
                       "        while True:\n            pass\n        yield\n")
    assert main(["headline", "--out", str(tmp_path / "run"), "--seeds", "1", "--workers", "1",
                 "--policies", f"{path}:Slow"]) == 2
    err = capsys.readouterr().err
    assert (f"{path}:Slow exceeded its time limit of 1 s a case (set FINALITY_POLICY_TIMEOUT "
            "to change it)") in err, err


def test_the_time_limit_is_ten_seconds_unless_set(tmp_path, monkeypatch):
    path = policy_file(tmp_path / "gate.py", ALWAYS.format(name="gate", call="ship"))
    spec = PolicySpec.parse(f"{path}:Always")
    monkeypatch.delenv("FINALITY_POLICY_TIMEOUT", raising=False)
    assert ExternalPolicy(spec).timeout_s == 10.0
    monkeypatch.setenv("FINALITY_POLICY_TIMEOUT", "2.5")
    assert ExternalPolicy(spec).timeout_s == 2.5
    assert ExternalPolicy(spec, timeout_s=7).timeout_s == 7


@pytest.mark.parametrize("value", ["ten", "0", "-1", "inf"])
def test_a_time_limit_that_is_not_a_positive_number_is_refused(tmp_path, capsys, monkeypatch,
                                                               value):
    """Before any case: said in words, naming the variable and its value (not a conversion
    error, nor cases that all time out at once, nor no limit at all)."""
    monkeypatch.setenv("FINALITY_POLICY_TIMEOUT", value)
    path = policy_file(tmp_path / "gate.py", ALWAYS.format(name="gate", call="ship"))
    assert main(["headline", "--out", str(tmp_path / "run"), "--seeds", "1", "--workers", "1",
                 "--tasks", TASKS[0], "--sandbox", "off", "--policies", f"{path}:Always"]) == 2
    err = capsys.readouterr().err
    assert ("error: FINALITY_POLICY_TIMEOUT must be a positive number of seconds (a case's wall "
            f"time; 10 if unset), not {value!r}") in err, err
    assert "Traceback" not in err, err


# ----------------------------------------------------------------- a grader that goes away
GRADE_TWO = """
import sys
from pathlib import Path
from eval.grading.grader import RunConfig, grade
from finality_gym import load_corpus
from finality_gym.policy import PolicyError
tasks = tuple(t.task_id for t in load_corpus("public").tasks[:128])  # two chunks, two workers
try:
    # the policies signal each other through a file: no sandbox (the host behaves the same)
    grade(RunConfig(tuple(sys.argv[1:3]), seeds=(0,), tasks=tasks, sandbox=False),
          Path(sys.argv[3]), workers=2, progress=False)
except PolicyError as exc:
    sys.exit(f"error: {exc}")
"""


# The jobs of the two policies run in a random order (a run with outside code is shuffled): this
# one refunds until a case of the other has begun (on either worker), then fails.
FAILS = ("import os\nimport time\n\nclass Fails(Policy):\n    def plan(self):\n"
         "        if not os.path.exists({flag!r}):  # no case of the other's has begun\n"
         "            yield ('refund', {{}})\n            return\n"
         "        raise KeyError('oops')\n        yield\n")


def grade_two(tmp_path: Path, other: str, stderr) -> int:
    """Grade a policy that fails once a case of `other`'s has begun (and written its file
    `begun`) in two workers: the grader stops `other`'s worker mid-case."""
    fails = policy_file(tmp_path / "fails.py", FAILS.format(flag=str(tmp_path / "begun")))
    return subprocess.run([sys.executable, "-c", GRADE_TWO, f"{fails}:Fails", other,
                           str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=stderr, timeout=300).returncode


def test_a_policy_whose_grader_is_gone_exits_quietly(tmp_path):
    """The stopped worker's policy, asleep mid-case, wakes to write to no one: its process must
    end without a traceback. The failing policy's own traceback shows its code, not the host's."""
    sleeps = policy_file(tmp_path / "sleeps.py", "import time\n\nclass Sleeps(Policy):\n"
                         "    def plan(self):\n"
                         f"        open({str(tmp_path / 'begun')!r}, 'w').close()\n"
                         "        time.sleep(2)\n        yield ('ship', {})\n")
    with open(tmp_path / "stderr.txt", "w") as err:
        # the run's stderr is a file: the policies' processes may write to it after it returns
        assert grade_two(tmp_path, f"{sleeps}:Sleeps", err) == 1
    time.sleep(3)  # the sleeper has woken, if anything is left of it
    text = (tmp_path / "stderr.txt").read_text()
    assert "KeyError: 'oops'" in text, text
    assert f'File "{tmp_path / "fails.py"}", line 11, in plan' in text, text
    assert "BrokenPipeError" not in text, text
    assert "agents/sandbox/host.py" not in text, text
    assert "agents/sandbox/fork_server.py" not in text, text


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in "ZX"  # a zombie has ended (a container's first process may not reap)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the host watches with a pidfd")
def test_a_case_stuck_in_a_loop_does_not_outlive_its_grader(tmp_path):
    """As above, but the stopped worker's policy spins for ever and never writes: only the host
    can notice that no one is left, and end it."""
    begun = str(tmp_path / "begun")
    spins = policy_file(tmp_path / "spins.py", "import os\n\nclass Spins(Policy):\n"
                        "    def plan(self):\n"
                        f"        open({begun!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
                        "        while True:\n            pass\n        yield\n")
    with open(tmp_path / "stderr.txt", "w") as err:
        assert grade_two(tmp_path, f"{spins}:Spins", err) == 1
    started = [int(p) for p in (tmp_path / "begun").read_text().split()]
    deadline = time.monotonic() + 10
    while any(map(_running, started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in started if _running(pid)]
    for pid in left:  # this test's own leftovers, by their ids
        os.kill(pid, signal.SIGKILL)
    assert started and not left, (tmp_path / "stderr.txt").read_text()


# ----------------------------------------------------------------- the class's own name
def test_every_row_keeps_the_spec_and_the_classs_own_name(tmp_path):
    path = policy_file(tmp_path / "mine.py", ALWAYS.format(name="ships_always", call="ship"))
    spec = f"{path}:Always"
    rows = grade(RunConfig((spec, "always_ship"), seeds=(0,), tasks=TASKS), tmp_path / "run",
                 progress=False)
    mine = [r for r in rows if r["policy"] == spec]
    assert len(mine) == len(TASKS) and {r["policy_name"] for r in mine} == {"ships_always"}
    theirs = [r for r in rows if r["policy"] == "always_ship"]
    assert [{**r, "policy": spec, "policy_name": "ships_always"} for r in theirs] == mine


# ----------------------------------------------------------------- the code graded is hashed
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_module_is_graded_from_the_file_that_was_hashed(tmp_path, monkeypatch):
    """Two modules of one name: the working directory's comes first, for the hash and for the
    import alike."""
    here = policy_file(tmp_path / "here" / "mod_x.py", ALWAYS.format(name="x", call="ship"))
    policy_file(tmp_path / "there" / "mod_x.py", ALWAYS.format(name="x", call="refund"))
    monkeypatch.chdir(here.parent)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "there"))
    rows = grade(RunConfig(("mod_x:Always",), seeds=(0,), tasks=TASKS), tmp_path / "run",
                 progress=False)
    assert {r["disposition"] for r in rows} == {"ship"}
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["inputs"] == {"mod_x:Always": _sha(here)}


@pytest.mark.parametrize("sandbox", [True, False])
def test_a_package_beside_a_module_of_its_name_is_what_is_hashed_and_run(tmp_path, monkeypatch,
                                                                          sandbox):
    """A package `mod_y/` beside `mod_y.py`: Python imports the package, so the package's file
    is the one hashed, shown in the sandbox and run (grading it under `mod_y.py`'s hash would
    pin code that never ran)."""
    policy_file(tmp_path / "mod_y.py", ALWAYS.format(name="y", call="ship"))
    imported = policy_file(tmp_path / "mod_y" / "__init__.py", ALWAYS.format(name="y",
                                                                            call="refund"))
    monkeypatch.chdir(tmp_path)
    rows = grade(RunConfig(("mod_y:Always",), seeds=(0,), tasks=TASKS, sandbox=sandbox),
                 tmp_path / "run", progress=False)
    assert {r["disposition"] for r in rows} == {"refund"}
    pinned = json.loads((tmp_path / "run" / "run.json").read_text())["inputs"]["mod_y:Always"]
    assert pinned == hashlib.sha256(imported.read_bytes()).hexdigest()


def test_a_file_edited_after_it_was_hashed_never_grades_new_code_under_the_old_hash(tmp_path):
    """The policy's process imports the hashed code once: an edit mid-run changes nothing in
    it, and a process started after the edit (a new worker, a resume) refuses to run it."""
    path = policy_file(tmp_path / "mine.py", ALWAYS.format(name="mine", call="ship"))
    policy = ExternalPolicy(PolicySpec.parse(f"{path}:Always"))
    task = load_corpus("public").task(TASKS[0])
    try:
        assert run_episode(policy, task, 0).disposition == "ship"
        path.write_text(path.read_text().replace("'ship'", "'refund'"))
        assert run_episode(policy, task, 1).disposition == "ship"  # the code that was hashed
    finally:
        policy.close()
    stale = ExternalPolicy(PolicySpec.parse(f"{path}:Always"))
    stale.digest = policy.digest  # as a worker holding the run's pinned hash would
    with pytest.raises(PolicyLoadError, match=rf"{path} has changed since the grader hashed"):
        stale.preflight()
