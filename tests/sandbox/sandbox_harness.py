"""The harness of the sandbox's red-team tests (every test module of `tests/sandbox/` but
`test_outside.py` and `test_import_once.py`): the attacks of `tests/sandbox/redteam/os_*.py` graded
through the command line (`python -m eval headline`), sandboxed or not, and what the tests read of
a run.

Each attack policy tries its one capability in every case and ships when it worked, refunds when
it did not, so the rows' dispositions say what a policy could do. `attack` copies the attack's
file beside its run with its values baked in (`CONFIG`: a port, the test's folder, hashes of
secrets): a sandbox shows a policy nothing but its own file.

Tests marked `# needs the sandbox` skip where `agents.sandbox.bwrap.unavailable()` says why the
sandbox cannot run here, and fail instead when
FINALITY_REQUIRE_SANDBOX=1 (CI). Every grading is small: one seed, and `--tasks` the same 16 of
the split's tasks (`task_ids`: spread over the whole split, every archetype in). The attacks
that let a run go on share one run a sandbox setting (`Attacks`: each policy's rows are its
own). A test module that runs gradings imports
`_one_matplotlib_cache`, the autouse fixture that gives them one matplotlib cache.
"""

from __future__ import annotations

import collections
import hashlib
import os
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

from eval.grading.runfolder import read_rows
from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE, generate

ROOT = Path(__file__).resolve().parents[2]
REDTEAM = Path(__file__).resolve().parent / "redteam"
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

# ----------------------------------------------------------------- where the sandbox can run
def _required() -> bool:
    return os.environ.get("FINALITY_REQUIRE_SANDBOX") == "1"


def _skip_or_fail(reason: str) -> None:
    if _required():
        pytest.fail(f"FINALITY_REQUIRE_SANDBOX=1, but {reason}")
    pytest.skip(reason)


def sandbox_missing() -> str | None:
    """None when the sandbox can run here, else what is missing."""
    from agents.sandbox.bwrap import unavailable
    return unavailable()


def needs_sandbox() -> None:
    """Skip (fail, under FINALITY_REQUIRE_SANDBOX=1) a test whose run is sandboxed, where the
    sandbox cannot run."""
    if (reason := sandbox_missing()) is not None:
        _skip_or_fail(f"the sandbox cannot run here: {reason}")



SANDBOX = ["off", "on"]  # "on": # needs the sandbox (`grading` skips it where it cannot run)


# ----------------------------------------------------------------- policies and runs
def attack(tmp_path: Path, module: str, cls: str, **config) -> str:
    """The spec of `tests/sandbox/redteam/{module}.py:{cls}`, copied to
    `tmp_path/policy/{module}_{cls}.py` (a file for each class: each has its own CONFIG) with
    `config` baked into its CONFIG."""
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
    if sandbox is not None:
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


def sha(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def ptrace_restricted() -> bool:
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


def snapshot(folder: Path) -> dict:
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
                              SECRETS={"FINALITY_SECRET_TEST": sha(self.secret)}),
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
            self.before = snapshot(self.run.out)  # before a process left behind edits it
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
