"""The grade no submission can game, and runs that cannot be mixed: every finding of the trust
issue as a regression test, through the command line where a user meets it."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import finality_gym
from agents import brief_for, run_episode
from agents.spec import split_specs
from eval.__main__ import main
from eval.grading.runfolder import lock, read_rows
from finality_gym import load_corpus

ROOT = Path(__file__).resolve().parents[2]
REDTEAM = Path(__file__).resolve().parents[1] / "sandbox" / "redteam"
sys.path.insert(0, str(REDTEAM))


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def headline(tmp_path, *args, out="run") -> int:
    return main(["headline", "--out", str(tmp_path / out), "--no-progress", *args])


def summary(tmp_path, out="run") -> dict:
    return json.loads((tmp_path / out / "summary.json").read_text())["policies"]


# ----------------------------------------------------------------- red team
ATTACKS = {"lookup.py:Lookup": "finding 1", "frames.py:Frames": "finding 2",
           "gc_walk.py:GcWalk": "finding 2", "shared_memory.py:SharedMemory": "state in memory"}


def test_each_attack_cheats_in_the_graders_process():
    """The attacks are real: in the grader's process (where every policy used to run) the stack
    and the heap hold the episode, and they act like the oracle."""
    code = ("import sys; sys.path.insert(0, 'tests/sandbox/redteam')\n"
            "from frames import Frames; from gc_walk import GcWalk\n"
            "from agents import run_episode; from finality_gym import load_corpus\n"
            "tasks = load_corpus('public').tasks\n"
            "print(sum(run_episode(c(), t, 0).gap != 0 for c in (Frames, GcWalk) for t in tasks))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "0"


def test_red_team_policies_score_no_better_than_an_honest_policy(tmp_path, capsys):
    shared = f"{REDTEAM / 'shared_memory.py:SharedMemory'}"
    # a shared mapping made at import would join every case forked from the import: refused
    assert headline(tmp_path, "--seeds", "1", "--policies", shared, out="shared") == 2
    assert "importing it left shared writable mappings open (anonymous)" in (
        capsys.readouterr().err)
    specs = [f"{REDTEAM / spec}" for spec in ATTACKS if "shared_memory" not in spec]
    assert headline(tmp_path, "--seeds", "1", "--policies",
                    ",".join([*specs, "finality_gate", "finality_oracle"])) == 0
    pols = summary(tmp_path)
    gate = pols["finality_gate"]
    for spec in specs:
        attack = pols[spec]
        assert attack["mean_gap"] >= gate["mean_gap"] - 1e-9, spec
        assert attack["exact"] <= gate["exact"] + 1e-9, spec
        assert attack["mean_gap"] > 10 and attack["exact"] < 0.95, spec  # far from the oracle


def test_the_brief_names_no_task():
    corpus = load_corpus("public")
    briefs: dict = {}
    for task in corpus.tasks:
        briefs.setdefault(brief_for(task, 0, "full"), set()).add(task.task_id)
    assert min(len(ids) for ids in briefs.values()) >= 20  # each brief fits many tasks
    for settle, fail in (u for u in corpus.units if len(u) == 2):
        assert brief_for(settle, 3, "full") == brief_for(fail, 3, "full")


def _renders(task, actions):
    env = gym.make("Finality-v0", render_mode="ansi")
    env.reset(options={"task_id": task.task_id, "fault_seed": 0})
    texts = [env.render()]
    for action in actions:
        *_, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
        texts.append(env.render())
    return texts, env.unwrapped.episode


def test_the_rendered_text_tells_an_agent_nothing_the_tools_did_not():
    corpus = load_corpus("public")
    for settle, fail in [u for u in corpus.units if len(u) == 2]:
        # read every system, probe, wait: all before t_det on both halves
        actions = [0, 1, 2, 3, 4, 5]
        a, episode = _renders(settle, actions)
        b, _ = _renders(fail, actions)
        before = [text for text, t in zip(a, [120, *[h[0] for h in episode.history]])
                  if t < settle.t_det]
        assert before and b[:len(before)] == before
        for text in a + b:
            assert settle.task_id not in text and fail.task_id not in text
            for word in (*finality_gym.ARCHETYPES, "twin"):
                assert word not in text


def test_the_policy_process_gets_none_of_the_graders_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "secret-value")
    log = tmp_path / "env.txt"
    path = tmp_path / "envy.py"
    path.write_text("import os\nfrom agents.scripted import FinalityGate\n\n"
                    "class Envy(FinalityGate):\n    def plan(self):\n"
                    f"        open({str(log)!r}, 'a').write(repr(dict(os.environ)))\n"
                    "        yield from super().plan()\n")
    # the policy reports through a file, which the sandbox forbids: the process boundary alone
    # (tests/sandbox/test_sandbox.py attacks the environment through the sandbox)
    assert headline(tmp_path, "--seeds", "1", "--workers", "1", "--sandbox", "off",
                    "--policies", f"{path}:Envy") == 0
    assert "secret-value" not in log.read_text() and "PATH" in log.read_text()


def test_outside_policies_cannot_be_privileged(tmp_path, capsys):
    assert headline(tmp_path, "--seeds", "1", "--policies",
                    "agents.scripted:FinalityOracle") == 2
    assert "privileged" in capsys.readouterr().err


def test_the_projects_scripted_policies_read_only_the_brief_and_the_results(tmp_path):
    """Graded in their own process, where only the brief and the results reach them, the
    project's scripted policies give the very rows they give in the grader's process."""
    classes = {"random": "RandomPolicy", "optimistic": "Optimistic", "eager": "Eager",
               "majority_vote": "MajorityVote", "sop": "SOP", "react": "ReAct",
               "reflection": "Reflection", "finality_gate": "FinalityGate",
               "always_ship": "AlwaysShip", "do_nothing": "DoNothing"}
    outside = [f"agents.scripted:{c}" for c in classes.values()]
    tasks = [t.task_id for t in load_corpus("public").tasks[::3]]  # a third, every archetype
    assert headline(tmp_path, "--seeds", "1", "--tasks", ",".join(tasks),
                    "--policies", ",".join([*classes, *outside])) == 0
    rows = read_rows(tmp_path / "run" / "episodes.jsonl")
    by = {}
    for row in rows:
        by.setdefault(row["policy"], []).append(  # an outside row adds its class's name
            {k: v for k, v in row.items() if k not in ("policy", "policy_name")})
    for name, cls in classes.items():
        assert by[name] == by[f"agents.scripted:{cls}"], name


# ----------------------------------------------------------------- your own policy
MY_POLICY = '''
from agents import Policy

class ProbeThenShip(Policy):
    name = "probe_then_ship"
    def plan(self):
        answer = yield ("probe_processor", {})
        yield ("ship", {}) if answer["captures"].get("cap1") == "settled" else ("refund", {})
'''


def test_your_own_policy_from_a_file_and_specs_with_commas(tmp_path):
    path = tmp_path / "my_policy.py"
    path.write_text(MY_POLICY)
    specs = f"{path}:ProbeThenShip,sop:poll_interval=30,max_polls=6,plan:60,original,120,ship"
    assert split_specs(specs) == (f"{path}:ProbeThenShip", "sop:poll_interval=30,max_polls=6",
                                  "plan:60,original,120,ship")
    assert headline(tmp_path, "--seeds", "1", "--policies", specs) == 0
    pols = summary(tmp_path)
    assert set(pols) == set(split_specs(specs))
    namespace: dict = {}
    exec(MY_POLICY, namespace)  # the same class, run in this process, for comparison
    corpus = load_corpus("public")
    rows = [r for r in read_rows(tmp_path / "run" / "episodes.jsonl")
            if r["policy"] == f"{path}:ProbeThenShip"]
    assert len(rows) == 321
    for row in rows[::10]:
        record = run_episode(namespace["ProbeThenShip"](), corpus.task(row["task_id"]), 0)
        assert {k: row[k] for k in record._fields} == record.to_dict()


def test_a_top_level_module_is_a_policy_spec_too(tmp_path, monkeypatch):
    (tmp_path / "mymod.py").write_text(MY_POLICY)
    monkeypatch.chdir(tmp_path)
    assert split_specs("sop,mymod:ProbeThenShip") == ("sop", "mymod:ProbeThenShip")
    assert headline(tmp_path, "--seeds", "1", "--policies", "sop,mymod:ProbeThenShip") == 0
    assert set(summary(tmp_path)) == {"sop", "mymod:ProbeThenShip"}


@pytest.mark.parametrize("body,needle", [
    ("    def plan(self):\n        yield ('read_ledger', {})\n", "before the case ended"),
    ("    def plan(self):\n        yield ('read_ledger', {})\n        raise KeyError('oops')\n",
     "KeyError"),
    ("    def plan(self):\n        while True:\n            pass\n        yield\n", "time limit"),
    ("    def plan(self):\n        yield ('teleport', {})\n", "teleport"),
    ("    def plan(self):\n        import os\n        os._exit(0)\n        yield\n",
     "ended without finishing"),
    ("    def plan(self):\n        yield ('wait', {'ticks': object()})\n", "not JSON"),
])
def test_a_failing_policy_is_an_error_naming_policy_task_and_seed(tmp_path, capsys, monkeypatch,
                                                                   body, needle):
    monkeypatch.setenv("FINALITY_POLICY_TIMEOUT", "1")
    path = tmp_path / "bad.py"
    path.write_text("from agents import Policy\n\nclass Bad(Policy):\n" + body)
    assert headline(tmp_path, "--seeds", "1", "--workers", "1", "--policies",
                    f"finality_gate,{path}:Bad") == 2
    err = capsys.readouterr().err
    assert needle in err and f"{path}:Bad" in err
    assert re.search(r"failed on task pub-\d{3}[ab]?-\w+ seed 0", err)  # which one: any
    # what was written stays valid, and holds no row of the failing policy (a run with outside
    # code plays its jobs in a shuffled order: how many finality_gate rows came first varies)
    rows = tmp_path / "run" / "episodes.jsonl"
    assert {r["policy"] for r in (read_rows(rows) if rows.is_file() else [])} <= {"finality_gate"}


# ----------------------------------------------------------------- runs that cannot be mixed
def test_a_changed_policy_file_is_refused_on_resume(tmp_path, capsys):
    path = tmp_path / "my_policy.py"
    path.write_text(MY_POLICY)
    spec = f"{path}:ProbeThenShip"
    assert headline(tmp_path, "--seeds", "1", "--policies", spec) == 0
    path.write_text(MY_POLICY.replace('"settled"', '"failed_soft"'))
    assert headline(tmp_path, "--seeds", "1", "--policies", spec) == 2
    assert "has changed since its rows" in capsys.readouterr().err


def test_a_changed_model_file_is_refused_on_resume(tmp_path, capsys):
    from stable_baselines3 import PPO
    model_path = tmp_path / "model.zip"
    env = gym.make("Finality-v0")
    PPO("MlpPolicy", env, seed=0, n_steps=64, batch_size=64).save(model_path)
    spec = f"ppo:{model_path}"
    assert headline(tmp_path, "--seeds", "1", "--policies", spec, "--workers", "1") == 0
    PPO("MlpPolicy", env, seed=1, n_steps=64, batch_size=64).save(model_path)
    assert headline(tmp_path, "--seeds", "1", "--policies", spec, "--workers", "1") == 2
    err = capsys.readouterr().err
    assert "has changed since its rows" in err and str(model_path) in err


def test_a_second_writer_on_the_same_folder_is_refused(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    with lock(tmp_path / "run"):
        assert headline(tmp_path, "--seeds", "1", "--policies", "finality_gate") == 2
    assert "being written by another run" in capsys.readouterr().err
    assert not (tmp_path / "run" / "episodes.jsonl").exists()
    assert headline(tmp_path, "--seeds", "1", "--policies", "finality_gate") == 0


def test_two_processes_at_once_one_is_refused(tmp_path):
    flag = tmp_path / "go"
    path = tmp_path / "waits.py"  # holds the first run until the second one has been answered
    path.write_text("import os, time\nfrom agents.scripted import FinalityGate\n\n"
                    "class Waits(FinalityGate):\n    def plan(self):\n"
                    f"        while not os.path.exists({str(flag)!r}):\n"
                    "            time.sleep(0.01)\n        yield from super().plan()\n")
    cmd = [sys.executable, "-m", "eval", "headline", "--seeds", "1", "--policies",
           f"{path}:Waits", "--out", str(tmp_path / "run"), "--no-progress", "--workers", "1",
           "--sandbox", "off"]  # the policy waits for a file the sandbox would not show it
    env = {**os.environ, "FINALITY_POLICY_TIMEOUT": "120"}
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    lock = tmp_path / "run" / ".lock"
    while first.poll() is None and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.01)
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    flag.write_text("")
    first_err = first.communicate(timeout=120)[1].decode()
    assert (first.returncode, second.returncode) == (0, 2), (first_err, second.stderr)
    assert "being written by another run" in second.stderr
    rows = read_rows(tmp_path / "run" / "episodes.jsonl")
    assert len(rows) == len({(r["policy"], r["task_id"], r["seed"]) for r in rows}) == 321


@pytest.mark.parametrize("make_out,needle", [
    (lambda p: (p / "file").write_text("x") and p / "file", "is a file"),
    (lambda p: Path("/proc/finality-results"), "cannot be created"),
])
def test_an_unusable_out_folder_is_a_one_line_error(tmp_path, capsys, make_out, needle):
    out = make_out(tmp_path)
    assert main(["headline", "--out", str(out), "--seeds", "1", "--policies", "sop"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_rows_that_are_not_the_graders_are_refused(tmp_path, capsys):
    assert headline(tmp_path, "--seeds", "1", "--policies", "sop") == 0
    path = tmp_path / "run" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    edited = json.loads(lines[5])
    edited["gap"] = 0
    path.write_text("\n".join([*lines[:5], json.dumps(edited), *lines[6:]]) + "\n")
    assert headline(tmp_path, "--seeds", "1", "--policies", "sop") == 2
    assert ":6 fails its checksum" in capsys.readouterr().err
    path.write_text("\n".join([*lines[:5], '{"policy": "sop"}', *lines[6:]]) + "\n")
    assert headline(tmp_path, "--seeds", "1", "--policies", "sop") == 2
    assert ":6 is not a graded episode" in capsys.readouterr().err


def test_the_summary_covers_every_policy_in_the_folder(tmp_path):
    assert headline(tmp_path, "--seeds", "1", "--policies", "sop,react") == 0
    assert headline(tmp_path, "--seeds", "1", "--policies", "finality_gate") == 0
    assert set(summary(tmp_path)) == {"sop", "react", "finality_gate"}
    assert "| react |" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize("args,needle", [(["--seeds", "100000"], "at most 100"),
                                         (["--workers", "500"], "workers must lie in")])
def test_bounds_say_why(tmp_path, capsys, args, needle):
    assert headline(tmp_path, "--policies", "sop", *args) == 2
    assert needle in capsys.readouterr().err


def test_a_private_split_from_a_master_seed_never_writes_the_seed(tmp_path, capsys):
    seed = 0x13cc26800f1091158ca4c76c984737eb0  # a master seed of 128 random bits
    assert headline(tmp_path, "--split", "private", "--master-seed", str(seed), "--seeds", "1",
                    "--policies", "finality_gate,react") == 0
    printed = capsys.readouterr().out
    fingerprint = json.loads((tmp_path / "run" / "summary.json").read_text())["fingerprint"]
    assert f"fingerprint {fingerprint}" in printed
    assert fingerprint not in (load_corpus("public").fingerprint,
                               load_corpus("regenerated").fingerprint)
    for path in (tmp_path / "run").iterdir():
        assert str(seed) not in path.read_bytes().decode(errors="ignore"), path
    assert str(seed) not in printed
    # the same seed resumes; another is refused (another corpus, by its fingerprint)
    assert headline(tmp_path, "--split", "private", "--master-seed", str(seed), "--seeds",
                    "1", "--policies", "finality_gate") == 0
    assert headline(tmp_path, "--split", "private", "--master-seed",
                    str(0x11711941acd8ccaeb19ed3c02daab0d5c), "--seeds", "1",
                    "--policies", "finality_gate") == 2
    assert headline(tmp_path, "--split", "private", "--policies", "sop", out="x") == 2
    assert "--master-seed" in capsys.readouterr().err


def test_an_outside_policy_cannot_count_its_way_to_the_task(tmp_path):
    """The job order is public; an outside policy that counts its cases in a file (state that
    survives the fork) must not learn its task from the count: the cases of a chunk run in an
    unrecorded order. The counter sees the same case indices in a different order each run."""
    log = tmp_path / "seen.txt"
    path = tmp_path / "counter.py"
    path.write_text("from agents.scripted import FinalityGate\n\nclass Counter(FinalityGate):\n"
                    "    def plan(self):\n"
                    f"        with open({str(log)!r}, 'a') as f:\n"
                    "            f.write(f'{self.brief.order_value}\\n')\n"
                    "        yield from super().plan()\n")
    orders = []
    for out in ("one", "two"):  # counting in a file: the sandbox would give each case its own
        log.write_text("")
        assert headline(tmp_path, "--seeds", "1", "--workers", "1", "--sandbox", "off",
                        "--policies", f"{path}:Counter", out=out) == 0
        orders.append(log.read_text().split())
    tasks = load_corpus("public").tasks
    assert sorted(orders[0]) == sorted(str(t.order_value) for t in tasks)
    assert orders[0] != orders[1] and orders[0] != [str(t.order_value) for t in tasks]
    assert (tmp_path / "one" / "episodes.jsonl").read_bytes() == (
        tmp_path / "two" / "episodes.jsonl").read_bytes()


def test_workers_start_fresh_and_write_the_same_file(tmp_path):
    path = tmp_path / "my_policy.py"
    path.write_text(MY_POLICY)
    for workers, out in (("1", "one"), ("2", "two")):
        assert headline(tmp_path, "--seeds", "1", "--workers", workers, "--policies",
                        f"{path}:ProbeThenShip,sop", out=out) == 0
    assert (tmp_path / "one" / "episodes.jsonl").read_bytes() == (
        tmp_path / "two" / "episodes.jsonl").read_bytes()
    assert os.path.exists(tmp_path / "one" / ".lock")
