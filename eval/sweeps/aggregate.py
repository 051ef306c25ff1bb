"""A learned policy across training seeds: the sweep's `summary.json`, `report.md`, `seeds.png`.

Every seed's run graded its best model (chosen on validation only) next to the nine scripted
policies, with the shared grader, on `regenerated` and `public` (`seed_<k>/eval_<split>/`). The
scripted policies' rows are the same in every seed's folder (checked: a seed graded in another
world would be refused), so the aggregate takes them once. Per split it reports:

- per seed: mean gap and exact rate with their unit-bootstrap intervals, the paired difference
  from the best unprivileged scripted policy of the arm, and the validation step of the model;
  that policy is chosen on `public`, the split the learner trained and was validated on, and
  compared with on both (choosing it on `regenerated` would pick the comparison on the data
  that is to judge it);
- across seeds: mean gap, exact rate and the paired difference with two-way (units x seeds,
  Owen's pigeonhole) bootstrap intervals, the probability of improvement (the share of seeds
  with a lower mean gap than that policy) with its interval, and the spread between seeds;
- `per_unit`: the arrays the two-way bootstrap resamples, so that any other estimator (IQM, a
  performance profile) can be computed from the summary alone: `units` (each unit's id in the
  corpus: a twin pair's `twin_id`, a singleton's task id, in the corpus's order), `episodes`
  (each unit's graded episodes, the same for every seed and policy, else the aggregate is
  refused), `mean_gap` and `exact` (per training seed, `"<seed>": [one value per unit]`: the
  unit's episodes averaged) and `scripted` (`{policy: {"mean_gap": [...], "exact": [...]}}`).
  A seed's mean gap is the average of its row weighted by `episodes` (a twin pair weighs twice
  a singleton), not the plain average of the units.

Money in dollars; intervals are 95 % percentile bootstraps (`eval/stats/bootstrap.py`). The summary and
the report name the machines every seed trained on (`eval/sweeps/provenance.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents import PolicySpec, is_unprivileged_scripted
from agents.spec import ONNX
from finality_gym import Corpus, load_corpus

from eval.grading.runfolder import SUMMARY, read_rows
from eval.reports.figures import save_figure, subplots
from eval.reports.format import interval, number
from eval.stats.bootstrap import (
    REPLICATES,
    SeedUnitSums,
    UnitSums,
    difference_interval,
    improvement_probability,
    percentile_interval,
    seed_resample_counts,
)
from eval.stats.summary import (
    BOOTSTRAP_SEED,
    Units,
    best_scripted,
    by_policy,
    rounded,
    rounded_interval,
)
from eval.sweeps.provenance import describe

SPLITS = ("regenerated", "public")
SEED_BOOTSTRAP_SEED = BOOTSTRAP_SEED + 1


@dataclass(frozen=True)
class SeedRun:
    """One training seed as the aggregate sees it, whatever trained it: the results folder its
    model was graded into on each split, and its training's figures (`best_timesteps`,
    `validation_mean_gap` in dollars, `timesteps`, `train_seconds`, `resumed_from`, and
    `machines`: `eval/sweeps/provenance.py`'s record of each process that trained it, if known)."""

    graded: dict[str, Path]
    training: dict


def learned_spec(policies) -> str:
    """The one trained model among a seed's graded policies: an SB3 archive or an ONNX graph
    (a trainer of one's own, `examples/masked_ppo.py`)."""
    specs = [p for p in policies
             if (parsed := PolicySpec.parse(p)).learned or parsed.kind in ONNX]
    if len(specs) != 1:
        raise ValueError(f"expected one learned policy, found {specs or 'none'}")
    return specs[0]


def load_split(runs: dict[int, SeedRun], split: str) -> tuple[dict[str, list[dict]], dict]:
    """The scripted policies' rows (once) and each seed's learned rows, on one split."""
    scripted: dict[str, list[dict]] | None = None
    learned: dict = {}
    manifest = None
    for seed, run in runs.items():
        path = run.graded[split]
        if not (path / "episodes.jsonl").is_file():
            raise FileNotFoundError(f"seed {seed} has no graded episodes in {path}")
        this = json.loads((path / "run.json").read_text())
        this.pop("inputs", None)
        if manifest is None:
            manifest = this
        elif this != manifest:
            raise ValueError(f"{path} was graded under another configuration than the other seeds")
        grouped = by_policy(read_rows(path / "episodes.jsonl"))
        spec = learned_spec(grouped)
        learned[seed] = grouped.pop(spec)
        rows = {p: sorted(rs, key=lambda r: (r["task_id"], r["seed"])) for p, rs in grouped.items()}
        if scripted is None:
            scripted = rows
        elif rows != scripted:
            raise ValueError(f"the scripted policies' rows in {path} differ from the first "
                             "seed's: the seeds were not graded in the same world")
    return scripted or {}, learned


