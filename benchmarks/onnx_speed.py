"""Grading speed of one model through onnxruntime and through torch: `models/ppo_full.zip` (PPO,
a 128x128 MLP) exported by `python -m train export`, then graded as `onnx:`, `onnx-greedy:`,
`sb3:` and `ppo:` on the same tasks (`public` x `--seeds`, 1,605 episodes by default) in one run,
with 2 workers. Each figure is the whole `grade(..., workers=2)` call into a fresh folder (the
workers' start, the model's load check and load included), after one warm-up call of each spec
that pays for this process's imports; the specs take turns, and each rate is the median of
`--repeats` runs. Episodes end at different lengths under different policies, so calls/s (the
policy's decisions) is printed beside episodes/s; the ratios are to `sb3:` within one run.

It also counts the episodes whose rows `onnx:` and `sb3:` grade alike (the same model, sampled
from the same per-episode generator: they differ only where the two runtimes' probabilities
differ near a tie), and likewise `onnx-greedy:` and `sb3-greedy:` (graded once, uncounted).

    .venv/bin/python benchmarks/onnx_speed.py [--repeats 3] [--seeds 0-4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "models" / "ppo_full.zip"
WORKERS = 2


def timed(spec: str, folder: Path, seeds: tuple[int, ...]) -> tuple[float, list[dict]]:
    """Seconds for one whole grading of `spec` on public x `seeds`, and its rows."""
    from eval.grading.grader import RunConfig, grade
    with tempfile.TemporaryDirectory(dir=folder) as out:
        started = time.perf_counter()
        rows = grade(RunConfig((spec,), seeds=seeds), Path(out), workers=WORKERS,
                     progress=False)
        return time.perf_counter() - started, rows


def alike(rows: list[dict], others: list[dict]) -> int:
    """Episodes graded alike by two specs: the same row but for the policy's name."""
    def key(row):
        return row["task_id"], row["seed"]

    theirs = {key(row): {**row, "policy": ""} for row in others}
    return sum(theirs[key(row)] == {**row, "policy": ""} for row in rows)


def main() -> None:
    from train.export import export
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each spec (median)")
    parser.add_argument("--seeds", default="0-4", help="grading seeds, FIRST-LAST (default 0-4)")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = tuple(range(int(first), int(last or first) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        onnx = folder / "ppo_full.onnx"
        export(MODEL, onnx)
        specs = [f"onnx:{onnx}", f"onnx-greedy:{onnx}", f"sb3:{MODEL}", f"ppo:{MODEL}"]
        labels = dict(zip(specs, ["onnx:", "onnx-greedy:", "sb3:", "ppo:"]))
        rows = {spec: timed(spec, folder, seeds)[1] for spec in specs}  # warm-up
        greedy = timed(f"sb3-greedy:{MODEL}", folder, seeds)[1]
        runs: dict[str, list[float]] = {spec: [] for spec in specs}
        for _ in range(args.repeats):
            for spec in specs:
                runs[spec].append(timed(spec, folder, seeds)[0])
    print(f"public x seeds {seeds[0]}-{seeds[-1]}, {WORKERS} workers, whole grade calls, median "
          f"of {args.repeats} runs")
    for spec in specs:
        episodes, calls = len(rows[spec]), sum(row["calls_used"] for row in rows[spec])
        seconds = statistics.median(runs[spec])
        rate = (episodes / seconds, calls / seconds)
        print(f"  {labels[spec]:13s} {episodes} episodes, {calls:6d} calls in {seconds:5.2f} s: "
              f"{rate[0]:7.1f} episodes/s, {rate[1]:8.1f} calls/s", flush=True)
    sb3 = statistics.median(runs[specs[2]])
    print("  ratios to sb3: " + ", ".join(f"{labels[s]} {sb3 / statistics.median(runs[s]):.2f}x"
                                          for s in specs))
    print(f"  rows alike: onnx: and sb3: {alike(rows[specs[0]], rows[specs[2]])} of "
          f"{len(rows[specs[0]])}; onnx-greedy: and sb3-greedy: "
          f"{alike(rows[specs[1]], greedy)} of {len(greedy)}")


if __name__ == "__main__":
    main()
