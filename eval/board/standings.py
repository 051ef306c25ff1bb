"""A board's standings, computed from its entries' private-split rows: what the leaderboard page
shows, and nothing that names a private episode.

Entries are grouped by what makes two grades comparable: the probe arm (an arm is another
benchmark: groups come in the arms' order), the grader's version, the private split's
fingerprint and the protocol (seeds, subset). Each group names its yardsticks where they were
entered: the finality gate and the arm's best scripted rule, chosen on the public split. Within a group every entry
played the same private episodes, so the statistics are paired: the units (a twin pair, or a
singleton task) are found from the rows, resampled once (`REPLICATES`, from `BOOTSTRAP_SEED`)
and shared by every entry of the group. An entry's mean gap and exact rate are ratios of per-unit
sums with 95 % percentile intervals (`eval/stats/bootstrap.py`); for every pair, the paired
difference of mean gap with its interval and P(better), the share of resamples in which the first
has the lower gap (a tie counts half). Entries graded by another grader, on another split or
under another protocol are ranked in their own group, never mixed. Ranks follow the mean gap,
equal gaps sharing a rank; a privileged entry (the reference that reads the truth) is shown in
its group without a rank.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from agents import is_unprivileged_scripted
from agents.registry import GATE
from finality_gym import ARCHETYPES, PROBE_ARMS

from eval.board.verify import ENTRIES, ENTRY, run_folder
from eval.grading.labels import LABELS
from eval.grading.runfolder import ROWS, read_rows
from eval.stats.bootstrap import (
    REPLICATES,
    UnitSums,
    bootstrap_indices,
    difference_interval,
    pass_hat_k,
    resample_counts,
    win_share,
)
from eval.stats.summary import BOOTSTRAP_SEED, rounded, rounded_interval

PUBLISHED = ("name", "kind", "spec", "privileged", "bundle_sha256", "status", "public_reason",
             "protocol", "private", "public", "claimed", "grader", "form", "sandbox",
             "machine", "model", "served_as", "verified_at")


def published(entry: dict) -> dict:
    """What the page and `board.json` show of an entry: `PUBLISHED`, and of `sandbox_nodes`
    (a Ray cluster's nodes by host name, which the operator keeps) how many proved the sandbox
    and whether every one proved what the grader's machine did."""
    shown = {k: entry[k] for k in PUBLISHED if k in entry}
    if "sandbox_nodes" in entry:
        nodes = list(entry["sandbox_nodes"].values())
        shown["sandbox_nodes"] = {"nodes": len(nodes),
                                  "as_the_grader": all(n == entry.get("sandbox") for n in nodes)}
    return shown


def read_board(board: Path) -> list[tuple[dict, list[dict]]]:
    """(entry.json, its private rows) of every entry of `board`, by name; the rows are read
    checked (`read_rows`: each line's checksum)."""
    folder = board / ENTRIES
    if not folder.is_dir():
        raise ValueError(f"{board} is not a board (no {ENTRIES}/): make one with python -m eval "
                         "verify")
    out = []
    for path in sorted(p for p in folder.iterdir() if (p / ENTRY).is_file()):
        entry = json.loads((path / ENTRY).read_text())
        rows = run_folder(board, "private", path.name) / ROWS
        out.append((entry, read_rows(rows) if rows.is_file() else []))
    if not out:
        raise ValueError(f"{board} holds no entry")
    return out


def group_key(entry: dict) -> str:
    """What makes two grades comparable, the probe arm first: an arm is another benchmark."""
    protocol = entry["protocol"]
    return (f"probe arm {protocol['probe']} · grader {entry['grader']['label']} · private split "
            f"{entry['private']['fingerprint']} · {protocol['tasks']} tasks x "
            f"{len(protocol['seeds'])} seeds ({protocol['subset']})")


def _arm_order(item: tuple[str, list]) -> tuple:
    """Groups in the arms' order (`PROBE_ARMS`), then the largest first, then by name."""
    probe = item[1][0][0]["protocol"]["probe"]
    return (PROBE_ARMS.index(probe) if probe in PROBE_ARMS else len(PROBE_ARMS), -len(item[1]),
            item[0])


def rules(members: list[tuple[dict, list[dict]]]) -> dict:
    """The group's yardsticks, where entered: the finality gate, and the arm's best scripted
    rule (the unprivileged scripted entry of lowest mean gap on the public split, as the
    learned baselines choose theirs: never on the private split being ranked)."""
    scripted = [e for e, _ in members if is_unprivileged_scripted(e["spec"])
                and "mean_gap" in e.get("public", {})]
    best = min(scripted, key=lambda e: (e["public"]["mean_gap"], e["name"]), default=None)
    gate = next((e["name"] for e, _ in members if e["spec"] == GATE), None)
    return {"gate": gate, "best_rule": None if best is None else best["name"]}


def units_of(rows: list[dict]) -> dict[str, int]:
    """Each task's unit (its twin pair, or itself), numbered in order of first appearance."""
    numbers: dict[str, int] = {}
    unit_of = {}
    for row in rows:
        unit = row["twin_id"] or row["task_id"]
        unit_of[row["task_id"]] = numbers.setdefault(unit, len(numbers))
    return unit_of


def _figures(rows: list[dict], unit_of: dict, counts: np.ndarray, seeds: int) -> dict:
    n = len(set(unit_of.values()))
    units = np.array([unit_of[r["task_id"]] for r in rows])
    gap = UnitSums.of(units, np.array([r["gap"] for r in rows], dtype=float) / 100, n)
    exact = UnitSums.of(units, np.array([r["gap"] == 0 for r in rows], dtype=float), n)
    successes: Counter = Counter()
    for r in rows:
        successes[r["task_id"]] += r["gap"] == 0
    labels = Counter(r["label"] for r in rows)
    archetypes = {}
    for name in ARCHETYPES:
        mine = [r for r in rows if r["archetype"] == name]
        if mine:
            archetypes[name] = {"mean_gap": rounded(np.mean([r["gap"] for r in mine]) / 100),
                                "exact": rounded(np.mean([r["gap"] == 0 for r in mine]))}
    figures = {"episodes": len(rows), "mean_gap": rounded(gap.value),
               "mean_gap_ci": rounded_interval(gap.interval(counts)),
               "exact": rounded(exact.value), "exact_ci": rounded_interval(exact.interval(counts)),
               "pass_k": [rounded(x) for x in pass_hat_k(np.array(list(successes.values())),
                                                         seeds)],
               "premature": rounded(np.mean([r["premature"] for r in rows])),
               "failure_labels": {k: labels.get(k, 0) for k in LABELS},
               "per_archetype": archetypes}
    if "cost_microusd" in rows[0] or "tokens_in" in rows[0]:
        figures["cost_per_episode_usd"] = rounded(
            np.mean([r.get("cost_microusd", 0) for r in rows]) / 1e6)
        figures["tokens_per_episode"] = rounded(
            np.mean([r.get("tokens_in", 0) + r.get("tokens_out", 0) for r in rows]), 1)
    return figures, gap


def _group(members: list[tuple[dict, list[dict]]]) -> dict:
    """One group's ranked entries and pairwise matrix, on the episodes all its entries share."""
    shared = set.intersection(*({(r["task_id"], r["seed"]) for r in rows} for _, rows in members))
    rows_of = {e["name"]: [r for r in rows if (r["task_id"], r["seed"]) in shared]
               for e, rows in members}
    unit_of = units_of(next(iter(rows_of.values())))
    n = len(set(unit_of.values()))
    counts = resample_counts(bootstrap_indices(n, REPLICATES, BOOTSTRAP_SEED), n)
    seeds = len(members[0][0]["protocol"]["seeds"])
    figures, sums = {}, {}
    for entry, _ in members:
        figures[entry["name"]], sums[entry["name"]] = _figures(rows_of[entry["name"]], unit_of,
                                                                counts, seeds)
    order = sorted(figures, key=lambda name: (sums[name].value, name))
    privileged = {e["name"] for e, _ in members if e["privileged"]}
    ranked = [{"name": name, "rank": None if name in privileged else 1 + sum(
        sums[other].value < sums[name].value for other in order if other not in privileged),
        **figures[name]} for name in order]  # equal gaps share a rank
    pairwise = {}
    for a in order:
        reps_a = sums[a].replicates(counts)
        for b in order:
            if a != b:
                pairwise[f"{a} - {b}"] = {
                    "a": a, "b": b, "diff": rounded(sums[a].value - sums[b].value),
                    "diff_ci": rounded_interval(difference_interval(sums[a], sums[b], counts)),
                    "p_better": rounded(float(np.mean(win_share(reps_a,
                                                                sums[b].replicates(counts)))))}
    return {"episodes": len(shared), "units": n, "entries": ranked, "pairwise": pairwise,
            "bootstrap": {"replicates": REPLICATES, "seed": BOOTSTRAP_SEED, "confidence": 0.95}}


def standings(board: list[tuple[dict, list[dict]]]) -> dict:
    """The board's groups, largest first (then by name): each with its entries ranked, the
    pairwise matrix and every entry's published fields; entries not verified listed apart."""
    groups: dict[str, list] = {}
    for entry, rows in board:
        if entry["status"] == "verified" and rows:
            groups.setdefault(group_key(entry), []).append((entry, rows))
    shown = {e["name"]: published(e) for e, _ in board}
    return {"groups": [{"key": key, "probe": members[0][0]["protocol"]["probe"],
                        **rules(members), **_group(members)}
                       for key, members in sorted(groups.items(), key=_arm_order)],
            "not_ranked": [shown[e["name"]] for e, rows in board
                           if e["status"] != "verified" or not rows],
            "entries": shown}
