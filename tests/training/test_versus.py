"""`python -m eval versus A B`: two sweeps of one arm compared on the same episodes (does memory
help: RecurrentPPO's sweep against PPO's). Small sweep folders made from the shipped models
graded on a few tasks: what is tested is the comparison, not the learning."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import eval.sweeps.aggregate as aggregate
from eval.__main__ import main as eval_cli
from eval.grading.grader import RunConfig, grade
from eval.grading.runfolder import read_rows, seal
from agents.registry import HEADLINE
from eval.sweeps.versus import versus

ROOT = Path(__file__).resolve().parents[2]
FULL, NOPROBE = ROOT / "models" / "ppo_full.zip", ROOT / "models" / "ppo_noprobe.zip"
# Each sweep's two "seeds" are two policies of one model (sampled, greedy): seeds that differ
SWEEPS = {"a": (f"ppo:{FULL}", f"ppo-greedy:{FULL}"),
          "b": (f"ppo:{NOPROBE}", f"ppo-greedy:{NOPROBE}")}
TASKS = {split: tuple(f"{prefix}-{task}" for task in (
    "000a-pending_settle", "000b-pending_fail", "030a-unresolvable", "045-lost_settlement",
    "081-stale_processor", "234-late_chargeback")) for split, prefix in (("public", "pub"),
                                                                         ("regenerated", "reg"))}


def _sweep(out: Path, graded: dict[str, Path], specs: tuple[str, ...]) -> Path:
    """A sweep folder whose seed k is `specs[k]`'s rows (and the scripted policies') of `graded`."""
    runs = {}
    for seed, spec in enumerate(specs):
        folders = {}
        for split, source in graded.items():
            folders[split] = out / f"seed_{seed}" / f"eval_{split}"
            folders[split].mkdir(parents=True)
            shutil.copy(source / "run.json", folders[split] / "run.json")
            lines = [line for line in (source / "episodes.jsonl").read_text().splitlines()
                     if json.loads(line)["policy"] in (*HEADLINE, spec)]
            (folders[split] / "episodes.jsonl").write_text("\n".join(lines) + "\n")
        runs[seed] = aggregate.SeedRun(folders, {
            "best_timesteps": 1000, "validation_mean_gap": 10.0, "timesteps": 2000,
            "train_seconds": 1.0, "resumed_from": None, "machines": []})
    aggregate.run(out, runs, "full", "PPO")
    return out


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("versus")
    graded = {}
    for split in TASKS:
        graded[split] = root / f"graded_{split}"
        grade(RunConfig((*HEADLINE, *SWEEPS["a"], *SWEEPS["b"]), split=split, seeds=(0, 1),
                        tasks=TASKS[split]), graded[split], workers=1, progress=False)
    return {name: _sweep(root / name, graded, specs) for name, specs in SWEEPS.items()}


def test_the_difference_is_the_sweeps_own_aggregates_apart_and_paired(sweeps):
    ab, ba = versus(sweeps["a"], sweeps["b"]), versus(sweeps["b"], sweeps["a"])
    for split in aggregate.SPLITS:
        s, r = ab["splits"][split], ba["splits"][split]
        own = {k: json.loads((sweeps[k] / "summary.json").read_text())["splits"][split]
               ["across_seeds"] for k in "ab"}
        # each side is its sweep's own across-seed mean; A's interval is its sweep's own (the
        # same unit and seed resamples), B's seeds are drawn independently
        assert [s[k]["mean_gap"] for k in "ab"] == [own[k]["mean_gap"] for k in "ab"]
        assert s["a"]["mean_gap_ci"] == own["a"]["mean_gap_ci"]
        assert s["a_minus_b"] == pytest.approx(own["a"]["mean_gap"] - own["b"]["mean_gap"],
                                               abs=0.011)
        assert r["a_minus_b"] == pytest.approx(-s["a_minus_b"], abs=0.011)
        lo, hi = s["a_minus_b_ci"]
        assert lo <= s["a_minus_b"] <= hi and lo < hi
        # the probability that A does better: the share of (A seed, B seed) pairs, ties half
        a, b = (np.array(list(s[k]["per_seed"].values())) for k in "ab")
        pairs = (a[:, None] < b[None, :]) + 0.5 * (a[:, None] == b[None, :])
        assert s["probability_a_lower"] == pytest.approx(pairs.mean(), abs=0.006)
        assert s["probability_a_lower"] + r["probability_a_lower"] == pytest.approx(1, abs=0.011)
        assert s["answer"] == ("A lower" if hi < 0 else "B lower" if lo > 0
                               else "no difference shown")
    assert len(set(ab["splits"]["regenerated"]["a"]["per_seed"].values())) == 2  # seeds differ


def test_a_sweep_against_itself_is_no_difference(sweeps):
    result = versus(sweeps["a"], sweeps["a"])["splits"]["regenerated"]
    assert result["a_minus_b"] == 0 and result["probability_a_lower"] == 0.5
    assert result["answer"] == "no difference shown"


def test_the_cli_writes_the_comparison_and_refuses_what_is_not_comparable(sweeps, tmp_path,
                                                                           capsys):
    out = tmp_path / "cmp"
    assert eval_cli(["versus", str(sweeps["a"]), str(sweeps["b"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "report.md").read_text()
    written = json.loads((out / "versus.json").read_text())
    assert written == json.loads(json.dumps(versus(sweeps["a"], sweeps["b"])))
    assert f"| regenerated ({written['splits']['regenerated']['units']} units) |" in printed
    # another arm: refused, naming both, nothing written
    other = tmp_path / "other"
    shutil.copytree(sweeps["b"], other)
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "probe": "none"}))
    fresh = tmp_path / "fresh"
    assert eval_cli(["versus", str(sweeps["a"]), str(other), "--out", str(fresh)]) == 2
    assert "on the probe arm 'full'" in capsys.readouterr().err and not fresh.exists()
    # graded under another fault intensity: refused, naming what differs
    (other / "summary.json").write_text(json.dumps(summary))
    for run in other.glob("seed_*/eval_*/run.json"):
        manifest = json.loads(run.read_text())
        run.write_text(json.dumps({**manifest, "faults": {**manifest["faults"],
                                                          "intensity": 0.5}}))
    assert eval_cli(["versus", str(sweeps["a"]), str(other)]) == 2
    assert "differ in faults" in capsys.readouterr().err
    # an --out holding something else
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert eval_cli(["versus", str(sweeps["a"]), str(sweeps["b"]), "--out",
                     str(tmp_path / "taken")]) == 2
    assert "holds notes.txt" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]


def test_the_summary_publishes_every_seeds_and_scripted_policys_per_unit_scores(sweeps):
    from finality_gym import load_corpus
    summary = json.loads((sweeps["a"] / "summary.json").read_text())
    unweighted = 0  # the policies whose plain average of the units is not their mean gap
    for split, ids in TASKS.items():
        s = summary["splits"][split]
        p = s["per_unit"]
        # the units are the split's, from its corpus, in its order: the twin pair 000 is one
        # unit, 030a (its twin not graded) another, each singleton its own
        tasks = [load_corpus(split).task(i) for i in ids]
        assert p["units"] == list(dict.fromkeys(t.twin_id or t.task_id for t in tasks))
        assert len(p["units"]) == s["units"] == 5
        # two episode seeds per task: the pair weighs twice a singleton
        assert p["episodes"] == [4, 2, 2, 2, 2]
        gaps = np.array([p["mean_gap"][str(row["seed"])] for row in s["seeds"]])
        exact = np.array([p["exact"][str(row["seed"])] for row in s["seeds"]])
        assert gaps.shape == exact.shape == (2, 5) and sorted(p["mean_gap"]) == ["0", "1"]
        # a seed's mean gap is episode-weighted: the units averaged with `episodes` as weights
        # give it back (and, for a policy whose pair loses more or less than the rest, the
        # plain average of the units does not: below)
        for row, g, e in zip(s["seeds"], gaps, exact):
            assert np.average(g, weights=p["episodes"]) == pytest.approx(row["mean_gap"], abs=1e-5)
            assert np.average(e, weights=p["episodes"]) == pytest.approx(row["exact"], abs=1e-5)
        assert np.average(gaps, axis=1, weights=p["episodes"]).mean() == pytest.approx(
            s["across_seeds"]["mean_gap"], abs=1e-5)
        assert set(p["scripted"]) == set(s["scripted"])
        for policy, scores in p["scripted"].items():
            assert len(scores["mean_gap"]) == len(scores["exact"]) == 5
            mean = s["scripted"][policy]["mean_gap"]
            assert np.average(scores["mean_gap"], weights=p["episodes"]) == pytest.approx(
                mean, abs=1e-5)
            unweighted += abs(np.mean(scores["mean_gap"]) - mean) > 0.01
        assert p["scripted"]["finality_oracle"]["exact"] == [1.0] * 5
    assert unweighted > 0


def test_a_seed_graded_on_fewer_episodes_is_refused_naming_it(sweeps, tmp_path):
    out = tmp_path / "cut"
    shutil.copytree(sweeps["a"], out)
    rows = out / "seed_1" / "eval_public" / "episodes.jsonl"
    lines = rows.read_text().splitlines()
    spec = SWEEPS["a"][1]
    cut = max(i for i, line in enumerate(lines) if json.loads(line)["policy"] == spec)
    rows.write_text("\n".join(lines[:cut] + lines[cut + 1:]) + "\n")
    before = (out / "summary.json").read_bytes()
    runs = {seed: aggregate.SeedRun({split: out / f"seed_{seed}" / f"eval_{split}"
                                     for split in aggregate.SPLITS},
                                    {"best_timesteps": 1000, "validation_mean_gap": 10.0,
                                     "timesteps": 2000, "train_seconds": 1.0,
                                     "resumed_from": None}) for seed in (0, 1)}
    with pytest.raises(ValueError, match="seed 1 was graded on other episodes than seed 0 on "
                                         "public \\(11 against 12\\)"):  # 6 tasks x 2
        aggregate.run(out, runs, "full", "PPO")
    assert (out / "summary.json").read_bytes() == before


def test_policies_one_sweep_graded_alone_are_left_out_and_shared_ones_must_agree(sweeps,
                                                                               tmp_path):
    """An offline baseline's seeds are graded beside their dataset's `env:` rules too: the
    comparison takes the policies both sweeps graded, and is the same as without the extra
    ones; a shared policy whose rows differ is another world, refused."""
    extra = tmp_path / "extra"
    shutil.copytree(sweeps["b"], extra)
    for path in extra.glob("seed_*/eval_*/episodes.jsonl"):
        rows = read_rows(path)
        added = [{**row, "policy": "env:react"} for row in rows if row["policy"] == "react"]
        path.write_text("".join(seal(row) + "\n" for row in rows + added))
    assert versus(sweeps["a"], extra)["splits"] == versus(sweeps["a"], sweeps["b"])["splits"]
    for path in extra.glob("seed_*/eval_*/episodes.jsonl"):
        rows = read_rows(path)
        next(row for row in rows if row["policy"] == "react")["gap"] += 100
        path.write_text("".join(seal(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match="not graded in the same world"):
        versus(sweeps["a"], extra)
