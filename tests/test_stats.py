"""The statistics on small hand-computed cases."""

import numpy as np
import pytest

from eval.stats import (UnitSums, bootstrap_indices, difference_interval, pass_hat_k,
                        percentile_interval, rank_disagreements, ranking, resample_counts)
from eval.summary import summarize


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
    out = summarize(rows, "public", ["p"], [0, 1], replicates=200)["policies"]["p"]
    assert out["paired"] == {**out["paired"], "settle": 1.0, "fail": 3.0, "average": 2.0}
    assert out["mean_gap"] == pytest.approx((1 + 3 + 0 + 1 + 3 + 0.5) / 6, abs=1e-6)
    assert out["exact"] == pytest.approx(1 / 6, abs=1e-6)
    assert out["pass_k"] == pytest.approx([1 / 6, 0.0], abs=1e-6)  # only the singleton, at one seed of 2
    assert out["premature"] == pytest.approx(1 / 6, abs=1e-6)
    assert out["per_archetype"]["pending_fail"] == {"episodes": 2, "exact": 0.0, "mean_gap": 3.0}
    assert out["failure_labels"]["exact"] == 1 and out["failure_labels"]["false_refusal"] == 5
    # two units: the pair (mean gap 2 over 4 episodes) and the singleton (0.25 over 2)
    assert out["mean_gap_ci"][0] >= 0.25 - 1e-9 and out["mean_gap_ci"][1] <= 2.0 + 1e-9
