"""The shipped PPO models are the ones the README's tables were graded from, and they load."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agents import run_episode
from agents.learned.policy import load_sb3
from agents.learned.trained_for import TrainedFor, read_onnx
from eval.grading.grader import RunConfig, grade
from eval.stats.summary import Units
from eval.sweeps.aggregate import unit_ids
from finality_gym import ENV_IDS, PROBE_ARMS, load_corpus

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
SUMS = dict(reversed(line.split()) for line in (MODELS / "SHA256SUMS").read_text().splitlines())


def test_every_shipped_model_is_listed_with_its_hash():
    shipped = [*MODELS.glob("*.zip"), *MODELS.glob("baselines/*/*.onnx")]
    assert set(SUMS) == {p.relative_to(MODELS).as_posix() for p in shipped} and SUMS
    for name, digest in SUMS.items():
        assert hashlib.sha256((MODELS / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", sorted(n for n in SUMS if n.endswith(".zip")))
def test_a_shipped_model_loads_and_plays_reproducibly(name):
    policy = load_sb3(MODELS / name)
    tasks = load_corpus("regenerated").tasks[::40]
    first = [run_episode(policy, task, 1, probe="none" if "noprobe" in name else "full")
             for task in tasks]
    again = [run_episode(load_sb3(MODELS / name), task, 1,
                         probe="none" if "noprobe" in name else "full") for task in tasks]
    assert first == again
    assert all(not r.lapsed for r in first)


@pytest.mark.parametrize("arm", PROBE_ARMS)
def test_each_arm_ships_its_five_seeds_best_models_saying_what_they_were_trained_for(arm):
    """models/baselines/ARM/seed_K.onnx: `python -m train export` of the best model of seed K
    of the arm's sweep (docs/sweeps/ARM), whose metadata names the arm."""
    seeds = json.loads((ROOT / "docs" / "sweeps" / arm / "summary.json").read_text())["seeds"]
    graphs = sorted((MODELS / "baselines" / arm).glob("*.onnx"))
    assert [g.name for g in graphs] == [f"seed_{k}.onnx" for k in seeds] and len(seeds) == 5
    env_id = next(env_id for env_id, probe in ENV_IDS.items() if probe == arm)
    assert {read_onnx(g) for g in graphs} == {TrainedFor.of_env(env_id)}


@pytest.mark.parametrize("arm", PROBE_ARMS)
def test_a_shipped_graph_plays_as_its_seed_did_in_the_sweep(arm, tmp_path):
    """Seed 0's graph, graded as the sweep graded its model (`regenerated`, five episode seeds,
    on its arm), gives the sweep's per-unit mean gaps: the summary is of these models. (Torch
    in the sweep, onnxruntime here: a rare sampled action may differ on another CPU, so 99 % of
    the units, not every one.)"""
    summary = json.loads((ROOT / "docs" / "sweeps" / arm / "summary.json").read_text())
    split = summary["splits"]["regenerated"]
    config = RunConfig((f"onnx:{MODELS / 'baselines' / arm / 'seed_0.onnx'}",),
                       split="regenerated", seeds=tuple(range(5)), probe=arm)
    rows = grade(config, tmp_path / "graded", workers=2, progress=False)
    corpus = load_corpus("regenerated")
    frame = Units(corpus, rows)
    mine = frame.gap(rows)
    assert unit_ids(frame, corpus) == split["per_unit"]["units"]
    theirs = np.array(split["per_unit"]["mean_gap"]["0"])
    same = np.isclose(mine.num / mine.den, theirs, atol=1e-6)
    assert same.mean() >= 0.99, (arm, int((~same).sum()))
