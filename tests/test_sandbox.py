"""The operating-system sandbox for outside policies (`python -m eval headline --sandbox on`, the
default): every attack of `tests/redteam/os_*.py` on the grader's machine, through the command
line, unsandboxed (`--sandbox off`: each attack works) and sandboxed (each attack fails and the
run goes on); honest policies give the very same rows either way; the run records it.

Each attack policy tries its one capability in every case and ships when it worked, refunds when
it did not, so the rows' dispositions say what a policy could do. The test copies the attack's
file beside its run with its values baked in (`CONFIG`: a port, the test's folder, hashes of
secrets): a sandbox shows a policy nothing but its own file.

Tests marked `# needs the sandbox` skip where `agents.sandbox.unavailable()` says why the sandbox
cannot run here (or where `agents.sandbox` does not exist yet), and fail instead when
FINALITY_REQUIRE_SANDBOX=1 (CI). Every grading is small: one seed, and `--tasks` the same 16 of
the split's tasks (`task_ids`: spread over the whole split, every archetype in). The attacks
that let a run go on share one run a sandbox setting (`attacks`: each policy's rows are its own);
those that end the run (killing the grader, or the process their case was forked from; the
sandboxed memory hog) have runs of their own. A run has one worker where an attack counts on
it (files or a listener that one worker's cases share; no orphaned worker grading on after its
grader is killed); elsewhere the command line's default.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from eval.runfolder import read_rows
from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE, generate

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = ROOT / "tests" / "redteam"
PLACEHOLDER = "CONFIG: dict = {}  # the test bakes its values in here"
TASKS = 16  # every headline grading here plays these many tasks of its split once each
PRIVATE_SEED = 0x1faa7cd053f194d1adb2d2b6dcd418dba  # a private split's master seed: 128 random bits


def task_ids(tasks) -> tuple[str, ...]:
    """The `TASKS` tasks a grading here plays: evenly spread over the split's (`tasks`) order,
    so every part of it (twin pairs, unresolvable pairs, the singletons) is in."""
    return tuple(tasks[i * len(tasks) // TASKS].task_id for i in range(TASKS))


def public_ids() -> tuple[str, ...]:
    return task_ids(load_corpus("public").tasks)


def private_ids(master_seed: int) -> tuple[str, ...]:
    """The same places in the private split that `master_seed` generates (its ids: `pri-...`),
    without making it this process's private split."""
    return task_ids(generate(PRIVATE, master_seed))

# Until the sandbox exists the command line has no --sandbox flag: the `off` runs then omit it
# (which is what `--sandbox off` keeps doing), and the `on` runs skip. One edit: set it True.
SANDBOX_FLAG = importlib.util.find_spec("agents.sandbox") is not None


# ----------------------------------------------------------------- where the sandbox can run
def _required() -> bool:
    return os.environ.get("FINALITY_REQUIRE_SANDBOX") == "1"


def _skip_or_fail(reason: str) -> None:
    if _required():
        pytest.fail(f"FINALITY_REQUIRE_SANDBOX=1, but {reason}")
    pytest.skip(reason)


def sandbox_missing() -> str | None:
    """None when the sandbox can run here, else what is missing."""
    if importlib.util.find_spec("agents.sandbox") is None:
        return "agents.sandbox does not exist yet"
    from agents import sandbox
    return sandbox.unavailable()


def needs_sandbox() -> None:
    """Skip (fail, under FINALITY_REQUIRE_SANDBOX=1) a test whose run is sandboxed, where the
    sandbox cannot run."""
    if (reason := sandbox_missing()) is not None:
        _skip_or_fail(f"the sandbox cannot run here: {reason}")


def needs_implementation() -> None:
    """Skip (fail, under FINALITY_REQUIRE_SANDBOX=1) a test of the --sandbox flag itself (no
    sandboxed run), until the flag exists."""
    if not SANDBOX_FLAG:
        _skip_or_fail("agents.sandbox does not exist yet (no --sandbox flag)")


SANDBOX = ["off", "on"]  # "on": # needs the sandbox (`grading` skips it where it cannot run)


# ----------------------------------------------------------------- policies and runs
def attack(tmp_path: Path, module: str, cls: str, **config) -> str:
    """The spec of `tests/redteam/{module}.py:{cls}`, copied to `tmp_path/policy/{module}_{cls}.py`
    (a file for each class: each has its own CONFIG) with `config` baked into its CONFIG."""
    source = (REDTEAM / f"{module}.py").read_text()
    assert source.count(PLACEHOLDER) == 1, module
    folder = tmp_path / "policy"
    folder.mkdir(exist_ok=True)
    path = folder / f"{module}_{cls}.py"
    path.write_text(source.replace(PLACEHOLDER, f"CONFIG: dict = {config!r}"))
    return f"{path}:{cls}"