def baseline(scripted: dict[str, list[dict]], split: str, replicates: int = REPLICATES) -> str:
    """The sweep's baseline: `eval.stats.summary.best_scripted` (the one rule) over the mean gaps
    of `scripted` (one split's rows); a sweep without one cannot be compared, so it is an error."""
    frame = Units(load_corpus(split), [r for rs in scripted.values() for r in rs], replicates, BOOTSTRAP_SEED)
    best = best_scripted({p: frame.gap(rows).value for p, rows in scripted.items()})
    if best is None:
        raise ValueError("no unprivileged scripted policy was graded next to the seeds")
    return best


def summarize_split(scripted: dict[str, list[dict]], learned: dict[int, list[dict]],
                    split: str, best: str, replicates: int = REPLICATES,
                    corpus: Corpus | None = None) -> dict:
    """One split's tables, against the scripted policy `best` (chosen on `public`); `corpus` is
    the split's (a published split's by default; a private one is made from its seed)."""
    seeds = sorted(learned)
    every = [r for rs in scripted.values() for r in rs] + [r for s in seeds for r in learned[s]]
    corpus = corpus or load_corpus(split)
    frame = Units(corpus, every, replicates, BOOTSTRAP_SEED)
    counts = frame.counts
    seed_counts = seed_resample_counts(len(seeds), replicates, SEED_BOOTSTRAP_SEED)
    gaps = {p: frame.gap(rs) for p, rs in scripted.items()}
    if best not in gaps:
        raise ValueError(f"{best} was not graded on {split}")
    ref = gaps[best]

    ref_exact = frame.exact(scripted[best])
    per_seed_gap = [frame.gap(learned[s]) for s in seeds]
    per_seed_exact = [frame.exact(learned[s]) for s in seeds]
    table = []
    for seed, gap, ex in zip(seeds, per_seed_gap, per_seed_exact):
        table.append({"seed": seed, "mean_gap": rounded(gap.value),
                      "mean_gap_ci": rounded_interval(gap.interval(counts)),
                      "exact": rounded(ex.value), "exact_ci": rounded_interval(ex.interval(counts)),
                      "vs_best_scripted": rounded(gap.value - ref.value),
                      "vs_best_scripted_ci": rounded_interval(difference_interval(gap, ref, counts))})
    gap_all, exact_all = SeedUnitSums.of(per_seed_gap), SeedUnitSums.of(per_seed_exact)
    diff_reps = gap_all.replicates(counts, seed_counts) - ref.replicates(counts)
    exact_diff_reps = exact_all.replicates(counts, seed_counts) - ref_exact.replicates(counts)
    p_improve, p_ci = improvement_probability(gap_all, ref, counts, seed_counts)
    per_seed = gap_all.per_seed
    return {
        "split": split, "units": frame.n, "best_scripted": best,
        "scripted": {p: {"mean_gap": rounded(g.value), "mean_gap_ci": rounded_interval(g.interval(counts))}
                     for p, g in sorted(gaps.items(), key=lambda kv: kv[1].value)},
        "seeds": table,
        "across_seeds": {
            "mean_gap": rounded(gap_all.value),
            "mean_gap_ci": rounded_interval(gap_all.interval(counts, seed_counts)),
            "exact": rounded(exact_all.value), "exact_ci": rounded_interval(exact_all.interval(counts, seed_counts)),
            "vs_best_scripted": rounded(gap_all.value - ref.value),
            "vs_best_scripted_ci": rounded_interval(percentile_interval(diff_reps)),
            "exact_vs_best_scripted": rounded(exact_all.value - ref_exact.value),
            "exact_vs_best_scripted_ci": rounded_interval(percentile_interval(exact_diff_reps)),
            "probability_of_improvement": rounded(p_improve),
            "probability_of_improvement_ci": rounded_interval(p_ci),
            "seeds_at_or_below_best_scripted": int(np.sum(per_seed <= ref.value)),
            "spread": {"std": rounded(per_seed.std(ddof=1)) if len(seeds) > 1 else 0.0,
                       "min": rounded(per_seed.min()), "max": rounded(per_seed.max())},
        },
        "per_unit": per_unit(
            unit_ids(frame, corpus),
            {str(s): (g, e) for s, g, e in zip(seeds, per_seed_gap, per_seed_exact)},
            {p: (gaps[p], frame.exact(rs)) for p, rs in sorted(scripted.items())}, split),
    }


