"""Outside policies import once (`agents/sandbox/host.py`): every case is forked from the process
that imported the policy's code, so a model loaded at import is loaded once, yet nothing carries
from one case to the next. Each attack below acts on what it finds (ships when it saw an earlier
case, refunds when not) or is refused at load, with the reason named."""

import json
import os
from pathlib import Path

import pytest

import finality_gym
from eval.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
TASKS = ",".join(t.task_id for t in finality_gym.load_corpus("public").tasks[::20])
HEAD = "from agents.scripted import FinalityGate\nfrom finality_gym.policy import Policy\n"
SHIP_IF_SEEN = """
class Attack(Policy):
    def plan(self):
        yield ("ship", {}) if seen() else ("refund", {})
"""


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def grade(tmp_path: Path, body: str, *extra: str) -> tuple[int, list[dict]]:
    path = tmp_path / "attack.py"
    path.write_text(HEAD + body + SHIP_IF_SEEN)
    out = tmp_path / ("run" + "".join(extra).replace("-", ""))
    code = main(["headline", "--out", str(out), "--no-progress", "--seeds", "1", "--workers",
                 "1", "--tasks", TASKS, "--policies", f"{path}:Attack", *extra])
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()] \
        if (out / "episodes.jsonl").exists() else []
    return code, rows


COUNTER = """
SEEN = []
def seen():
    SEEN.append(1)
    return len(SEEN) > 1
"""


@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_a_module_level_counter_starts_afresh_in_every_case(tmp_path, sandbox):
    code, rows = grade(tmp_path, COUNTER, "--sandbox", sandbox)
    assert code == 0 and len(rows) == len(TASKS.split(","))
    assert {r["disposition"] for r in rows} == {"refund"}


@pytest.mark.parametrize("setup,reason", [
    ("import mmap\nSHARED = mmap.mmap(-1, 4096)\n", "shared writable mappings open (anonymous)"),
    ("import os\nFD = os.open(os.devnull, os.O_RDONLY)\n", "file descriptors open"),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True)"
     ".start()\n", "1 thread(s) running"),
    ("import signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\n", "signal handlers set"),
])
def test_what_an_import_leaves_for_its_forks_is_refused_by_name(tmp_path, capsys, setup,
                                                                 reason):
    code, rows = grade(tmp_path, setup + "def seen():\n    return False\n")
    err = capsys.readouterr().err
    assert code == 2 and not rows
    assert f"could not be loaded: importing it left {reason}" in err, err
    assert "failed on task" not in err


# Writes into the memory of the process it was forked from (the zygote), where the next case
# is forked from: a mark there would reach every later case.
THROUGH_PROC = """
import ctypes, os
MARK = ctypes.create_string_buffer(16)
def seen():
    if MARK.value == b"seen":
        return True
    try:
        with open(f"/proc/{os.getppid()}/mem", "r+b", buffering=0) as mem:
            mem.seek(ctypes.addressof(MARK))
            mem.write(b"seen")
    except OSError:
        pass
    return False
"""


def test_a_case_cannot_write_into_the_process_it_was_forked_from(tmp_path):
    code, rows = grade(tmp_path, THROUGH_PROC)  # the sandbox: no /proc, no pid to name it by
    assert code == 0 and {r["disposition"] for r in rows} == {"refund"}


def test_without_the_sandbox_the_memory_attack_is_real(tmp_path):
    """The attack above works unsandboxed where the kernel lets a process write its parent's
    memory (root, or no Yama restriction): so its sandboxed test can fail. docs/trust.md says
    `--sandbox off` does not cover this."""
    ptrace = Path("/proc/sys/kernel/yama/ptrace_scope")
    scope = int(ptrace.read_text()) if ptrace.exists() else 0
    if scope >= 3 or (scope >= 1 and os.geteuid() != 0):
        pytest.skip(f"Yama (ptrace_scope {scope}) forbids writing another process's memory")
    code, rows = grade(tmp_path, THROUGH_PROC, "--sandbox", "off")
    assert code == 0
    assert sum(r["disposition"] == "ship" for r in rows) == len(rows) - 1


def test_a_policy_played_past_its_fork_servers_channels_goes_on_with_a_fresh_one():
    """A fork server makes its cases' channels before the import (its filter refuses any socket
    after it), `CASES_PER_SERVER` of them; an outside policy played on without the grader's
    chunks (a user's own loop over `run_episode`) gets a fresh fork server when they are used
    up, and plays each case as the project's own class does."""
    from agents import make_policy, run_episode
    from agents.sandbox.fork_server import CASES_PER_SERVER
    tasks = finality_gym.load_corpus("public").tasks
    jobs = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(CASES_PER_SERVER + 4)]
    outside, own = make_policy("agents.scripted:FinalityGate"), make_policy("finality_gate")
    try:
        played = [run_episode(outside, task, seed).to_dict() for task, seed in jobs]
    finally:
        outside.close()
    assert played == [run_episode(own, task, seed).to_dict() for task, seed in jobs]