@dataclass
class Run:
    code: int
    out: Path
    stdout: str
    stderr: str
    recorded: list[dict]  # the rows as the run left them, read as it ended
    ended: float  # time.monotonic() when it ended

    def rows(self) -> list[dict]:
        return self.recorded

    def dispositions(self, spec: str) -> collections.Counter:
        return collections.Counter(r["disposition"] for r in self.rows() if r["policy"] == spec)

    def __str__(self) -> str:  # what an assertion shows
        return f"exit {self.code}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"


def headline(tmp_path: Path, policies: list[str], sandbox: str | None, *, out: str = "run",
             tasks: tuple[str, ...] | None = None, workers: int | None = None,
             extra: tuple = (), env: dict | None = None, timeout: float = 600) -> Run:
    """`python -m eval headline` on one seed and `tasks` (the public split's `public_ids()`
    unless given), in its own process, run from `tmp_path/cwd` with HOME `tmp_path/home`;
    `sandbox` is the --sandbox value (None: the flag is left out, the default); `workers` the
    --workers value (None: the default). Its rows are read as soon as it ends."""
    for folder in ("cwd", "home"):
        (tmp_path / folder).mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "eval", "headline", "--policies", ",".join(policies),
           "--seeds", "1", "--tasks", ",".join(tasks or public_ids()),
           "--out", str(tmp_path / out), "--no-progress", *extra]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if sandbox is not None and SANDBOX_FLAG:
        cmd += ["--sandbox", sandbox]
    base = {k: v for k, v in os.environ.items()
            if k not in ("FINALITY_MASTER_SEED", "FINALITY_SECRET_TEST", "PYTHONPATH")}
    run_env = {**base, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home"),
               "FINALITY_NO_PROGRESS": "1", **MATPLOTLIB, **(env or {})}
    done = subprocess.run(cmd, cwd=tmp_path / "cwd", env=run_env, capture_output=True,
                          text=True, timeout=timeout)
    ended = time.monotonic()
    return Run(done.returncode, tmp_path / out, done.stdout, done.stderr,
               read_rows(tmp_path / out / "episodes.jsonl"), ended)


# The grader's matplotlib cache for every run here (a HOME of its own would have each run build
# its font cache afresh: seconds a run); set by `_one_matplotlib_cache`.
MATPLOTLIB: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_matplotlib_cache(tmp_path_factory):
    if "MPLCONFIGDIR" not in os.environ:
        MATPLOTLIB["MPLCONFIGDIR"] = str(tmp_path_factory.mktemp("matplotlib"))
    yield
    MATPLOTLIB.clear()


def grading(sandbox: str) -> None:
    """The checks before a parametrized run: a sandboxed one needs the sandbox."""
    if sandbox == "on":  # needs the sandbox
        needs_sandbox()


def all_refund(run: Run, *specs: str) -> None:
    assert run.code == 0, run
    for spec in specs:
        assert run.dispositions(spec) == {"refund": TASKS}, (spec, run.dispositions(spec), run)


def all_ship(run: Run, *specs: str) -> None:
    assert run.code == 0, run
    for spec in specs:
        assert run.dispositions(spec) == {"ship": TASKS}, (spec, run.dispositions(spec), run)


