"""Fault ablation (docs/world.md section 11): which fault family does the damage, to whom.

Arms: `baseline` (the default profile), `only_X` and `minus_X` for each of the six families, and
`no_late_chargeback` (the default profile on the corpus without that archetype); each runs the nine
policies on `public` under seeds 0..4. Then the 2 x 2 of loss x delay for `sop`, `react` and
`reflection`, at the default intensity, with the interaction `both - loss - delay + none` and its
bootstrap interval (the four arms share the resampled units).

Disposition changes compare each `minus_X` arm with the baseline episode by episode: because
fault draws are a pure function of each delivery's identity, removing a family leaves every other
family's draws as they were, so a changed disposition is that family's doing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import operator
import sys
from pathlib import Path

import numpy as np

from agents.registry import HEADLINE
from finality_gym import FAMILIES, FaultProfile, load_corpus
from finality_gym.replicas import world_firings

from eval.grading.grader import RunConfig, grade
from eval.grading.options import run_experiment, run_options
from eval.reports.format import table
from eval.reports.report import save
from eval.stats.bootstrap import percentile_interval
from eval.stats.summary import Units, by_policy

TWO_BY_TWO_POLICIES = ("sop", "react", "reflection")
SEEDS = (0, 1, 2, 3, 4)


def arms(seeds: tuple[int, ...] = SEEDS) -> dict[str, RunConfig]:
    """Every arm of the ablation, by name; the names say what the profile is."""
    full = FaultProfile()
    out = {"baseline": RunConfig(HEADLINE, faults=full, seeds=seeds)}
    for family in FAMILIES:
        out[f"only_{family}"] = RunConfig(HEADLINE, faults=FaultProfile.only(family), seeds=seeds)
    for family in FAMILIES:
        out[f"minus_{family}"] = RunConfig(HEADLINE, faults=full.without(family), seeds=seeds)
    tasks = tuple(t.task_id for t in load_corpus("public").tasks
                  if t.archetype != "late_chargeback")
    out["no_late_chargeback"] = RunConfig(HEADLINE, faults=full, seeds=seeds, tasks=tasks)
    out["none"] = RunConfig(TWO_BY_TWO_POLICIES, faults=FaultProfile.none(), seeds=seeds)
    out["loss_and_delay"] = RunConfig(TWO_BY_TWO_POLICIES,
                                      faults=FaultProfile(0.3, frozenset({"loss", "delay"})),
                                      seeds=seeds)
    return out


def interaction(both: np.ndarray, loss: np.ndarray, delay: np.ndarray,
                none: np.ndarray) -> np.ndarray:
    """The loss x delay interaction: how much more (or less) the two together cost than apart."""
    return both - loss - delay + none


def _key(row: dict) -> tuple:
    return row["policy"], row["task_id"], row["seed"]


def run(out: Path, workers: int = 2, progress: bool = True,
        baseline_dir: Path | None = None, seeds: tuple[int, ...] = SEEDS,
        backend: str = "local") -> dict:
    """`baseline_dir` may name a headline run's folder (the same configuration) to reuse."""
    results: dict[str, list[dict]] = {}
    configs = arms(seeds)
    for name, config in configs.items():
        folder = baseline_dir if (name == "baseline" and baseline_dir) else out / "arms" / name
        results[name] = grade(config, folder, workers=workers, progress=progress,
                              desc=f"ablation {name}", backend=backend)
    units = Units(load_corpus("public"), results["baseline"])
    grouped = {name: by_policy(rows) for name, rows in results.items()}
    mean_gap: dict[str, dict] = {}
    firings: dict[str, dict] = {}
    for name, rows in results.items():
        arm_units = units if name != "no_late_chargeback" else Units(load_corpus("public"), rows)
        mean_gap[name] = {}
        for policy, prows in grouped[name].items():
            sums = arm_units.gap(prows)
            lo, hi = sums.interval(arm_units.counts)
            mean_gap[name][policy] = {"mean_gap": round(sums.value, 4),
                                      "mean_gap_ci": [round(lo, 2), round(hi, 2)]}
        firings[name] = _mean_firings(rows)
    world = _world_firings_of(configs, workers)
    base = {_key(r): r["disposition"] for r in results["baseline"]}
    changes = {family: {policy: sum(base[_key(r)] != r["disposition"] for r in prows)
                        for policy, prows in grouped[f"minus_{family}"].items()}
               for family in FAMILIES}
    two_by_two = {}
    cells = {"none": "none", "loss": "only_loss", "delay": "only_delay", "both": "loss_and_delay"}
    for policy in TWO_BY_TWO_POLICIES:
        sums = {cell: units.gap(grouped[arm][policy]) for cell, arm in cells.items()}
        reps = {cell: s.replicates(units.counts) for cell, s in sums.items()}
        value = interaction(*(sums[c].value for c in ("both", "loss", "delay", "none")))
        lo, hi = percentile_interval(interaction(reps["both"], reps["loss"], reps["delay"],
                                                 reps["none"]))
        two_by_two[policy] = {**{c: round(s.value, 4) for c, s in sums.items()},
                              "interaction": round(float(value), 4),
                              "interaction_ci": [round(lo, 2), round(hi, 2)]}
    result = {"seeds": list(seeds),
              "arms": {name: {"faults": c.faults.to_dict(), "tasks": len(c.jobs()) // (
                  len(c.policies) * len(c.seeds))} for name, c in configs.items()},
        "mean_gap": mean_gap, "firings_per_episode": firings, "world_firings_per_episode": world,
        "disposition_changes_when_removed": changes, "loss_x_delay": two_by_two}
    save(out, "ablation", result, _report(result))
    _figure(result, out / "mean_gap_by_arm.png")
    print(_two_by_two_table(result))
    return result


