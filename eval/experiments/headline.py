"""The headline evaluation (docs/world.md section 11): the nine policies on a split, tables and figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agents import split_specs
from agents.registry import HEADLINE
from agents.spec import FORMS
from finality_gym import PROBE_ARMS, SPLITS
from finality_gym.corpus import PRIVATE

from eval.grading.grader import RunConfig, grade, without_calls
from eval.grading.master_seed import master_seed, seed_options
from eval.grading.options import run_experiment, run_options
from eval.grading.runfolder import ROWS, SUMMARY, key, read_rows
from eval.reports.figures import figure_exact_vs_pass, figure_paired
from eval.reports.report import development_note, headline_table, report_markdown
from eval.stats.summary import summarize


def recorded(config: RunConfig, out: Path, graded: list[dict]) -> tuple[list[dict], list[str]]:
    """Every policy graded into the folder (earlier runs' too, same manifest), so that the
    summary and the report always cover the whole folder; a policy with only part of the
    episodes (an interrupted earlier run) is left out, and said so. `graded` are this run's
    rows, as `grade` returned them: where the folder holds nothing else, they are the folder,
    in its order, and the file is not read again (half the main process's time, before)."""
    if (out / ROWS).read_bytes().count(b"\n") == len(graded):
        rank = {job: i for i, job in enumerate(config.jobs())}
        return sorted(graded, key=lambda row: rank[key(row)]), list(config.policies)
    jobs = set(config.cases())
    grouped: dict[str, list[dict]] = {}
    for row in map(without_calls, read_rows(out / ROWS)):  # as `grade` gives them
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
    corpus = config.corpus
    if echo:
        print(f"split {split}: fingerprint {corpus.fingerprint}, "
              f"{len(corpus.tasks) if tasks is None else len(tasks)} tasks, "
              f"probe arm {probe}, {len(config.jobs())} episodes", flush=True)
    graded = grade(config, out, workers=workers, progress=progress, desc="headline",
                   backend=backend)
    rows, policies = recorded(config, out, graded)
    summary = summarize(rows, config.corpus, policies, list(config.seeds))
    summary["probe"] = probe
    pinned = json.loads((out / "run.json").read_text())
    if "sandbox" in pinned:  # outside policies were graded: in which sandbox
        summary["sandbox"] = pinned["sandbox"]
    if pinned.get("trust_pickles"):  # models were loaded by unpickling them
        summary["trust_pickles"] = True
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "headline", seeds=5)
    parser.add_argument("--split", choices=[*SPLITS, PRIVATE], default="public",
                        help="private: generated from --master-seed (for leaderboard operators)")
    seed_options(parser)
    parser.add_argument("--sandbox", choices=("on", "off"), default="on",
                        help="run outside policies in the operating-system sandbox (default on; "
                             "off is refused for --split private)")
    parser.add_argument("--policies", type=split_specs, action="extend", default=None,
                        help="policy specs, comma-separated or repeated (default: the nine), "
                             f"of the forms {FORMS}: a saved SB3 model is read as data (no "
                             "pickle in it runs), an ONNX graph run by onnxruntime, your own "
                             "Policy graded in its own process, in the sandbox")
    parser.add_argument("--trust-pickles", action="store_true",
                        help="load ppo:/sb3: models by unpickling them, as stable-baselines3 does "
                             "(code in the file runs in the grader: trusted files only; recorded "
                             "in run.json; refused for --split private); only for a model whose "
                             "fields exist only as pickles")
    parser.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    parser.add_argument("--tasks", type=lambda text: tuple(t for t in text.split(",") if t),
                        default=None, help="only these task ids, comma-separated (a quick look "
                                           "or a test; the headline itself is the whole split)")


def main(args: argparse.Namespace) -> int:
    return run_experiment(run, args, split=args.split, seeds=args.seeds,
                          policies=tuple(args.policies or HEADLINE), probe=args.probe,
                          master_seed=master_seed(args), sandbox=args.sandbox == "on",
                          tasks=args.tasks, trust_pickles=args.trust_pickles)
