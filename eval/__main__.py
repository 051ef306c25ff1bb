"""`python -m eval NAME ...`: the benchmark's experiments. `python -m eval --help` lists them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agents import HEADLINE
from finality_gym import PROBE_ARMS, SPLITS, load_corpus

from .grader import RunConfig, grade
from .report import figure_exact_vs_pass, figure_paired, headline_table, report_markdown
from .summary import summarize


def _policies(text: str) -> tuple[str, ...]:
    return tuple(p for p in (s.strip() for s in text.split(",")) if p)


def _common(parser: argparse.ArgumentParser, out: str) -> None:
    parser.add_argument("--out", type=Path, default=Path(out), help="results folder (resumable)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def headline(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    config = RunConfig(policies=args.policies, split=args.split, seeds=tuple(range(args.seeds)),
                       probe=args.probe)
    corpus = load_corpus(args.split)
    print(f"split {args.split}: fingerprint {corpus.fingerprint}, {len(corpus.tasks)} tasks, "
          f"probe arm {args.probe}, {len(config.jobs())} episodes", flush=True)
    rows = grade(config, args.out, workers=args.workers, progress=not args.no_progress,
                 desc="headline")
    summary = summarize(rows, args.split, list(args.policies), list(config.seeds))
    summary["probe"] = args.probe
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "report.md").write_text(report_markdown(summary, "Headline evaluation"))
    figure_exact_vs_pass(summary, args.out / "exact_vs_pass.png")
    figure_paired(summary, args.out / "paired_halves.png")
    print(headline_table(summary))
    r = summary["rankings"]
    print(f"rankings by exact rate and by paired loss disagree in {r['disagreements']} places")
    print(f"wrote {args.out}/episodes.jsonl, summary.json, report.md, exact_vs_pass.png, "
          f"paired_halves.png in {time.perf_counter() - started:.1f} s")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("headline", help="nine policies x 321 tasks x 5 seeds, tables and figures")
    p.add_argument("--split", choices=list(SPLITS), default="public")
    p.add_argument("--seeds", type=int, default=5, help="episode seeds 0..N-1")
    p.add_argument("--policies", type=_policies, default=HEADLINE,
                   help="comma-separated policy specs (ppo:PATH loads a model: trusted files "
                        "only, it unpickles code)")
    p.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    _common(p, "results/headline")
    p.set_defaults(func=headline)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
