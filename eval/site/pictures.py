"""The episodes' timeline pictures (`finality_gym.timeline.draw`, 1280 x 800): which are drawn
when the site is built, and the drawing itself, in worker processes at build time and in the
server's threads for one asked for later (`--serve`). A picture costs ~0.8 s of a core and ~140
KB, so by default only those that matter are drawn at build time."""

from __future__ import annotations

import json
import multiprocessing
import sys
import threading
from collections import defaultdict
from pathlib import Path

from eval.site.replays import World
from eval.site.runs import Folder

PICTURES = ("some", "all", "none")
WORST = 5            # pictures drawn per policy of a folder with `--pictures some`

_DRAWING = threading.Lock()  # matplotlib's Agg is not to be used by two threads at once
_WORLDS: dict[str, World] = {}  # a drawing process's worlds, by the run.json they come from


def pick(folder: Folder, pictures: str, worst: int) -> set[int]:
    """Indexes of the rows to draw at build time: none, all, or (`some`) every model episode
    and the `worst` of largest gap of each policy."""
    if pictures == "none":
        return set()
    drawable = [i for i, r in enumerate(folder.rows) if "calls" in r]
    if pictures == "all":
        return set(drawable)
    by_policy: dict[str, list[int]] = defaultdict(list)
    for i in drawable:
        by_policy[folder.rows[i]["policy"]].append(i)
    chosen = {i for i in drawable if folder.rows[i]["policy"].startswith("model:")}
    for indexes in by_policy.values():
        chosen.update(sorted(indexes, key=lambda i: -folder.rows[i]["gap"])[:worst])
    return chosen


def draw(world: World, row: dict, path: Path) -> None:
    """The picture of the row's episode, rebuilt in `world`, at `path`."""
    from finality_gym.timeline import draw as timeline
    from eval.reports.figures import save_png
    episode = world.episode(row)
    with _DRAWING:
        save_png(timeline(episode), path)


def _draw_job(job: tuple) -> None:
    manifest, row, path = job
    key = json.dumps(manifest, sort_keys=True)
    if key not in _WORLDS:
        _WORLDS[key] = World(manifest)
    draw(_WORLDS[key], row, path)


def draw_all(jobs: list[tuple], workers: int) -> None:
    """Draw the pictures chosen at build time, each job (its run.json, its row, its path), in
    `workers` processes."""
    if workers == 1 or len(jobs) < 2:
        for job in jobs:
            _draw_job(job)
        return
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        for _ in pool.imap_unordered(_draw_job, jobs, chunksize=4):
            pass
