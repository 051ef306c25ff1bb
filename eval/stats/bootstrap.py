"""Honest statistics for graded episodes (docs/world.md section 10).

Intervals are 95 % percentile bootstraps over independent units (a twin pair is one unit, a
singleton another): each replicate resamples the units with replacement from one explicit seeded
generator, and every statistic is a ratio of per-unit sums, so a unit carries all its episodes
(every seed, both halves). Every policy is evaluated on the same resampled units, which is what
makes a difference between two policies a paired comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np

REPLICATES = 2000
CONFIDENCE = 0.95


def bootstrap_indices(n_units: int, replicates: int = REPLICATES, seed: int = 0) -> np.ndarray:
    """The (replicates x n_units) matrix of resampled unit indices, shared by every statistic."""
    return np.random.default_rng(seed).integers(0, n_units, size=(replicates, n_units))


def resample_counts(idx: np.ndarray, n_units: int) -> np.ndarray:
    """How many times each replicate drew each unit: a statistic's replicates are then two
    matrix-vector products instead of two gathers of the whole index matrix."""
    replicates = idx.shape[0]
    flat = idx + (np.arange(replicates) * n_units)[:, None]
    return np.bincount(flat.ravel(), minlength=replicates * n_units).reshape(
        replicates, n_units).astype(float)


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (float("nan"), float("nan"))
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class UnitSums:
    """A statistic as per-unit numerator and denominator sums: value = sum(num) / sum(den)."""

    num: np.ndarray
    den: np.ndarray

    @classmethod
    def of(cls, units: np.ndarray, values: np.ndarray, n_units: int,
           mask: np.ndarray | None = None) -> UnitSums:
        weights = np.ones(len(values)) if mask is None else mask.astype(float)
        return cls(np.bincount(units, weights=values * weights, minlength=n_units),
                   np.bincount(units, weights=weights, minlength=n_units))

    @property
    def value(self) -> float:
        den = self.den.sum()
        return float(self.num.sum() / den) if den else float("nan")

    def replicates(self, counts: np.ndarray) -> np.ndarray:
        """The statistic in every replicate; `counts` is `resample_counts` of the indices."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (counts @ self.num) / (counts @ self.den)

    def interval(self, counts: np.ndarray) -> tuple[float, float]:
        return percentile_interval(self.replicates(counts))


def difference_interval(a: UnitSums, b: UnitSums, counts: np.ndarray) -> tuple[float, float]:
    """Interval of value(a) - value(b), both computed on the same resampled units."""
    return percentile_interval(a.replicates(counts) - b.replicates(counts))


def pass_hat_k(successes: np.ndarray, trials: int) -> list[float]:
    """tau-bench's unbiased pass^k for k = 1..trials: the mean over tasks of C(c, k) / C(n, k),
    c being a task's successes in n trials; pass^n is the share of tasks exact in every trial."""
    successes = np.asarray(successes, dtype=int)
    if successes.size == 0:
        return [float("nan")] * trials
    if successes.min() < 0 or successes.max() > trials:
        raise ValueError(f"successes must lie in 0..{trials}")
    return [float(np.mean([comb(int(c), k) / comb(trials, k) for c in successes]))
            for k in range(1, trials + 1)]


def rank_disagreements(first: list[str], second: list[str]) -> int:
    """How many places two rankings of the same items put different items."""
    if sorted(first) != sorted(second):
        raise ValueError("the two rankings must rank the same items")
    return sum(a != b for a, b in zip(first, second))


def ranking(values: dict[str, float], descending: bool) -> list[str]:
    """Items ordered by value (ties by name, so the order is deterministic)."""
    sign = -1 if descending else 1
    return sorted(values, key=lambda name: (sign * values[name], name))


def seed_resample_counts(n_seeds: int, replicates: int = REPLICATES, seed: int = 1) -> np.ndarray:
    """How many times each replicate draws each training seed (replicates x n_seeds), from a
    generator of its own: the seeds are resampled independently of the units."""
    idx = np.random.default_rng(seed).integers(0, n_seeds, size=(replicates, n_seeds))
    return resample_counts(idx, n_seeds)


@dataclass(frozen=True)
class SeedUnitSums:
    """A statistic of a policy trained from several seeds, every seed graded on the same units:
    per-seed, per-unit sums (seeds x units); value = sum(num) / sum(den), which is the mean of
    the seeds' own values when every seed has the same episodes.

    Its interval is Owen's pigeonhole bootstrap (a two-way, crossed-random-effects bootstrap):
    each replicate resamples the units (`counts`, the same resamples every other policy uses, so
    comparisons stay paired) and, independently, the training seeds (`seed_counts`), and weighs
    every (seed, unit) cell by the product of the two counts. It carries both sources of
    variance: which tasks were drawn and which seeds were trained. Resampling the seeds' runs
    within each task instead (as rliable does for runs on independent tasks) treats the shared
    units as fixed and gives an interval far too narrow; resampling units only ignores the seeds
    (tests/grading/test_stats.py measures both by simulation)."""

    num: np.ndarray
    den: np.ndarray

    @classmethod
    def of(cls, per_seed: list[UnitSums]) -> SeedUnitSums:
        return cls(np.stack([s.num for s in per_seed]), np.stack([s.den for s in per_seed]))

    @property
    def value(self) -> float:
        den = self.den.sum()
        return float(self.num.sum() / den) if den else float("nan")

    @property
    def per_seed(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.num.sum(axis=1) / self.den.sum(axis=1)

    def per_seed_replicates(self, counts: np.ndarray) -> np.ndarray:
        """Every seed's value in every unit resample (replicates x seeds)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (counts @ self.num.T) / (counts @ self.den.T)

    def replicates(self, counts: np.ndarray, seed_counts: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return ((seed_counts * (counts @ self.num.T)).sum(axis=1)
                    / (seed_counts * (counts @ self.den.T)).sum(axis=1))

    def interval(self, counts: np.ndarray, seed_counts: np.ndarray) -> tuple[float, float]:
        return percentile_interval(self.replicates(counts, seed_counts))


def win_share(a, b) -> np.ndarray:
    """Elementwise (broadcast), 1 where `a` is lower than `b`, 1/2 on a tie, 0 where higher: the
    one rule by which a seed beats a reference or another seed (lower is better: a gap)."""
    better = np.asarray(b) - np.asarray(a)
    return (better > 0) + 0.5 * (better == 0)


def improvement_probability(learned: SeedUnitSums, reference: UnitSums, counts: np.ndarray,
                            seed_counts: np.ndarray, lower_is_better: bool = True
                            ) -> tuple[float, tuple[float, float]]:
    """The share of training seeds that beat a reference policy (a tie counts half), and its
    two-way bootstrap interval: in each replicate, the resampled seeds against the reference,
    both on the same resampled units."""
    def share(seeds: np.ndarray, ref) -> np.ndarray:
        ref = np.asarray(ref)[..., None]
        return win_share(seeds, ref) if lower_is_better else win_share(ref, seeds)

    point = float(share(learned.per_seed, reference.value).mean())
    wins = share(learned.per_seed_replicates(counts), reference.replicates(counts))
    reps = (seed_counts * wins).sum(axis=1) / seed_counts.sum(axis=1)
    return point, percentile_interval(reps)