def _mean_firings(rows: list[dict]) -> dict[str, float]:
    """Mean observed firings per episode by family: exact integer sums, then one division (what
    `np.mean` of each family's counts gives), from one pass over the rows."""
    counts = operator.itemgetter(*FAMILIES)
    totals = np.array([counts(r["fault_firings"]) for r in rows], dtype=np.int64).sum(axis=0)
    return {f: round(int(total) / len(rows), 4) for f, total in zip(FAMILIES, totals)}


def _world_firings_of(configs: dict[str, RunConfig], workers: int) -> dict[str, dict]:
    """`_world_firings` of every arm, the arms shared among `workers` processes: the grading's
    workers have ended by now, and one process alone would leave the other cores idle."""
    if workers == 1:
        return {name: _world_firings(config) for name, config in configs.items()}
    with multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn"
                                     ).Pool(min(workers, len(configs))) as pool:
        return dict(zip(configs, pool.map(_world_firings, configs.values())))


def _world_firings(config) -> dict[str, float]:
    """Mean world firings per (task, seed) of an arm: every delivery to the horizon."""
    corpus = config.corpus
    pairs = {(t, s) for _, t, s in config.jobs()}
    totals = dict.fromkeys(FAMILIES, 0)
    for task_id, seed in pairs:
        for family, n in world_firings(corpus.task(task_id), seed, config.faults).items():
            totals[family] += n
    return {f: round(totals[f] / len(pairs), 4) for f in FAMILIES}


def _two_by_two_table(result: dict) -> str:
    return table(["policy", "none $", "loss $", "delay $", "both $", "interaction $ [95% CI]"],
                 [[p, *(f"{v[c]:.2f}" for c in ("none", "loss", "delay", "both")),
                   f"{v['interaction']:.2f} [{v['interaction_ci'][0]:.2f}, "
                   f"{v['interaction_ci'][1]:.2f}]"] for p, v in result["loss_x_delay"].items()])


def _report(result: dict) -> str:
    arm_names = list(result["mean_gap"])
    main_arms = [a for a in arm_names if a not in ("none", "loss_and_delay")]
    parts = ["# Fault ablation", "",
             f"Public split, seeds {result['seeds']}, intensity 0.30. Mean gap in dollars with 95 % bootstrap "
             "intervals over independent units. Two firing counts: the world's (every delivery "
             "of the canonical log to every system, to the horizon, with no agent acting: a "
             "property of the world and the profile, the paper's figure) and the observed "
             "(what took effect on what each policy read, averaged over the policies' episodes; "
             "see `finality_gym/replicas.py`).", "",
             "## Mean gap per policy per arm", ""]
    policies = list(result["mean_gap"]["baseline"])
    parts.append(table(["arm"] + policies, [
        [arm] + [f"{result['mean_gap'][arm][p]['mean_gap']:.2f} "
                 f"[{result['mean_gap'][arm][p]['mean_gap_ci'][0]:.0f}, "
                 f"{result['mean_gap'][arm][p]['mean_gap_ci'][1]:.0f}]"
                 for p in policies] for arm in main_arms]))
    parts += ["", "## World firings per episode per arm (every delivery to the horizon)", "",
              table(["arm"] + list(FAMILIES),
                    [[arm] + [f"{result['world_firings_per_episode'][arm][f]:.3f}"
                              for f in FAMILIES] for arm in arm_names]),
              "", "## Observed firings per episode per arm (what the policies read)", "",
              table(["arm"] + list(FAMILIES),
                    [[arm] + [f"{result['firings_per_episode'][arm][f]:.3f}" for f in FAMILIES]
                     for arm in arm_names]),
              "", "## Episodes whose disposition changes when a family is removed", "",
              table(["family"] + policies,
                    [[f] + [str(result["disposition_changes_when_removed"][f].get(p, 0))
                            for p in policies] for f in FAMILIES]),
              "", "## Loss x delay", "", _two_by_two_table(result), ""]
    return "\n".join(parts)


def _figure(result: dict, path: Path) -> None:
    from eval.reports.figures import save_figure, subplots
    arms_ = [a for a in result["mean_gap"] if a not in ("none", "loss_and_delay")]
    policies = list(result["mean_gap"]["baseline"])
    grid = np.array([[result["mean_gap"][a][p]["mean_gap"] for p in policies] for a in arms_])
    fig, ax = subplots(figsize=(9, 6.5))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(policies)))
    ax.set_xticklabels(policies, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(arms_)))
    ax.set_yticklabels(arms_, fontsize=8)
    for i in range(len(arms_)):
        for j in range(len(policies)):
            ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if grid[i, j] < grid.max() * 0.6 else "black")
    fig.colorbar(image, ax=ax, label="mean gap ($)")
    ax.set_title("Mean gap per policy per fault arm (public)")
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "ablation", seeds=5)


def main(args: argparse.Namespace) -> int:
    return run_experiment(run, args, seeds=tuple(range(args.seeds)))
