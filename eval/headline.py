"""The headline evaluation (SPEC section 11): the nine policies on a split, tables and figures."""

from __future__ import annotations

import json
from pathlib import Path

from agents import HEADLINE
from finality_gym import load_corpus

from .grader import RunConfig, grade
from .report import figure_exact_vs_pass, figure_paired, headline_table, report_markdown
from .summary import summarize


def run(out: Path, workers: int = 2, progress: bool = True, split: str = "public",
        seeds: int = 5, policies: tuple[str, ...] = HEADLINE, probe: str = "full") -> dict:
    config = RunConfig(policies=policies, split=split, seeds=tuple(range(seeds)), probe=probe)
    corpus = load_corpus(split)
    print(f"split {split}: fingerprint {corpus.fingerprint}, {len(corpus.tasks)} tasks, "
          f"probe arm {probe}, {len(config.jobs())} episodes", flush=True)
    rows = grade(config, out, workers=workers, progress=progress, desc="headline")
    summary = summarize(rows, split, list(policies), list(config.seeds))
    summary["probe"] = probe
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(summary, "Headline evaluation"))
    figure_exact_vs_pass(summary, out / "exact_vs_pass.png")
    figure_paired(summary, out / "paired_halves.png")
    print(headline_table(summary))
    print(f"rankings by exact rate and by paired loss disagree in "
          f"{summary['rankings']['disagreements']} places")
    return summary
