"""The statistics on small hand-computed cases."""

import numpy as np
import pytest

from eval.stats.bootstrap import (UnitSums, bootstrap_indices, difference_interval, pass_hat_k,
                        percentile_interval, rank_disagreements, ranking, resample_counts)
from eval.stats.summary import summarize
from finality_gym import load_corpus


def test_pass_hat_k_by_hand():
    # tasks exact in 5, 3 and 0 of 5 trials
    got = pass_hat_k(np.array([5, 3, 0]), 5)
    assert got[0] == pytest.approx((1 + 3 / 5 + 0) / 3)
    assert got[1] == pytest.approx((1 + 3 / 10 + 0) / 3)  # C(3,2)/C(5,2)
    assert got[2] == pytest.approx((1 + 1 / 10 + 0) / 3)  # C(3,3)/C(5,3)
    assert got[3] == pytest.approx(1 / 3) and got[4] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        pass_hat_k(np.array([6]), 5)


def test_bootstrap_uses_the_explicit_generator():
    idx = bootstrap_indices(4, replicates=3, seed=9)
    assert np.array_equal(idx, np.random.default_rng(9).integers(0, 4, size=(3, 4)))
    assert np.array_equal(idx, bootstrap_indices(4, replicates=3, seed=9))
    assert not np.array_equal(idx, bootstrap_indices(4, replicates=3, seed=10))


def test_unit_sums_ratio_and_interval_by_hand():
    # unit 0 holds two episodes (gaps 1 and 3), unit 1 one episode (gap 8)
    sums = UnitSums.of(np.array([0, 0, 1]), np.array([1.0, 3.0, 8.0]), 2)
    assert list(sums.num) == [4.0, 8.0] and list(sums.den) == [2.0, 1.0]
    assert sums.value == pytest.approx(4.0)
    idx = resample_counts(np.array([[0, 0], [1, 1], [0, 1]]), 2)
    assert idx.tolist() == [[2, 0], [0, 2], [1, 1]]
    assert list(sums.replicates(idx)) == pytest.approx([2.0, 8.0, 4.0])
    lo, hi = sums.interval(idx)
    assert lo == pytest.approx(np.quantile([2, 8, 4], 0.025))
    assert hi == pytest.approx(np.quantile([2, 8, 4], 0.975))
    same = UnitSums.of(np.array([0, 1]), np.array([5.0, 5.0]), 2)
    assert same.interval(resample_counts(bootstrap_indices(2, 50), 2)) == (5.0, 5.0)
    assert difference_interval(sums, sums, idx) == (0.0, 0.0)


def test_percentile_interval_ignores_undefined_replicates():
    assert percentile_interval(np.array([np.nan, 1.0, 1.0])) == (1.0, 1.0)
    assert all(np.isnan(percentile_interval(np.array([np.nan]))))


