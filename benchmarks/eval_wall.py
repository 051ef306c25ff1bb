"""Wall time of whole `python -m eval` commands, as a user runs them, into fresh folders:
`headline` (14,445 episodes, statistics, report, figures) and `all` (every experiment).

    .venv/bin/python benchmarks/eval_wall.py headline [--repeats 3] [--workers 2]
    .venv/bin/python benchmarks/eval_wall.py all --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["headline", "all"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "eval", args.command, "--workers",
                            str(args.workers), "--out", tmp, "--no-progress"], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    print(f"python -m eval {args.command} --workers {args.workers}: "
          f"median {statistics.median(times):.1f} s, min {min(times):.1f} s, "
          f"max {max(times):.1f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