def unit_ids(frame: Units, corpus: Corpus) -> list[str]:
    """The corpus's id of each of `frame`'s units, in its order: a twin pair's `twin_id`, a
    singleton's task id."""
    ids = [""] * frame.n
    for task_id, i in frame.unit_of.items():
        task = corpus.task(task_id)
        ids[i] = task.twin_id or task.task_id
    return ids


def per_unit(units: list[str], seeds: dict[str, tuple[UnitSums, UnitSums]],
             scripted: dict[str, tuple[UnitSums, UnitSums]], split: str) -> dict:
    """The summary's `per_unit` (module docstring) from each seed's and each scripted policy's
    (mean gap, exact) per-unit sums. One `episodes` row holds for all only if every policy was
    graded on the same episodes: anything else (a seed's episodes file cut short) is refused."""
    named = {**{f"seed {s}": sums for s, sums in seeds.items()}, **scripted}
    first, (reference, _) = next(iter(named.items()))
    for name, (gap, _) in named.items():
        if not np.array_equal(gap.den, reference.den):
            raise ValueError(f"{name} was graded on other episodes than {first} on {split} "
                             f"({int(gap.den.sum())} against {int(reference.den.sum())}): every "
                             "seed and scripted policy of a sweep must share its episodes")

    def means(sums: UnitSums) -> list[float]:
        return [rounded(x) for x in sums.num / sums.den]

    return {"units": units, "episodes": [int(x) for x in reference.den],
            "mean_gap": {s: means(gap) for s, (gap, _) in seeds.items()},
            "exact": {s: means(exact) for s, (_, exact) in seeds.items()},
            "scripted": {p: {"mean_gap": means(gap), "exact": means(exact)}
                         for p, (gap, exact) in scripted.items()}}


def dumps(summary: dict) -> str:
    """The summary as JSON, indented, with every list of plain values on one line: the
    per-unit arrays (hundreds of units) stay one line each instead of one line a number."""
    return re.sub(r"\[\n\s+([^\[\]{}]*?)\n\s+\]",
                  lambda m: "[" + re.sub(r",\n\s+", ", ", m[1]) + "]",
                  json.dumps(summary, indent=2)) + "\n"


def run(out: Path, runs: dict[int, SeedRun], probe: str, algorithm: str = "PPO",
        replicates: int = REPLICATES) -> dict:
    """Aggregate the seeds' `runs` of `algorithm` (its SB3 class name) into
    `out/summary.json`, `report.md`, `seeds.png`."""
    summary = {"probe": probe, "algorithm": algorithm, "seeds": sorted(runs),
               "bootstrap": {"replicates": replicates, "confidence": 0.95,
                             "unit_seed": BOOTSTRAP_SEED, "seed_seed": SEED_BOOTSTRAP_SEED,
                             "method": "percentile; per seed: units resampled; across seeds: "
                                       "two-way (units x training seeds, pigeonhole)"},
               "training": {}, "splits": {}}
    for seed, seed_run in sorted(runs.items()):
        training = seed_run.training
        summary["training"][str(seed)] = {
            "best_timesteps": training["best_timesteps"],
            "validation_mean_gap": rounded(training["validation_mean_gap"]),
            "timesteps": training["timesteps"], "train_seconds": training["train_seconds"],
            "resumed_from": training["resumed_from"],
            "machines": training.get("machines", [])}
    summary["machines"] = sorted({describe(m) for t in summary["training"].values()
                                  for m in t["machines"]})
    loaded = {split: load_split(runs, split) for split in SPLITS}
    best = baseline(loaded["public"][0], "public", replicates)
    summary["best_scripted_chosen_on"] = "public"
    for split in SPLITS:
        scripted, learned = loaded[split]
        summary["splits"][split] = summarize_split(scripted, learned, split, best, replicates)
    (out / SUMMARY).write_text(dumps(summary))
    (out / "report.md").write_text(report_markdown(summary, out.name))
    figure(summary, out / "seeds.png")
    print(seeds_table(summary["splits"]["regenerated"]), flush=True)
    return summary


def seeds_table(split: dict) -> str:
    best = split["best_scripted"]
    lines = [f"| seed | mean gap ($) | 95% CI | exact | vs {best} ($) | 95% CI |",
             "|---:|---:|---|---:|---:|---|"]
    for row in split["seeds"]:
        lines.append(f"| {row['seed']} | {row['mean_gap']:.2f} | {interval(row['mean_gap_ci'], number)} "
                     f"| {100 * row['exact']:.1f}% | {row['vs_best_scripted']:+.2f} | "
                     f"{interval(row['vs_best_scripted_ci'], number)} |")
    a = split["across_seeds"]
    lines.append(f"| **all** | **{a['mean_gap']:.2f}** | {interval(a['mean_gap_ci'], number)} | "
                 f"{100 * a['exact']:.1f}% | **{a['vs_best_scripted']:+.2f}** | "
                 f"{interval(a['vs_best_scripted_ci'], number)} |")
    return "\n".join(lines)


