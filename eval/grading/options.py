"""The options every grading command shares (`--out`, `--workers`, `--no-progress`,
`--backend`, `--seeds`), so that `headline`, `ablation`, `tuning`, `costs`, `plans`, `all` and
`model` take them under one spelling, with one help text and one default each."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eval.grading.grader import BACKENDS


def run_options(parser: argparse.ArgumentParser, name: str, seeds: int | None = None) -> None:
    """`--out` (default `results/NAME`), `--workers`, `--no-progress`, `--backend`, and
    `--seeds N` (episode seeds 0..N-1) when the command takes it, defaulting to `seeds`."""
    parser.add_argument("--out", type=Path, default=Path("results") / name,
                        help="results folder (re-running into it resumes)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="where the grader's chunks run: local processes, or Ray tasks "
                             "(joins RAY_ADDRESS, else starts Ray here; the ray extra)")
    if seeds is not None:
        parser.add_argument("--seeds", type=int, default=seeds, help="episode seeds 0..N-1")


def run_experiment(run, args: argparse.Namespace, **options) -> int:
    """`run(out, workers, progress, backend=..., **options)`, an experiment's own `run`, with the
    shared options of `args`; then `finished`."""
    started = time.perf_counter()
    run(args.out, args.workers, not args.no_progress, backend=args.backend, **options)
    return finished(args, started)


def finished(args: argparse.Namespace, started: float) -> int:
    """The line a grading command ends with (where its results are), and its exit status."""
    print(f"{args.command}: results in {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0
