"""`python -m eval all`: every experiment into one folder (headline, costs, ablation, tuning,
plans), each resumable in its own subfolder, with an index report linking them. The ablation and
the cost sweep reuse the headline's folder rather than grading it again."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from finality_gym import load_corpus

from eval.experiments import ablation, costs, headline, plans, tuning
from eval.grading.options import run_experiment, run_options


def run_all(out: Path, workers: int, progress: bool, backend: str) -> None:
    started = time.perf_counter()
    head = headline.run(out / "headline", workers, progress, backend=backend)
    # The two that reuse the headline's folder come next, while `grade` still holds its rows.
    cst = costs.run(out / "costs", workers, progress, headline_dir=out / "headline",
                    backend=backend)
    abl = ablation.run(out / "ablation", workers, progress, baseline_dir=out / "headline",
                       backend=backend)
    tun = tuning.run(out / "tuning", workers, progress, backend=backend)
    pln = plans.run(out / "plans", workers, progress, backend=backend)
    gate = head["policies"].get("finality_gate", {})
    lines = [
        "# finality-gym: every experiment", "",
        f"Split `public`, fingerprint `{load_corpus('public').fingerprint}`; `regenerated` "
        f"`{load_corpus('regenerated').fingerprint}`. Wall time "
        f"{time.perf_counter() - started:.0f} s.", "",
        f"- [Headline](headline/report.md): the finality gate's mean gap "
        f"${gate.get('mean_gap', float('nan')):.2f} [{gate['mean_gap_ci'][0]:.2f}, "
        f"{gate['mean_gap_ci'][1]:.2f}], exact "
        f"{100 * gate.get('exact', float('nan')):.1f}%; rankings by exact rate and by paired "
        f"loss disagree in {head['rankings']['disagreements']} places.",
        f"- [Ablation](ablation/report.md): loss x delay interaction for sop "
        f"${abl['loss_x_delay']['sop']['interaction']:.2f} "
        f"{abl['loss_x_delay']['sop']['interaction_ci']}.",
        f"- [Tuning](tuning/report.md): tuned `{tun['tuned']['policy']}` changes by "
        f"${tun['tuned']['change']:+.2f} {tun['tuned']['change_ci']} from public to regenerated;"
        f" the default by ${tun['default']['change']:+.2f} {tun['default']['change_ci']}.",
        f"- [Cost sweep](costs/report.md): same ordering as the default in "
        f"{cst['same_order_as_default']} of 45 configurations; the gate ahead of every ungated "
        f"policy in {cst['gate_ahead_of_every_ungated']} of 45.",
        f"- [Reference check](plans/report.md): a plan beats the reference on "
        f"{pln['tasks_where_a_plan_beats_the_reference']} of {len(pln['tasks'])} tasks.", ""]
    (out / "index.md").write_text("\n".join(lines))
    print(f"wrote {out}/index.md in {time.perf_counter() - started:.1f} s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "all")


def main(args: argparse.Namespace) -> int:
    return run_experiment(run_all, args)
