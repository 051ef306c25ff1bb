"""From graded rows to the per-policy summary of docs/world.md section 10 (`summary.json`).

Money in the summary is in dollars (the records keep integer cents). `paired` is the mean gap on
the settling halves of the twin pairs, on the failing halves, and their average; only twin-pair
episodes enter it. Differences (`vs_baseline`) are taken against the best unprivileged scripted
policy of the run by mean gap (`finality_gate` in the default world, `react` without the probe), so a
learned policy is compared with the best hand-written rule of its arm. A run without one (a learned
model graded alone) has no `vs_baseline` at all, rather than a comparison of the model with itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from agents import is_unprivileged_scripted
from finality_gym import ARCHETYPES, Corpus

from eval.grading.labels import LABELS
from eval.stats.bootstrap import (
    REPLICATES,
    UnitSums,
    bootstrap_indices,
    difference_interval,
    pass_hat_k,
    percentile_interval,
    rank_disagreements,
    ranking,
    resample_counts,
)

BOOTSTRAP_SEED = 20261130


def rounded(x: float, digits: int = 6) -> float:
    """A statistic as JSON keeps it: a plain float, rounded (6 digits unless said)."""
    return round(float(x), digits)


def rounded_interval(interval: tuple[float, float], digits: int = 6) -> list[float]:
    """An interval as JSON keeps it: `[low, high]`, each end `rounded`."""
    return [rounded(interval[0], digits), rounded(interval[1], digits)]


class PolicyRows:
    """One policy's rows as arrays, with the statistics' per-unit sums."""

    def __init__(self, rows: list[dict], unit_of: dict[str, int], n_units: int):
        self.rows = rows
        self.n_units = n_units
        self.units = np.array([unit_of[r["task_id"]] for r in rows], dtype=int)
        self.gap = np.array([r["gap"] for r in rows], dtype=float) / 100.0
        self.exact = np.array([r["gap"] == 0 for r in rows], dtype=float)
        self.premature = np.array([r["premature"] for r in rows], dtype=float)
        half = np.array([r["twin_half"] or "" for r in rows])
        self.settle, self.fail = half == "settle", half == "fail"

    def sums(self, values: np.ndarray, mask: np.ndarray | None = None) -> UnitSums:
        return UnitSums.of(self.units, values, self.n_units, mask)


class Units:
    """The independent units of a split that some row touches, and their shared resamples."""

    def __init__(self, corpus: Corpus, rows: list[dict], replicates: int = REPLICATES,
                 seed: int = BOOTSTRAP_SEED):
        present = {r["task_id"] for r in rows}
        units = [u for u in corpus.units if any(t.task_id in present for t in u)]
        self.n = len(units)
        self.unit_of = {t.task_id: i for i, u in enumerate(units) for t in u}
        self.counts = resample_counts(bootstrap_indices(self.n, replicates, seed), self.n)

    def gap(self, rows: list[dict]) -> UnitSums:
        """Mean gap in dollars as per-unit sums."""
        return self._sums(rows, np.array([r["gap"] for r in rows], dtype=float) / 100)

    def exact(self, rows: list[dict]) -> UnitSums:
        """Exact rate as per-unit sums."""
        return self._sums(rows, np.array([r["gap"] == 0 for r in rows], dtype=float))

    def _sums(self, rows: list[dict], values: np.ndarray) -> UnitSums:
        units = np.array([self.unit_of[r["task_id"]] for r in rows], dtype=int)
        return UnitSums.of(units, values, self.n)


def by_policy(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        out[row["policy"]].append(row)
    return out


def best_scripted(mean_gaps: dict[str, float]) -> str | None:
    """The default baseline: the unprivileged scripted policy of lowest mean gap (ties by name),
    None when there is none."""
    scripted = [p for p in mean_gaps if is_unprivileged_scripted(p)]
    return min(scripted, key=lambda p: (mean_gaps[p], p), default=None)


def summarize(rows: list[dict], corpus: Corpus, policies: list[str], seeds: list[int],
              replicates: int = REPLICATES, bootstrap_seed: int = BOOTSTRAP_SEED,
              baseline: str | None = None) -> dict:
    """`baseline` names the policy of `vs_baseline`; by default the best unprivileged scripted
    policy of the run, and none (no `vs_baseline`) when the run has no such policy."""
    frame = Units(corpus, rows, replicates, bootstrap_seed)
    idx = frame.counts
    grouped = by_policy(rows)
    tables = {p: PolicyRows(grouped[p], frame.unit_of, frame.n) for p in policies}
    out: dict = {}
    for name, t in tables.items():
        out[name] = _policy_summary(t, idx, len(seeds))
    if baseline is None:
        baseline = best_scripted({p: out[p]["mean_gap"] for p in policies})
    if baseline is not None:
        base = tables[baseline]
        for name, t in tables.items():
            out[name]["vs_baseline"] = {
                "baseline": baseline,
                "mean_gap_diff": rounded(t.sums(t.gap).value - base.sums(base.gap).value),
                "mean_gap_diff_ci": rounded_interval(difference_interval(t.sums(t.gap), base.sums(base.gap),
                                                            idx)),
                "exact_diff": rounded(t.sums(t.exact).value - base.sums(base.exact).value),
                "exact_diff_ci": rounded_interval(difference_interval(t.sums(t.exact), base.sums(base.exact),
                                                         idx)),
            }
    by_exact = ranking({p: out[p]["exact"] for p in policies}, descending=True)
    by_paired = ranking({p: out[p]["paired"]["average"] for p in policies}, descending=False)
    return {
        "split": corpus.split, "fingerprint": corpus.fingerprint, "seeds": list(seeds),
        "episodes": len(rows),
        "bootstrap": {"replicates": replicates, "seed": bootstrap_seed, "units": frame.n,
                      "confidence": 0.95, "method": "percentile, units resampled (twin pairs "
                      "together), shared resamples across policies"},
        "policies": out,
        "rankings": {"by_exact": by_exact, "by_paired_loss": by_paired,
                     "disagreements": rank_disagreements(by_exact, by_paired)},
    }


def _policy_summary(t: PolicyRows, idx: np.ndarray, trials: int) -> dict:
    exact, gap = t.sums(t.exact), t.sums(t.gap)
    settle, fail = t.sums(t.gap, t.settle), t.sums(t.gap, t.fail)
    average_reps = (settle.replicates(idx) + fail.replicates(idx)) / 2
    successes: dict[str, int] = Counter()
    for row in t.rows:
        successes[row["task_id"]] += row["gap"] == 0
    per_archetype = {}
    for archetype in ARCHETYPES:
        mask = np.array([r["archetype"] == archetype for r in t.rows])
        if mask.any():
            per_archetype[archetype] = {"episodes": int(mask.sum()),
                                        "exact": rounded(t.exact[mask].mean()),
                                        "mean_gap": rounded(t.gap[mask].mean())}
    labels = Counter(r["label"] for r in t.rows)
    return {
        "episodes": len(t.rows),
        "exact": rounded(exact.value), "exact_ci": rounded_interval(exact.interval(idx)),
        "mean_gap": rounded(gap.value), "mean_gap_ci": rounded_interval(gap.interval(idx)),
        "pass_k": [rounded(x) for x in pass_hat_k(np.array(list(successes.values())), trials)],
        "paired": {"settle": rounded(settle.value), "fail": rounded(fail.value),
                   "average": rounded((settle.value + fail.value) / 2),
                   "average_ci": rounded_interval(percentile_interval(average_reps))},
        "premature": rounded(t.premature.mean()),
        "per_archetype": per_archetype,
        "loss_breakdown": {k: rounded(np.mean([r[k] for r in t.rows]) / 100)
                           for k in ("cogs", "liability", "dispute", "escalation")},
        "failure_labels": {label: labels.get(label, 0) for label in LABELS},
    }