def report_markdown(summary: dict, name: str) -> str:
    algorithm = summary.get("algorithm", "PPO")
    lines = [f"# {algorithm} across training seeds: {name}", "",
             f"Probe arm `{summary['probe']}`, seeds {summary['seeds']}. Money in dollars; 95 % "
             "intervals: per seed, units resampled; across seeds (`all`), units and training "
             "seeds resampled independently (two-way bootstrap). The scripted policy compared "
             "with is the best unprivileged one on `public` (the split trained on).", "",
             "Trained on: " + ("; ".join(summary.get("machines") or []) or "not recorded")
             + ".", "",
             "| seed | best model at (steps) | validation gap ($) | trained steps | train s | "
             "resumed from |", "|---:|---:|---:|---:|---:|---:|"]
    for seed, t in summary["training"].items():
        lines.append(f"| {seed} | {t['best_timesteps']:,} | {t['validation_mean_gap']:.2f} | "
                     f"{t['timesteps']:,} | {t['train_seconds']:.0f} | "
                     f"{t['resumed_from'] if t['resumed_from'] is not None else '-'} |")
    for split_name, split in summary["splits"].items():
        a = split["across_seeds"]
        lines += ["", f"## {split_name} ({split['units']} units)", "", seeds_table(split), "",
                  f"- Probability of improvement over `{split['best_scripted']}` (share of "
                  f"seeds with a lower mean gap): {a['probability_of_improvement']:.2f} "
                  f"{interval(a['probability_of_improvement_ci'], number)}; "
                  f"{a['seeds_at_or_below_best_scripted']} of {len(split['seeds'])} seeds at or "
                  "below it.",
                  f"- Spread between seeds: sd ${a['spread']['std']:.2f}, range "
                  f"${a['spread']['min']:.2f} to ${a['spread']['max']:.2f}.",
                  f"- Exact rate across seeds {100 * a['exact']:.1f}% "
                  f"[{100 * a['exact_ci'][0]:.1f}, {100 * a['exact_ci'][1]:.1f}], "
                  f"{100 * a['exact_vs_best_scripted']:+.1f} points against "
                  f"`{split['best_scripted']}`.", "",
                  "| scripted policy | mean gap ($) | 95% CI |", "|---|---:|---|"]
        for policy, s in split["scripted"].items():
            lines.append(f"| {policy} | {s['mean_gap']:.2f} | {interval(s['mean_gap_ci'], number)} |")
    return "\n".join(lines) + "\n"


def figure(summary: dict, path: Path) -> None:
    """Each seed's mean gap (with its interval) per split; the arm's scripted policies as lines."""
    algorithm = summary.get("algorithm", "PPO")
    splits = summary["splits"]
    fig, axes = subplots(1, len(splits), figsize=(6.2 * len(splits) + 2, 4.2),
                             squeeze=False)
    names = sorted({p for split in splits.values() for p in split["scripted"]})
    colours = {p: f"C{i + 1}" for i, p in enumerate(names)}
    for ax, (name, split) in zip(axes[0], splits.items()):
        seeds = [row["seed"] for row in split["seeds"]]
        x = np.arange(len(seeds))
        means = np.array([row["mean_gap"] for row in split["seeds"]])
        cis = np.array([row["mean_gap_ci"] for row in split["seeds"]])
        ax.errorbar(x, means, yerr=[means - cis[:, 0], cis[:, 1] - means], fmt="o", color="C0",
                    capsize=3, label=f"{algorithm}, each seed")
        a = split["across_seeds"]
        ax.axhspan(*a["mean_gap_ci"], color="C0", alpha=0.12,
                   label=f"{algorithm}, all seeds (two-way CI)")
        top = cis[:, 1].max()
        shown = [(p, s) for p, s in split["scripted"].items()
                 if is_unprivileged_scripted(p) and s["mean_gap"] <= 2 * top]
        for policy, s in shown:  # one colour per policy in both panels
            ax.axhline(s["mean_gap"], color=colours[policy], linestyle="--", linewidth=1,
                       label=policy)
        ax.set_xticks(x, [str(s) for s in seeds])
        ax.set_xlabel("training seed")
        ax.set_ylabel("mean gap ($)")
        ax.set_title(f"{name}, probe arm {summary['probe']}")
        ax.set_ylim(bottom=0)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    save_figure(fig, path)
