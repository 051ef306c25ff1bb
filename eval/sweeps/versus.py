"""`python -m eval versus A B [--out DIR]`: two learned policies of one probe arm, each trained
from several seeds, compared on the same graded episodes. Does A lose less than B?

A and B are sweep folders (`python -m train sweep --out`, with their seeds' graded episodes:
`seed_<k>/eval_<split>/`), say RecurrentPPO's and PPO's on one arm: "does memory help" is
`versus RECURRENT FEED_FORWARD`. They must have been graded in the same world (probe arm,
split, episode seeds, faults, costs: the scripted policies' rows, graded next to every seed,
must be equal, those both graded: an offline baseline's seeds are graded beside its dataset's
`env:` rules too), else the comparison is refused, naming what differs, and nothing is written.

Per split (`regenerated`, never trained on, then `public`):

- each sweep's mean gap across its seeds, with its two-way interval (units and training seeds
  resampled, as the sweep's own aggregate: `eval/sweeps/aggregate.py`);
- the difference A - B with its two-way interval: every replicate resamples the units once for
  both (the comparison is paired: the same episodes) and the training seeds of A and of B
  independently (they are different trainings), each from a generator of its own;
- the probability that A does better (the share of (A seed, B seed) pairs where A's mean gap is
  lower; a tie counts half), with its interval from the same replicates;
- the answer: "A lower" or "B lower" where the difference's interval excludes zero, else "no
  difference shown".

Money in dollars; 95 % percentile intervals (`eval/stats/bootstrap.py`). With `--out` it writes
`versus.json` and `report.md` there (a folder holding anything else is refused).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from finality_gym import load_corpus

import eval.sweeps.baselines as baselines
from eval.reports.format import interval, number
from eval.stats.bootstrap import (
    REPLICATES,
    SeedUnitSums,
    percentile_interval,
    seed_resample_counts,
    win_share,
)
from eval.stats.summary import BOOTSTRAP_SEED, Units, rounded, rounded_interval
from eval.sweeps.aggregate import SEED_BOOTSTRAP_SEED, SPLITS, SeedRun, load_split

FILES = ("versus.json", "report.md")


def load(folder: Path) -> tuple[dict, dict[int, SeedRun]]:
    """A sweep's summary (read as the baselines table reads it) and its seeds' graded folders."""
    summary = baselines.load(folder)
    runs = {int(s): SeedRun({split: folder / f"seed_{s}" / f"eval_{split}" for split in SPLITS},
                            {}) for s in summary["seeds"]}
    return summary, runs


def _manifest(run: SeedRun, split: str) -> dict:
    manifest = json.loads((run.graded[split] / "run.json").read_text())
    manifest.pop("inputs", None)
    return manifest


def _same_world(a: tuple[dict, dict], b: tuple[dict, dict], names: tuple[str, str]) -> None:
    (sa, ra), (sb, rb) = a, b
    if sa["probe"] != sb["probe"]:
        raise ValueError(f"{names[0]} was trained on the probe arm {sa['probe']!r} and "
                         f"{names[1]} on {sb['probe']!r}: compare sweeps of one arm")
    for split in SPLITS:
        ma, mb = _manifest(next(iter(ra.values())), split), _manifest(next(iter(rb.values())),
                                                                      split)
        differ = sorted(k for k in ma.keys() | mb.keys() if ma.get(k) != mb.get(k))
        if differ:
            raise ValueError(f"{names[0]} and {names[1]} were graded under other configurations "
                             f"on {split} (they differ in {', '.join(differ)})")


def compare_split(scripted: tuple[dict, dict], learned: tuple[dict, dict], split: str,
                  replicates: int = REPLICATES) -> dict:
    """One split's comparison of the seeds in `learned` (A's, B's), graded next to the
    scripted rows `scripted` (A's, B's: equal for every policy both graded, or the worlds
    differ)."""
    common = scripted[0].keys() & scripted[1].keys()
    if not common or any(scripted[0][p] != scripted[1][p] for p in common):
        raise ValueError(f"the scripted policies' rows on {split} differ between the two sweeps: "
                         "they were not graded in the same world")
    keys = sorted((r["task_id"], r["seed"]) for r in next(iter(scripted[0].values())))
    for rows in (*learned[0].values(), *learned[1].values()):
        if sorted((r["task_id"], r["seed"]) for r in rows) != keys:
            raise ValueError(f"a learned seed's episodes on {split} are not the scripted "
                             "policies' episodes")
    every = [r for p, rs in scripted[0].items() if p in common for r in rs]
    frame = Units(load_corpus(split), every, replicates, BOOTSTRAP_SEED)
    counts = frame.counts
    sums = [SeedUnitSums.of([frame.gap(learned[i][s]) for s in sorted(learned[i])])
            for i in (0, 1)]
    # A's seeds from the sweeps' own seed generator, B's from the next one: independent draws
    seed_counts = [seed_resample_counts(len(learned[i]), replicates, SEED_BOOTSTRAP_SEED + i)
                   for i in (0, 1)]
    reps = [sums[i].replicates(counts, seed_counts[i]) for i in (0, 1)]
    difference = sums[0].value - sums[1].value
    diff_ci = percentile_interval(reps[0] - reps[1])

    def share(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # (..., A seeds, B seeds)
        return win_share(a[..., :, None], b[..., None, :])

    point = float(share(sums[0].per_seed, sums[1].per_seed).mean())
    wins = share(sums[0].per_seed_replicates(counts), sums[1].per_seed_replicates(counts))
    weights = seed_counts[0][:, :, None] * seed_counts[1][:, None, :]
    p_reps = (weights * wins).sum(axis=(1, 2)) / weights.sum(axis=(1, 2))
    answer = ("A lower" if diff_ci[1] < 0 else "B lower" if diff_ci[0] > 0
              else "no difference shown")
    return {
        "split": split, "units": frame.n, "episodes": len(keys),
        "a": {"mean_gap": rounded(sums[0].value),
              "mean_gap_ci": rounded_interval(sums[0].interval(counts, seed_counts[0])),
              "per_seed": {str(s): rounded(v) for s, v in zip(sorted(learned[0]), sums[0].per_seed)}},
        "b": {"mean_gap": rounded(sums[1].value),
              "mean_gap_ci": rounded_interval(sums[1].interval(counts, seed_counts[1])),
              "per_seed": {str(s): rounded(v) for s, v in zip(sorted(learned[1]), sums[1].per_seed)}},
        "a_minus_b": rounded(difference), "a_minus_b_ci": rounded_interval(diff_ci),
        "probability_a_lower": rounded(point),
        "probability_a_lower_ci": rounded_interval(percentile_interval(p_reps)),
        "answer": answer,
    }


def versus(a: Path, b: Path, replicates: int = REPLICATES) -> dict:
    """The comparison of the sweeps in folders `a` and `b` (see the module's docstring)."""
    loaded = (load(a), load(b))
    names = (str(a), str(b))
    _same_world(*loaded, names=names)
    out = {"a": {"sweep": names[0], "algorithm": loaded[0][0].get("algorithm", "PPO"),
                 "seeds": sorted(loaded[0][1])},
           "b": {"sweep": names[1], "algorithm": loaded[1][0].get("algorithm", "PPO"),
                 "seeds": sorted(loaded[1][1])},
           "probe": loaded[0][0]["probe"],
           "bootstrap": {"replicates": replicates, "confidence": 0.95,
                         "unit_seed": BOOTSTRAP_SEED,
                         "seed_seeds": [SEED_BOOTSTRAP_SEED, SEED_BOOTSTRAP_SEED + 1],
                         "method": "percentile; two-way: units resampled once for both, each "
                                   "sweep's training seeds independently"},
           "machines": sorted({m for s, _ in loaded for m in s.get("machines", [])}),
           "splits": {}}
    for split in SPLITS:
        (sa, la), (sb, lb) = load_split(loaded[0][1], split), load_split(loaded[1][1], split)
        out["splits"][split] = compare_split((sa, sb), (la, lb), split, replicates)
    return out


def report_markdown(result: dict) -> str:
    a, b = result["a"], result["b"]
    lines = [f"# {a['algorithm']} versus {b['algorithm']}: probe arm "
             f"`{result['probe']}`", "",
             f"A: `{a['sweep']}` ({a['algorithm']}, seeds {a['seeds']}); B: `{b['sweep']}` "
             f"({b['algorithm']}, seeds {b['seeds']}). Made by `python -m eval versus "
             f"{a['sweep']} {b['sweep']}`. Money in dollars, 95 % intervals: two-way (units "
             "resampled once for both, each sweep's training seeds independently). Trained on: "
             + ("; ".join(result["machines"]) or "not recorded") + ".", "",
             "| split | A mean gap | B mean gap | A - B | P(A lower) | answer |",
             "|---|---|---|---|---|---|"]
    for split, s in result["splits"].items():
        lines.append(f"| {split} ({s['units']} units) | {s['a']['mean_gap']:.2f} "
                     f"{interval(s['a']['mean_gap_ci'], number)} | {s['b']['mean_gap']:.2f} "
                     f"{interval(s['b']['mean_gap_ci'], number)} | **{s['a_minus_b']:+.2f}** "
                     f"{interval(s['a_minus_b_ci'], number)} | {s['probability_a_lower']:.2f} "
                     f"{interval(s['probability_a_lower_ci'], number)} | {s['answer']} |")
    lines += ["", "Each seed's mean gap:", "", "| split | " + " | ".join(
        [f"A seed {k}" for k in a["seeds"]] + [f"B seed {k}" for k in b["seeds"]]) + " |",
        "|---|" + "---:|" * (len(a["seeds"]) + len(b["seeds"]))]
    for split, s in result["splits"].items():
        lines.append(f"| {split} | " + " | ".join(
            [f"{v:.2f}" for v in s["a"]["per_seed"].values()]
            + [f"{v:.2f}" for v in s["b"]["per_seed"].values()]) + " |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="a sweep folder (python -m train sweep --out)")
    parser.add_argument("b", type=Path, help="another sweep folder of the same probe arm")
    parser.add_argument("--out", type=Path, default=None,
                        help="write versus.json and report.md into this folder")


def main(args: argparse.Namespace) -> int:
    out = args.out
    if out is not None and out.exists():
        if not out.is_dir():
            raise ValueError(f"--out {out} is a file, not a folder")
        other = sorted(p.name for p in out.iterdir() if p.name not in FILES)
        if other:
            raise ValueError(f"--out {out} holds {', '.join(other)}: not an earlier comparison")
    result = versus(args.a, args.b)
    report = report_markdown(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "versus.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "report.md").write_text(report)
    print(report, end="")
    return 0
