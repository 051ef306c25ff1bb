"""The experiments: grid sizes, arm profiles, the interaction arithmetic, the plan enumeration,
re-pricing, and resuming each experiment after a kill."""

import json
import os
import signal
import subprocess
import sys
import time
from itertools import product
from pathlib import Path

import numpy as np
import pytest

import finality_gym
from agents import make_policy, run_episode
import eval.experiments.ablation as ablation
import eval.experiments.costs as costs
import eval.experiments.plans as plans
import eval.experiments.tuning as tuning
from eval.grading.grader import RunConfig, grade
from finality_gym import FAMILIES, FaultProfile
from finality_gym.economics import Costs

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = finality_gym.load_corpus("public")


def test_grid_sizes():
    grid = tuning.grid()
    assert len(grid) == len({s for _, _, s in grid}) == 30
    assert len(tuning.POLL_INTERVALS) >= 6 and len(tuning.MAX_POLLS) >= 5
    assert ("sop" in {s for _, _, s in grid})  # the default is on the grid
    configs = costs.configurations()
    assert len(configs) == len(set(configs)) == 45
    assert {c.cogs_fraction for c in configs} == {0.4, 0.5, 0.6, 0.7, 0.8}
    assert {c.dispute_fee for c in configs} == {1000, 2500, 5000}
    assert {c.escalation_fee for c in configs} == {900, 1800, 3600}
    arms = ablation.arms()
    assert {f"only_{f}" for f in FAMILIES} | {f"minus_{f}" for f in FAMILIES} <= set(arms)
    assert {"baseline", "no_late_chargeback", "none", "loss_and_delay"} <= set(arms)


def test_plan_enumeration_is_exhaustive_and_without_duplicates():
    specs = plans.plans()
    assert len(specs) == len(set(specs)) == 9 * 3 * 9 * 5 == 1215
    expected = {(w1, r, w2, t) for w1, r, w2, t in product(
        plans.WAITS, ("none", "original", "fresh"), plans.WAITS,
        ("ship", "refund", "write_off", "escalate", "close"))}
    parsed = set()
    for spec in specs:
        p = make_policy(spec)
        parsed.add((p.w1, p.retry, p.w2, p.terminal))
    assert parsed == expected
    tasks = plans.sample_tasks()
    assert len(tasks) == len(set(tasks)) == 40 and tasks == plans.sample_tasks()
    archetypes = [PUBLIC.task(t).archetype for t in tasks]
    assert set(archetypes) == set(finality_gym.ARCHETYPES)
    assert all(4 <= archetypes.count(a) <= 5 for a in finality_gym.ARCHETYPES)


def test_an_open_loop_plan_does_what_it_says():
    task = PUBLIC.tasks[0]
    ep = finality_gym.Episode(task, seed=0)
    policy = make_policy("plan:60,original,0,refund")
    from agents import brief_for
    policy.reset(brief_for(task, 0, "full"))
    result, calls = None, []
    while not ep.done:
        call = policy.act(result)
        calls.append(call)
        result = ep.call(*call[:1], **call[1])
    assert calls == [("wait", {"ticks": 60}), ("retry_capture", {"key": "original"}),
                     ("refund", {})]
    late = run_episode(make_policy("plan:480,none,480,ship"), task, 0)
    assert late.lapsed and not late.goods_left  # the ship was refused; the case lapsed


def test_each_arm_profile_is_what_its_name_says():
    tasks = tuple(t.task_id for t in PUBLIC.tasks[::10])
    for name, config in ablation.arms().items():
        if name.startswith("only_"):
            assert config.faults.families == {name[5:]}
        elif name.startswith("minus_"):
            assert config.faults.families == set(FAMILIES) - {name[6:]}
        elif name == "none":
            assert config.faults == FaultProfile.none()
        elif name == "loss_and_delay":
            assert config.faults.families == {"loss", "delay"}
        else:
            assert config.faults == FaultProfile()
        if name == "no_late_chargeback":
            assert all(PUBLIC.task(t).archetype != "late_chargeback" for t in config.tasks)
            assert len(config.tasks) == 321 - 12
        assert config.faults.intensity in (0.0, 0.3)
        rows = []
        for seed in (0, 1):
            for task_id in tasks:
                rows.append(run_episode(make_policy("majority_vote"), PUBLIC.task(task_id), seed,
                                        faults=config.faults).fault_firings)
        for family in FAMILIES:
            fired = sum(r[family] for r in rows)
            if family in config.faults.families:
                assert fired > 0, (name, family)
            else:
                assert fired == 0, (name, family)


