"""`python -m eval private-baselines SWEEP... --board BOARD --master-seed-file F`: the sweeps'
seeds on a leaderboard's private split, the learned claim checked where no seed trained or was
chosen; `python -m eval baselines` then shows it in the README's table.

It reads a board that `eval verify` graded (`make board` makes one on the docs' split): for a
sweep of probe arm ARM,
its entries `ppo.ARM.seed<k>` (the sweep's best models, one a training seed: every seed of the
sweep, else an error) and the scripted rules verified on ARM (`<rule>.ARM`), their private rows.
They are aggregated as the sweep's own splits are (`eval/sweeps/aggregate.py`: per seed, across
seeds with two-way intervals, per-unit arrays) against the rule the sweep chose on `public`, and
written into the sweep's `summary.json` as `splits.private`, with the split's fingerprint (never
its seed). The board's rows are read checked (`read_rows`); an entry that is not verified, or
graded on another protocol than the others, is refused by name, and every sweep's split is made
before any summary is written.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from finality_gym.corpus import PRIVATE, private_corpus

from eval.board.standings import read_board
from eval.grading.master_seed import master_seed, seed_options
from eval.grading.runfolder import SUMMARY, write_atomic
from eval.reports.format import interval, number
from eval.sweeps.aggregate import dumps, summarize_split
from eval.sweeps.baselines import load, sweeps_argument


def private_split(summary: dict, board: Path, master_seed: int) -> dict:
    """The sweep `summary`'s `splits.private` from the board's rows (module docstring)."""
    arm = summary["probe"]
    learned_name = re.compile(rf"ppo\.{re.escape(arm)}\.seed(\d+)")
    learned: dict[int, list[dict]] = {}
    scripted: dict[str, list[dict]] = {}
    protocols = {}
    for entry, rows in read_board(board):
        if entry["protocol"]["probe"] != arm:
            continue
        found = learned_name.fullmatch(entry["name"])
        if not found and entry["kind"] != "scripted":
            continue
        if entry["status"] != "verified":
            raise ValueError(f"{board}: entry {entry['name']} is {entry['status']}, not verified")
        protocols[entry["name"]] = (entry["protocol"], entry["private"]["fingerprint"])
        if found:
            learned[int(found[1])] = rows
        else:
            scripted[entry["spec"]] = rows
    if sorted(learned) != summary["seeds"]:
        raise ValueError(f"{board} holds the seeds {sorted(learned)} of probe arm {arm} as "
                         f"ppo.{arm}.seed<k>; the sweep has {summary['seeds']}")
    if len(set(map(json.dumps, protocols.values()))) != 1:
        raise ValueError(f"{board}: the entries of probe arm {arm} were graded under different "
                         f"protocols or private splits: {sorted(protocols)}")
    corpus = private_corpus(master_seed)
    protocol, fingerprint = next(iter(protocols.values()))
    if fingerprint != corpus.fingerprint:
        raise ValueError(f"{board} was graded on the private split {fingerprint}; the master "
                         f"seed given makes {corpus.fingerprint}")
    best = summary["splits"]["public"]["best_scripted"]
    split = summarize_split(scripted, learned, PRIVATE, best, corpus=corpus)
    return {**split, "fingerprint": fingerprint, "protocol": protocol}


def write_private(source: Path, summary: dict, split: dict) -> None:
    """Write `split` into the sweep's summary as `splits.private` (`source`: its folder or its
    summary.json)."""
    path = source / SUMMARY if source.is_dir() else source
    summary = {**summary, "splits": {**summary["splits"], PRIVATE: split}}
    write_atomic(path, dumps(summary))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sweeps_argument(parser)
    parser.add_argument("--board", type=Path, required=True,
                        help="a board of `eval verify` holding each sweep's seeds as entries "
                             "ppo.ARM.seed<k> and the arm's rules (`make board` makes one)")
    seed_options(parser)


def main(args: argparse.Namespace) -> int:
    seed = master_seed(args)
    if seed is None:
        raise ValueError("give the board's private split: --master-seed-file (the docs' split's "
                         "is docs/leaderboard/docs_master_seed)")
    loaded = [load(source) for source in args.sweeps]
    splits = [private_split(summary, args.board, seed) for summary in loaded]
    for source, summary, split in zip(args.sweeps, loaded, splits):
        write_private(source, summary, split)
        diff, ci = split["across_seeds"]["vs_best_scripted"], split["across_seeds"][
            "vs_best_scripted_ci"]
        print(f"{source}: probe arm {summary['probe']} on the private split "
              f"{split['fingerprint']}: learned - {split['best_scripted']} {diff:+.2f} "
              f"{interval(ci, number)}")
    return 0
