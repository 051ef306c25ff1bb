"""Knob tuning (docs/world.md section 11): grid-search `sop`'s two knobs on `public`, then re-measure the
tuned and the default configuration on `regenerated`.

The splits are independent draws, so a change across splits is the difference of two independent
bootstraps (each split resamples its own units, from its own generator); the tuned-minus-default
comparison within a split uses shared resamples. The gap between "tuned on public" and "tuned,
measured on regenerated" is the optimism of picking the best of 30 on the same data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from finality_gym import load_corpus

from eval.grading.grader import RunConfig, grade
from eval.grading.options import run_experiment, run_options
from eval.reports.format import table
from eval.reports.report import save
from eval.stats.bootstrap import percentile_interval
from eval.stats.summary import BOOTSTRAP_SEED, Units, by_policy, rounded_interval

POLL_INTERVALS = (15, 30, 45, 60, 90, 120)
MAX_POLLS = (2, 3, 4, 6, 8)
DEFAULT = "sop"
SEEDS = (0, 1, 2, 3, 4)


def spec(poll_interval: int, max_polls: int) -> str:
    if (poll_interval, max_polls) == (60, 4):
        return DEFAULT
    return f"sop:poll_interval={poll_interval},max_polls={max_polls}"


def grid() -> list[tuple[int, int, str]]:
    return [(p, m, spec(p, m)) for p in POLL_INTERVALS for m in MAX_POLLS]


def run(out: Path, workers: int = 2, progress: bool = True, seeds: tuple[int, ...] = SEEDS,
        backend: str = "local") -> dict:
    specs = tuple(s for _, _, s in grid())
    public = grade(RunConfig(specs, split="public", seeds=seeds), out / "public", workers=workers,
                   progress=progress, desc="tuning public", backend=backend)
    pub_units = Units(load_corpus("public"), public, seed=BOOTSTRAP_SEED)
    pub = {p: pub_units.gap(rows) for p, rows in by_policy(public).items()}
    tuned = min(specs, key=lambda s: (pub[s].value, s))
    measured = (tuned, DEFAULT) if tuned != DEFAULT else (DEFAULT,)
    regenerated = grade(RunConfig(measured, split="regenerated", seeds=seeds),
                        out / "regenerated", workers=workers, progress=progress,
                        desc="tuning regenerated", backend=backend)
    reg_units = Units(load_corpus("regenerated"), regenerated, seed=BOOTSTRAP_SEED + 1)
    reg = {p: reg_units.gap(rows) for p, rows in by_policy(regenerated).items()}
    configs = {}
    for name, role in ((tuned, "tuned"), (DEFAULT, "default")):
        pub_reps = pub[name].replicates(pub_units.counts)
        reg_reps = reg[name].replicates(reg_units.counts)
        configs[role] = {
            "policy": name, "public": round(pub[name].value, 4),
            "public_ci": rounded_interval(pub[name].interval(pub_units.counts), 2),
            "regenerated": round(reg[name].value, 4),
            "regenerated_ci": rounded_interval(reg[name].interval(reg_units.counts), 2),
            "change": round(reg[name].value - pub[name].value, 4),
            "change_ci": rounded_interval(percentile_interval(reg_reps - pub_reps), 2),
        }
    diffs = {}
    for split, sums, units in (("public", pub, pub_units), ("regenerated", reg, reg_units)):
        d = sums[tuned].replicates(units.counts) - sums[DEFAULT].replicates(units.counts)
        diffs[split] = {"diff": round(sums[tuned].value - sums[DEFAULT].value, 4),
                        "ci": rounded_interval(percentile_interval(d), 2)}
    result = {"grid": {"poll_interval": list(POLL_INTERVALS), "max_polls": list(MAX_POLLS),
                       "configurations": len(specs)},
              "public_mean_gap": {s: {"mean_gap": round(pub[s].value, 4),
                                      "mean_gap_ci": rounded_interval(pub[s].interval(pub_units.counts), 2)}
                                  for s in specs},
              "tuned": configs["tuned"], "default": configs["default"],
              "tuned_minus_default": diffs}
    save(out, "tuning", result, _report(result))
    _figure(result, out / "sop_grid.png")
    print(_summary_table(result))
    return result


def _summary_table(result: dict) -> str:
    rows = []
    for role in ("tuned", "default"):
        c = result[role]
        rows.append([role, c["policy"], f"{c['public']:.2f} {c['public_ci']}",
                     f"{c['regenerated']:.2f} {c['regenerated_ci']}",
                     f"{c['change']:+.2f} {c['change_ci']}"])
    return table(["", "configuration", "public mean gap $ [CI]", "regenerated $ [CI]",
                  "change $ [CI]"], rows)


def _report(result: dict) -> str:
    grid_rows = [[str(p)] + [f"{result['public_mean_gap'][spec(p, m)]['mean_gap']:.2f}"
                             for m in MAX_POLLS] for p in POLL_INTERVALS]
    d = result["tuned_minus_default"]
    return "\n".join([
        "# Tuning `sop`", "",
        f"Grid {len(POLL_INTERVALS)} x {len(MAX_POLLS)} on `public`, mean gap in "
        "dollars; the best configuration and the default re-measured on `regenerated`.", "",
        "## Public mean gap (rows: poll_interval, columns: max_polls)", "",
        table(["poll_interval"] + [str(m) for m in MAX_POLLS], grid_rows), "",
        "## Across the splits", "", _summary_table(result), "",
        f"Tuned minus default: public {d['public']['diff']:+.2f} {d['public']['ci']}, "
        f"regenerated {d['regenerated']['diff']:+.2f} {d['regenerated']['ci']}.", ""])


def _figure(result: dict, path: Path) -> None:
    from eval.reports.figures import save_figure, subplots
    grid_ = np.array([[result["public_mean_gap"][spec(p, m)]["mean_gap"] for m in MAX_POLLS]
                      for p in POLL_INTERVALS])
    fig, ax = subplots(figsize=(6, 4.8))
    image = ax.imshow(grid_, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(MAX_POLLS)))
    ax.set_xticklabels(MAX_POLLS)
    ax.set_yticks(range(len(POLL_INTERVALS)))
    ax.set_yticklabels(POLL_INTERVALS)
    ax.set_xlabel("max_polls")
    ax.set_ylabel("poll_interval (ticks)")
    for i in range(grid_.shape[0]):
        for j in range(grid_.shape[1]):
            ax.text(j, i, f"{grid_[i, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="mean gap ($), public")
    ax.set_title("sop's knobs on public")
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "tuning", seeds=5)


def main(args: argparse.Namespace) -> int:
    return run_experiment(run, args, seeds=tuple(range(args.seeds)))
