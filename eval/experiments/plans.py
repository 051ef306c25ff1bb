"""Reference check (docs/world.md section 11): can any simple open-loop plan beat the reference?

On 40 tasks sampled across the archetypes (seeded, stratified: four per archetype, the remaining
four from archetypes drawn at random), every plan "wait w1, optionally `retry_capture` under one
of the two keys, wait w2, one terminal action" with w1, w2 in {0, 15, 30, 60, 120, 180, 240, 360,
480}: 9 x 3 x 9 x 5 = 1,215 plans a task, each an `OpenLoopPlan` run through the shared grader.
A plan reads nothing, so its position does not depend on the fault seed; seed 0 is used.
"""

from __future__ import annotations

import argparse
import random
from itertools import product
from pathlib import Path

from agents.scripted import OpenLoopPlan
from finality_gym import ARCHETYPES, load_corpus

from eval.grading.grader import RunConfig, grade
from eval.grading.options import run_experiment, run_options
from eval.reports.format import table
from eval.reports.report import save

WAITS = (0, 15, 30, 60, 120, 180, 240, 360, 480)
SAMPLE_SEED = 11
N_TASKS = 40


def plans() -> list[str]:
    return [f"plan:{w1},{retry},{w2},{end}" for w1, retry, w2, end in
            product(WAITS, OpenLoopPlan.RETRIES, WAITS, OpenLoopPlan.TERMINALS)]


def sample_tasks(split: str = "public", n: int = N_TASKS, seed: int = SAMPLE_SEED) -> list[str]:
    rng = random.Random(seed)
    corpus = load_corpus(split)
    per, extra = divmod(n, len(ARCHETYPES))
    counts = dict.fromkeys(ARCHETYPES, per)
    for archetype in rng.sample(ARCHETYPES, extra):
        counts[archetype] += 1
    chosen = []
    for archetype in ARCHETYPES:
        pool = [t.task_id for t in corpus.tasks if t.archetype == archetype]
        chosen += rng.sample(pool, counts[archetype])
    return chosen


def explain(task, best: dict) -> str:
    """Why a plan beat the reference, from the task and the two outcomes."""
    if task.archetype == "late_chargeback" and not best["goods_left"]:
        return (f"The card settles, so the reference ships at t=120; the customer's chargeback at "
                f"t={task.chargeback_at} then claws the payment back with the goods gone "
                f"(position {best['reference'] / 100:.2f}). The plan never ships ({best['policy']}),"
                f" so the chargeback takes back only money it would have returned anyway "
                f"(position {best['position'] / 100:.2f}). The reference is told the card's fate, "
                "not the dispute (docs/world.md section 8): this is the one beat the rules anticipate.")
    return (f"{best['policy']} ends with cash {best['cash'] / 100:.2f}, goods "
            f"{'shipped' if best['goods_left'] else 'kept'}, position {best['position'] / 100:.2f} "
            f"against the reference's {best['reference'] / 100:.2f}: a case the rules do not "
            "anticipate; look at this task.")


def run(out: Path, workers: int = 2, progress: bool = True, backend: str = "local") -> dict:
    tasks = sample_tasks()
    rows = grade(RunConfig(tuple(plans()), tasks=tuple(tasks), seeds=(0,)), out / "episodes",
                 workers=workers, progress=progress, desc="plans", backend=backend)
    corpus = load_corpus("public")
    order = {spec: i for i, spec in enumerate(plans())}  # ties go to the simplest plan
    best: dict[str, dict] = {}
    for row in rows:
        current = best.get(row["task_id"])
        if current is None or (row["gap"], order[row["policy"]]) < (current["gap"],
                                                                    order[current["policy"]]):
            best[row["task_id"]] = row
    beats = []
    for task_id in tasks:
        row = best[task_id]
        if row["gap"] < 0:
            task = corpus.task(task_id)
            beats.append({"task_id": task_id, "archetype": task.archetype, "plan": row["policy"],
                          "margin": -row["gap"], "reference": row["reference"],
                          "position": row["position"], "explanation": explain(task, row)})
    result = {"tasks": tasks, "plans_per_task": len(plans()), "episodes": len(rows),
              "tasks_where_a_plan_beats_the_reference": len(beats), "beats": beats,
              "best_gap_per_task": {t: best[t]["gap"] for t in tasks}}
    save(out, "plans", result, _report(result))
    print(f"plans: {len(beats)} of {len(tasks)} tasks have a plan that beats the reference")
    return result


def _report(result: dict) -> str:
    parts = ["# Reference check", "",
             f"{len(result['tasks'])} tasks (public, stratified by archetype, seed {SAMPLE_SEED})"
             f" x {result['plans_per_task']} open-loop plans = {result['episodes']} episodes. "
             f"A plan beats the reference on {result['tasks_where_a_plan_beats_the_reference']}"
             " of them; on every other task no plan does better than the reference.", ""]
    if result["beats"]:
        parts += [table(["task", "best plan", "margin $", "reference $", "plan $"],
                        [[b["task_id"], b["plan"], f"{b['margin'] / 100:.2f}",
                          f"{b['reference'] / 100:.2f}", f"{b['position'] / 100:.2f}"]
                         for b in result["beats"]]), "", "## Why", ""]
        parts += [f"- `{b['task_id']}`: {b['explanation']}" for b in result["beats"]]
    return "\n".join(parts) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "plans")


def main(args: argparse.Namespace) -> int:
    return run_experiment(run, args)