def test_interaction_arithmetic_by_hand():
    assert ablation.interaction(10.0, 4.0, 3.0, 1.0) == 4.0
    got = ablation.interaction(np.array([5.0, 2.0]), np.array([2.0, 1.0]), np.array([2.0, 1.0]),
                               np.array([1.0, 1.0]))
    assert got.tolist() == [2.0, 1.0]  # additive effects give 0 only when both - none = sum
    assert ablation.interaction(7.0, 4.0, 3.0, 0.0) == 0.0


def test_repricing_equals_rerunning_under_other_costs(tmp_path):
    config = RunConfig(("eager", "sop", "finality_gate", "optimistic"), seeds=(0,),
                       tasks=tuple(t.task_id for t in PUBLIC.tasks[::7]))
    rows = grade(config, tmp_path, workers=1, progress=False)
    repricer = costs.Repricer(rows, "public")
    for c in (Costs(0.4, 1000, 3600), Costs(0.8, 5000, 900)):
        gaps = repricer.gaps(c)
        for row, gap in zip(rows, gaps):
            rerun = run_episode(make_policy(row["policy"]), PUBLIC.task(row["task_id"]),
                                row["seed"], costs=c)
            assert rerun.gap == gap


def _kill_and_resume(tmp_path, name, extra, result_file):
    """Kill a run part-way, resume it, run it cleanly elsewhere; return both results and the
    resumed run's episode keys."""
    out = tmp_path / "killed"

    def command(folder):
        return [sys.executable, "-m", "eval", name, "--out", str(folder), "--workers", "1",
                "--no-progress", *extra]

    proc = subprocess.Popen(command(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        sizes = [p.stat().st_size for p in out.rglob("episodes.jsonl")] if out.exists() else []
        if sum(sizes) > 30_000:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / result_file).exists()  # killed before the end
    for cmd_out in (out, tmp_path / "clean"):
        done = subprocess.run(command(cmd_out), cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    keys = [(str(path), r["policy"], r["task_id"], r["seed"]) for path in out.rglob("episodes.jsonl")
            for r in map(json.loads, path.read_text().splitlines())]
    return (json.loads((out / result_file).read_text()),
            json.loads((tmp_path / "clean" / result_file).read_text()), keys)


# The ablation is not here: like tuning, it is a series of `grade` runs into sub-folders and a
# result computed from them (the costliest experiment to run twice; tuning covers the path).
@pytest.mark.parametrize("name,extra,result_file", [
    ("tuning", ["--seeds", "1"], "tuning.json"),
    ("costs", ["--seeds", "2"], "costs.json"),
    ("plans", [], "plans.json"),
])
def test_each_experiment_resumes_after_a_kill(tmp_path, name, extra, result_file):
    resumed, clean, keys = _kill_and_resume(tmp_path, name, extra, result_file)
    assert resumed == clean
    assert len(keys) == len(set(keys))  # nothing recorded twice


def test_world_firings_are_the_worlds_whatever_a_policy_reads():
    """The world's firings count every delivery to the horizon: the gate (which reads nothing
    but the probe) observes none, yet its world fires like every other policy's."""
    from finality_gym.replicas import world_firings
    task = PUBLIC.tasks[40]
    profile = FaultProfile()
    gate = run_episode(make_policy("finality_gate"), task, 0, faults=profile)
    assert sum(gate.fault_firings.values()) == 0
    world = [world_firings(t, s, profile) for t in PUBLIC.tasks[::8] for s in range(3)]
    for family in ("loss", "delay", "duplicate"):
        assert sum(w[family] for w in world) > 0
    assert all(w["stale_read"] == 0 for w in world)
    only_loss = FaultProfile(families=("loss",))
    assert all(sum(world_firings(t, 0, only_loss).values()) == world_firings(
        t, 0, only_loss)["loss"] for t in PUBLIC.tasks[::8])
    assert sum(world_firings(t, 0, FaultProfile.none())["loss"] for t in PUBLIC.tasks) == 0


def test_every_command_that_takes_a_policy_spec_lists_every_form_in_its_help():
    """One list of the spec forms (`agents.spec.FORMS`, which names every kind the parser
    knows), shown by every command's help where a spec is an argument."""
    from agents.spec import FORMS, KINDS
    from eval.__main__ import parser
    assert all(f"{kind}:" in FORMS for kind in KINDS)
    commands = parser()._subparsers._group_actions[0].choices
    takes_spec = {}
    for name, command in commands.items():
        for action in command._actions:
            if action.dest in ("policies", "policy", "spec"):
                takes_spec[name] = command.format_help()
    assert set(takes_spec) == {"headline", "show", "submit"}
    for name, text in takes_spec.items():
        flat = "".join(text.split())  # argparse wraps lines at hyphens too
        assert all(f"{kind}:" in flat for kind in KINDS), name
        assert "FILE.py:CLASS" in flat and "MODULE:CLASS" in flat, name
