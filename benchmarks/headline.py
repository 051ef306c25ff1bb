"""Wall time of the whole main job: `python -m eval headline --workers 2` into a fresh folder
(14,445 episodes, statistics, report and figures), as a user runs it.

    .venv/bin/python benchmarks/headline.py [--repeats 3] [--workers 2]
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "eval", "headline", "--workers",
                            str(args.workers), "--out", tmp, "--no-progress"], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    print(f"python -m eval headline --workers {args.workers}: "
          f"median {statistics.median(times):.2f} s, min {min(times):.2f} s, "
          f"max {max(times):.2f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
