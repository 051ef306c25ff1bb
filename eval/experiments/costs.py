"""Cost sweep (docs/world.md section 11): 45 configurations of (cogs fraction, dispute fee, escalation fee).

No policy reads the cost constants, so each graded headline episode is re-priced from what its
record keeps (order value, cash, goods left, escalated) instead of being re-run; the reference is
re-priced from the oracle's outcome. At the default constants the re-priced gaps equal the
recorded ones (checked on every run).
"""

from __future__ import annotations

import argparse
from itertools import product
from pathlib import Path

import numpy as np

from agents.registry import GATE, HEADLINE
from finality_gym import load_corpus
from finality_gym.economics import DEFAULT_COSTS, Costs
from finality_gym.oracle import reference_outcome

from eval.grading.grader import RunConfig, grade
from eval.grading.options import run_experiment, run_options
from eval.reports.format import table
from eval.reports.report import save
from eval.stats.bootstrap import ranking

COGS_FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)
DISPUTE_FEES = (1000, 2500, 5000)
ESCALATION_FEES = (900, 1800, 3600)
UNGATED = tuple(p for p in HEADLINE if p not in (GATE, "finality_oracle"))


def configurations() -> list[Costs]:
    return [Costs(c, d, e) for c, d, e in product(COGS_FRACTIONS, DISPUTE_FEES, ESCALATION_FEES)]


def _positions(ov, cash, goods, escalated, costs: Costs) -> np.ndarray:
    """docs/world.md section 7, vectorized over episodes, in integer cents."""
    bps = round(costs.cogs_fraction * 10000)
    cogs = np.where(goods, (ov * bps + 5000) // 10000, 0)
    liability = np.maximum(0, cash - np.where(goods, ov, 0))
    dispute = np.where(liability > 0, costs.dispute_fee, 0)
    return cash - cogs - liability - dispute - np.where(escalated, costs.escalation_fee, 0)


class Repricer:
    """The headline records as arrays, re-priceable under any costs."""

    def __init__(self, rows: list[dict], split: str):
        corpus = load_corpus(split)
        self.policies = np.array([r["policy"] for r in rows])
        cols = ("order_value", "cash", "goods_left", "escalated")
        self.ov, self.cash, self.goods, self.esc = (np.array([r[c] for r in rows], dtype=np.int64)
                                                    for c in cols)
        refs = [reference_outcome(corpus.task(r["task_id"])) for r in rows]
        self.ref = tuple(np.array([getattr(o, f) for o in refs], dtype=np.int64)
                         for f in ("order_value", "cash", "goods_left", "escalated"))
        self.recorded_gap = np.array([r["gap"] for r in rows], dtype=np.int64)

    def gaps(self, costs: Costs) -> np.ndarray:
        return (_positions(*self.ref, costs)
                - _positions(self.ov, self.cash, self.goods, self.esc, costs))

    def mean_gaps(self, costs: Costs) -> dict[str, float]:
        gaps = self.gaps(costs)
        return {p: float(gaps[self.policies == p].mean()) / 100 for p in dict.fromkeys(
            self.policies.tolist())}


def run(out: Path, workers: int = 2, progress: bool = True,
        headline_dir: Path | None = None, seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
        backend: str = "local") -> dict:
    """`headline_dir` may name a headline run's folder to re-price instead of grading anew."""
    rows = grade(RunConfig(HEADLINE, seeds=seeds), headline_dir or out / "headline", workers=workers,
                 progress=progress, desc="costs (headline records)", backend=backend)
    repricer = Repricer(rows, "public")
    if not np.array_equal(repricer.gaps(DEFAULT_COSTS), repricer.recorded_gap):
        raise AssertionError("re-pricing at the default costs does not reproduce the records")
    default_order = ranking(repricer.mean_gaps(DEFAULT_COSTS), descending=False)
    per_config = []
    for costs in configurations():
        means = repricer.mean_gaps(costs)
        order = ranking(means, descending=False)
        per_config.append({
            "costs": costs.to_dict(), "mean_gap": {p: round(v, 4) for p, v in means.items()},
            "order": order, "same_order_as_default": order == default_order,
            "gate_ahead_of_every_ungated": all(means[GATE] < means[p] for p in UNGATED)})
    result = {"configurations": len(per_config), "default_order": default_order,
              "same_order_as_default": sum(c["same_order_as_default"] for c in per_config),
              "gate_ahead_of_every_ungated": sum(c["gate_ahead_of_every_ungated"]
                                                 for c in per_config),
              "per_configuration": per_config}
    save(out, "costs", result, _report(result))
    _figure(result, out / "cost_sweep_ranks.png")
    print(f"cost sweep: the nine-policy ordering equals the default's in "
          f"{result['same_order_as_default']} of 45 configurations; the gate is ahead of every "
          f"ungated policy in {result['gate_ahead_of_every_ungated']} of 45")
    return result


def _label(costs: dict) -> str:
    return (f"{costs['cogs_fraction']:.1f}/${costs['dispute_fee'] // 100}/"
            f"${costs['escalation_fee'] // 100}")


def _report(result: dict) -> str:
    rows = [[_label(c["costs"]), "yes" if c["same_order_as_default"] else "no",
             "yes" if c["gate_ahead_of_every_ungated"] else "no", ", ".join(c["order"])]
            for c in result["per_configuration"]]
    return "\n".join([
        "# Cost sweep", "",
        "Headline records (public) re-priced under 45 cost configurations "
        "(cogs fraction / dispute fee / escalation fee).", "",
        f"- default ordering by mean gap: {', '.join(result['default_order'])}",
        f"- configurations with the same nine-policy ordering: {result['same_order_as_default']}"
        f" of {result['configurations']}",
        f"- configurations where the gate is ahead of every ungated policy: "
        f"{result['gate_ahead_of_every_ungated']} of {result['configurations']}", "",
        table(["costs", "same order", "gate ahead", "ordering (best first)"], rows), ""])


def _figure(result: dict, path: Path) -> None:
    from eval.reports.figures import save_figure, subplots
    policies = result["default_order"]
    configs = result["per_configuration"]
    ranks = np.array([[c["order"].index(p) + 1 for c in configs] for p in policies])
    fig, ax = subplots(figsize=(12, 4.6))
    image = ax.imshow(ranks, cmap="viridis_r", aspect="auto")
    ax.set_yticks(range(len(policies)))
    ax.set_yticklabels(policies, fontsize=8)
    ax.set_xticks(range(len(configs)))
    # Two dollar signs in one label would make matplotlib typeset the text between them as
    # mathematics (dropping the signs, and parsing 45 labels); escaped, they print as written.
    ax.set_xticklabels([_label(c["costs"]).replace("$", r"\$") for c in configs], rotation=90,
                       fontsize=6)
    fig.colorbar(image, ax=ax, label="rank by mean gap (1 = best)")
    ax.set_title("Rank of each policy under 45 cost configurations (cogs / dispute / escalation)")
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "costs", seeds=5)


def main(args: argparse.Namespace) -> int:
    return run_experiment(run, args, seeds=tuple(range(args.seeds)))