def test_rank_disagreements_by_hand():
    assert rank_disagreements(["a", "b", "c"], ["a", "c", "b"]) == 2
    assert rank_disagreements(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert rank_disagreements(["a", "b", "c"], ["c", "a", "b"]) == 3
    with pytest.raises(ValueError):
        rank_disagreements(["a"], ["b"])
    assert ranking({"x": 1.0, "y": 2.0, "z": 1.0}, descending=True) == ["y", "x", "z"]
    assert ranking({"x": 1.0, "y": 2.0, "z": 1.0}, descending=False) == ["x", "z", "y"]


def _row(policy, task, seed, gap, archetype="pending_settle", twin=None, half=None,
         premature=False):
    return {"policy": policy, "task_id": task.task_id, "archetype": archetype, "seed": seed,
            "twin_id": twin, "twin_half": half, "gap": gap, "premature": premature,
            "label": "exact" if gap == 0 else "false_refusal", "cogs": 0, "liability": 0,
            "dispute": 0, "escalation": 0}


def test_paired_loss_and_exact_rate_by_hand():
    import finality_gym
    corpus = finality_gym.load_corpus("public")
    settle, fail = next(u for u in corpus.units if len(u) == 2)
    single = next(u for u in corpus.units if len(u) == 1)[0]
    rows = []
    for seed in (0, 1):
        rows += [_row("p", settle, seed, 100, twin=settle.twin_id, half="settle"),
                 _row("p", fail, seed, 300, "pending_fail", twin=fail.twin_id, half="fail"),
                 _row("p", single, seed, 0 if seed == 0 else 50, premature=seed == 1)]
    out = summarize(rows, load_corpus("public"), ["p"], [0, 1], replicates=200)["policies"]["p"]
    assert out["paired"] == {**out["paired"], "settle": 1.0, "fail": 3.0, "average": 2.0}
    assert out["mean_gap"] == pytest.approx((1 + 3 + 0 + 1 + 3 + 0.5) / 6, abs=1e-6)
    assert out["exact"] == pytest.approx(1 / 6, abs=1e-6)
    assert out["pass_k"] == pytest.approx([1 / 6, 0.0], abs=1e-6)  # only the singleton, at one seed of 2
    assert out["premature"] == pytest.approx(1 / 6, abs=1e-6)
    assert out["per_archetype"]["pending_fail"] == {"episodes": 2, "exact": 0.0, "mean_gap": 3.0}
    assert out["failure_labels"]["exact"] == 1 and out["failure_labels"]["false_refusal"] == 5
    # two units: the pair (mean gap 2 over 4 episodes) and the singleton (0.25 over 2)
    assert out["mean_gap_ci"][0] >= 0.25 - 1e-9 and out["mean_gap_ci"][1] <= 2.0 + 1e-9


# --- across training seeds: the two-way (units x seeds) bootstrap ------------------------------

from eval.stats.bootstrap import SeedUnitSums, improvement_probability, seed_resample_counts  # noqa: E402


def test_seed_unit_sums_by_hand():
    # two seeds, two units; seed 1 is worse by 2 on both
    sums = SeedUnitSums(np.array([[1.0, 3.0], [3.0, 5.0]]), np.ones((2, 2)))
    assert sums.value == pytest.approx(3.0) and list(sums.per_seed) == [2.0, 4.0]
    units = np.array([[2.0, 0.0], [1.0, 1.0]])  # replicate 0: unit 0 twice; 1: both units
    seeds = np.array([[0.0, 2.0], [2.0, 0.0]])  # replicate 0: seed 1 twice; 1: seed 0 twice
    assert sums.per_seed_replicates(units).tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert list(sums.replicates(units, seeds)) == pytest.approx([3.0, 2.0])
    # against a reference of 3 on both units: seed 0 better, seed 1 worse
    ref = UnitSums(np.array([3.0, 3.0]), np.ones(2))
    share, (lo, hi) = improvement_probability(sums, ref, units, seeds)
    assert share == 0.5
    # replicate 0: the reference is 3, seed 1 (drawn twice) ties it; replicate 1: seed 0 beats it
    assert (lo, hi) == pytest.approx((np.quantile([0.5, 1], 0.025), np.quantile([0.5, 1], 0.975)))
    tie = UnitSums(np.array([2.0, 2.0]), np.ones(2))  # seed 0 ties it: counts half
    assert improvement_probability(sums, tie, units, seeds)[0] == 0.25


def test_seed_resamples_draw_every_seed_with_replacement_from_their_generator():
    counts = seed_resample_counts(5, replicates=400, seed=1)
    assert counts.shape == (400, 5) and (counts.sum(axis=1) == 5).all()
    assert np.array_equal(counts, seed_resample_counts(5, replicates=400, seed=1))
    assert (counts.max(axis=1) > 1).mean() > 0.9  # with replacement: most replicates repeat one


def _coverage(n_seeds: int, n_units: int, seed_sd: float, trials: int = 300,
              replicates: int = 1000) -> dict[str, float]:
    """How often each interval of the mean holds the true mean, on data from a crossed
    random-effects model: gap[s, u] = 1 + seed effect + unit effect + noise, with the seeds and
    the units both drawn afresh in every trial (what a reader's next training run and next task
    set would be)."""
    rng = np.random.default_rng(12345)
    hits = {"two_way": 0, "units_only": 0, "runs_within_task": 0}
    for trial in range(trials):
        x = (1.0 + rng.normal(0, seed_sd, (n_seeds, 1)) + rng.normal(0, 3.0, (1, n_units))
             + rng.normal(0, 2.0, (n_seeds, n_units)))
        units = resample_counts(bootstrap_indices(n_units, replicates, trial), n_units)
        seeds = seed_resample_counts(n_seeds, replicates, 10_000 + trial)
        sums = SeedUnitSums(x, np.ones_like(x))
        intervals = {
            "two_way": sums.interval(units, seeds),
            "units_only": percentile_interval(units @ x.mean(axis=0) / n_units),
            # rliable's stratified bootstrap: each task's runs resampled, the tasks kept
            "runs_within_task": percentile_interval(np.take_along_axis(
                np.broadcast_to(x, (replicates, n_seeds, n_units)),
                rng.integers(0, n_seeds, (replicates, n_seeds, n_units)), axis=1).mean(axis=(1, 2))),
        }
        for name, (lo, hi) in intervals.items():
            hits[name] += lo <= 1.0 <= hi
    return {name: n / trials for name, n in hits.items()}


def test_two_way_interval_covers_the_mean_where_one_way_intervals_do_not():
    """Five seeds graded on the same 100 units, seeds differing as much as PPO's do: the
    two-way interval holds the true mean about 95 % of the time; resampling the units only
    misses the seed variance, and resampling runs within each task misses the unit variance."""
    coverage = _coverage(n_seeds=5, n_units=100, seed_sd=1.0)
    assert coverage["two_way"] >= 0.90, coverage
    assert coverage["units_only"] <= 0.85, coverage
    assert coverage["runs_within_task"] <= 0.50, coverage
