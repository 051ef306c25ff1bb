"""The headline evaluation (docs/world.md section 11): the nine policies on a split, tables and figures."""

from __future__ import annotations

import json
from pathlib import Path

from finality_gym import load_corpus

from .grader import RunConfig, grade
from .runfolder import read_rows
from .report import (development_note, figure_exact_vs_pass, figure_paired, headline_table,
                     report_markdown)
from .summary import summarize

# The nine policies of docs/world.md section 9: every experiment's default line-up.
HEADLINE = ("random", "optimistic", "eager", "majority_vote", "sop", "react", "reflection",
            "finality_gate", "finality_oracle")


def recorded(config: RunConfig, out: Path) -> tuple[list[dict], list[str]]:
    """Every policy graded into the folder (earlier runs' too, same manifest), so that the
    summary and the report always cover the whole folder; a policy with only part of the
    episodes (an interrupted earlier run) is left out, and said so."""
    jobs = set(config.cases())
    grouped: dict[str, list[dict]] = {}
    for row in read_rows(out / "episodes.jsonl"):
        grouped.setdefault(row["policy"], []).append(row)
    complete = [p for p, rs in grouped.items() if {(r["task_id"], r["seed"]) for r in rs} == jobs
                and len(rs) == len(jobs)]
    for policy in grouped.keys() - set(complete):
        print(f"note: {policy} has {len(grouped[policy])} of {len(jobs)} episodes in {out}; "
              "left out of the summary (re-run with it to complete it)", flush=True)
    return [r for p in complete for r in grouped[p]], complete


def run(out: Path, workers: int = 2, progress: bool = True, split: str = "public",
        seeds: int = 5, policies: tuple[str, ...] = HEADLINE, probe: str = "full",
        master_seed: int | None = None, echo: bool = True, backend: str = "local",
        sandbox: bool = True, tasks: tuple[str, ...] | None = None,
        trust_pickles: bool = False) -> dict:
    """Grade into `out` and write the summary, report and figures; `echo` prints the table."""
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    config = RunConfig(policies=policies, split=split, seeds=tuple(range(seeds)), probe=probe,
                       master_seed=master_seed, sandbox=sandbox, tasks=tasks,
                       trust_pickles=trust_pickles)
    corpus = load_corpus(split)
    if echo:
        print(f"split {split}: fingerprint {corpus.fingerprint}, "
              f"{len(corpus.tasks) if tasks is None else len(tasks)} tasks, "
              f"probe arm {probe}, {len(config.jobs())} episodes", flush=True)
    grade(config, out, workers=workers, progress=progress, desc="headline", backend=backend)
    rows, policies = recorded(config, out)
    summary = summarize(rows, split, policies, list(config.seeds))
    summary["probe"] = probe
    pinned = json.loads((out / "run.json").read_text())
    if "sandbox" in pinned:  # outside policies were graded: in which sandbox
        summary["sandbox"] = pinned["sandbox"]
    if pinned.get("trust_pickles"):  # models were loaded by unpickling them
        summary["trust_pickles"] = True
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(summary, "Headline evaluation"))
    figure_exact_vs_pass(summary, out / "exact_vs_pass.png")
    figure_paired(summary, out / "paired_halves.png")
    if echo:
        print(headline_table(summary))
        if note := development_note(split):
            print(note)
        print(f"rankings by exact rate and by paired loss disagree in "
              f"{summary['rankings']['disagreements']} places")
    return summary