def _sha(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def _ptrace_restricted() -> bool:
    """Whether the kernel's Yama module already stops a process reading its ancestors'
    memory (ptrace_scope 1 or more): then no policy can, sandbox or not."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text()) > 0
    except (OSError, ValueError):
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def end_leftovers(pids_file: Path, needle: str) -> list[int]:
    """End the processes an attack detached (listed in `pids_file`, and still running this
    test's policy: its path, `needle`, on their command line), by their ids; those it ended."""
    ended = []
    if pids_file.exists():
        for pid in map(int, pids_file.read_text().split()):
            if needle in _cmdline(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
                except ProcessLookupError:
                    pass
    return ended


def rarest_order_value() -> tuple[int, int]:
    """The order value fewest of the graded tasks (`public_ids()`) have, and how many have it:
    os_memory and os_linger's EditsResultsLater act only in the cases whose brief has it."""
    corpus = load_corpus("public")
    counts = collections.Counter(corpus.task(t).order_value for t in public_ids())
    value = min(counts, key=lambda v: (counts[v], v))
    assert 0 < counts[value] < TASKS, counts  # some cases act, some do not
    return value, counts[value]


# ----------------------------------------------------------------- the attacks that let a run go on
@contextmanager
def listener():
    """A server on 127.0.0.1 that says `hello` to each connection: (port, a count of them)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted = [0]
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                accepted[0] += 1
                try:
                    conn.sendall(b"hello")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


class Attacks:
    """One grading, in `base`, of every attack that lets its run go on, under one sandbox
    setting (one worker: os_files and os_linger's AbstractSocket count on one worker's cases
    sharing what persists), and what the tests need of the run, taken as it ended. Each
    attack is its own policy, with its own rows."""

    def __init__(self, base: Path, sandbox: str):
        self.base, self.sandbox = base, sandbox
        self.secret = secrets.token_hex(16)  # in the grader's environment
        self.token = secrets.token_hex(8)  # os_files' markers
        self.value, self.picked = rarest_order_value()  # the cases that detach, or hog
        self.pids = {"edits": base / "lingering.pids", "socket": base / "abstract.pids"}
        grader = f"{base}{os.sep}"  # on the grader's command line (its --out), no one else's
        self.specs = {
            "cmdline": attack(base, "os_proc", "GraderCommandLine", GRADER=grader),
            "environ": attack(base, "os_proc", "GraderEnvironment",
                              SECRETS={"FINALITY_SECRET_TEST": _sha(self.secret)}),
            "memory": attack(base, "os_proc", "GraderMemory", GRADER=grader),
            "files": attack(base, "os_files", "Persist", TOKEN=self.token),
            "edits": attack(base, "os_linger", "EditsResultsLater", RESULTS=str(base / "run"),
                            PIDS=str(self.pids["edits"]), ORDER_VALUE=self.value, DELAY=3,
                            LIFE=120),
            # a listener lives 60 s: past any run here, so one worker's first case alone
            # refunds unsandboxed
            "socket": attack(base, "os_linger", "AbstractSocket", TOKEN=secrets.token_hex(8),
                             PIDS=str(self.pids["socket"]), LIFE=60),
            "fork": attack(base, "os_fork", "ForkBomb", CHILDREN=8),
        }
        if sandbox == "off":  # sandboxed the hog ends its run: a run of its own
            self.specs["hog"] = attack(base, "os_memory", "MemoryHog", GIB=1,
                                       ORDER_VALUE=self.value)
        name = f"finality-redteam-{self.token}"
        self.places = {"tmp": Path("/tmp") / name, "shm": Path("/dev/shm") / name,
                       "home": base / "home" / f".{name}", "cwd": base / "cwd" / name,
                       "beside": base / "policy" / name}  # beside its file
        if os.access("/dev", os.W_OK):  # root's: the sandbox's own /dev must not be writable
            self.places["dev"] = Path("/dev") / name

    def grade(self) -> None:
        with listener() as (port, accepted):
            self.specs["network"] = attack(self.base, "os_network", "Loopback", PORT=port)
            self.run = headline(self.base, list(self.specs.values()), self.sandbox, workers=1,
                                env={"FINALITY_SECRET_TEST": self.secret})
            self.before = _snapshot(self.run.out)  # before a process left behind edits it
            self.left = {place for place, path in self.places.items() if path.exists()}
        self.accepted = accepted[0]

    def policy_file(self, name: str) -> str:
        return self.specs[name].rpartition(":")[0]

    def clean(self) -> None:
        """End what the attacks left running, by their ids; remove os_files' markers outside
        the test's folder (this run's own, by name)."""
        for name, pids in self.pids.items():
            end_leftovers(pids, self.policy_file(name))
        for place in ("tmp", "shm", "dev"):
            if place in self.places:
                self.places[place].unlink(missing_ok=True)


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
    found = [cmdline, environ] + ([] if sandbox == "off" and _ptrace_restricted() else [memory])
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
                     SEED_SHA=_sha(seed))
    environ = attack(tmp_path, "os_proc", "GraderEnvironment",
                     SECRETS={"FINALITY_MASTER_SEED": _sha(seed)})
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
                     SEED_SHA=_sha(seed))
    environ = attack(tmp_path, "os_proc", "GraderEnvironment",
                     SECRETS={"FINALITY_MASTER_SEED": _sha(seed)})
    run = headline(tmp_path, [cmdline, environ], "on", tasks=private_ids(int(seed)), extra=(
        "--split", "private", *(("--master-seed-file", str(path)) if given == "file" else ())),
        env={"FINALITY_MASTER_SEED": seed} if given == "env" else None)
    all_refund(run, cmdline, environ)
    assert seed not in run.stdout and seed not in run.stderr
    for written in run.out.iterdir():
        assert seed.encode() not in written.read_bytes(), written


@pytest.mark.parametrize("given", ["file", "env"])
def test_a_private_split_is_never_graded_unsandboxed(tmp_path, given):
    needs_implementation()  # needs the sandbox (its --sandbox flag)
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
        while time.monotonic() < deadline and _snapshot(run.out) == before:
            time.sleep(0.2)
        after = _snapshot(run.out)
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
    if sandbox == "off":
        needs_implementation()  # needs the sandbox (its --sandbox flag)
    else:
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
