"""Wall time of whole `python -m eval` commands, as a user runs them, into fresh folders:
`headline` (14,445 episodes, statistics, report, figures), `all` (every experiment) or one
experiment; with `--against COMMIT`, the same command of that commit's tree (a temporary git
worktree, same virtualenv) in the same run, alternating the two, and the ratio of their fastest
times: a later change that slows the main job shows up as a ratio above 1.

    .venv/bin/python benchmarks/eval_wall.py headline [--repeats 3] [--workers 2]
    .venv/bin/python benchmarks/eval_wall.py headline --against e494c25
    .venv/bin/python benchmarks/eval_wall.py all --repeats 1 --against e494c25
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("headline", "all", "ablation", "tuning", "costs", "plans")


@contextlib.contextmanager
def worktree(commit: str):
    """The tree of `commit`, checked out beside this one for the length of the run."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit],
                       cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=True)


def timed(tree: Path, command: str, workers: int) -> float:
    """One run of `python -m eval COMMAND` in `tree` into a fresh folder, in seconds. The
    tree's own packages are imported (the working directory comes first on the path)."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "eval", command, "--workers", str(workers),
                        "--out", out, "--no-progress"], cwd=tree, check=True,
                       stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tree")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--against", metavar="COMMIT", default=None,
                        help="also time this commit's tree, alternating with this one")
    args = parser.parse_args()
    with (worktree(args.against) if args.against else contextlib.nullcontext()) as reference:
        trees = {"this tree": ROOT, **({args.against: reference} if reference else {})}
        times: dict[str, list[float]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            order = list(trees) if repeat % 2 == 0 else list(trees)[::-1]
            for name in order:
                times[name].append(timed(trees[name], args.command, args.workers))
    for name, runs in times.items():
        print(f"{name}: python -m eval {args.command} --workers {args.workers}: fastest "
              f"{min(runs):.1f} s ({', '.join(f'{t:.1f}' for t in runs)})")
    if args.against:
        print(f"ratio this tree / {args.against}: "
              f"{min(times['this tree']) / min(times[args.against]):.2f} (fastest of "
              f"{args.repeats}, alternated)")


if __name__ == "__main__":
    main()
