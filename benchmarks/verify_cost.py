"""What verifying a bundle costs against grading its policy: for three bundles (the finality gate,
the shipped PPO model as `ppo:`, and an outside policy file, sandboxed), the wall time of
`python -m eval verify BUNDLE --out NEW_BOARD` (the bundle read and checked, its policy loaded as
a check, then graded on the private and the public split, all tasks x 5 seeds, and the public
figures summarized) against grading the same spec on the same two splits as an operator did
before `verify` existed, `python -m eval headline --policies POLICY --split private
--master-seed-file F` and the same on `public` (two processes, each with its report and
figures), and against the floor, the shared grader's `grade` on both splits in one bare
process (no command, no report). Every run a fresh process with 2 workers, the three
alternated, fastest of `--repeats`; the ratios are of one run.

    .venv/bin/python benchmarks/verify_cost.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY = '''from finality_gym.policy import Policy

class ProbeThenShip(Policy):
    name = "probe_then_ship"
    def plan(self):
        answer = yield ("probe_processor", {})
        yield ("ship", {}) if answer["captures"].get("cap1") == "settled" else ("refund", {})
'''
GRADE = '''import sys
from pathlib import Path
from eval.grading.grader import RunConfig, grade
from eval.grading.master_seed import master_seed
from argparse import Namespace
spec, seed_file, out = sys.argv[1:]
seed = master_seed(Namespace(master_seed=None, master_seed_file=seed_file))
for split in ("private", "public"):
    grade(RunConfig((spec,), split=split, master_seed=seed if split == "private" else None),
          Path(out) / split, workers=2, progress=False)
'''


def timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "probe_then_ship.py").write_text(POLICY)
        subprocess.run([py, "-m", "eval", "keygen", "--out", str(work / "seed")], cwd=ROOT,
                       check=True, capture_output=True)
        specs = {"finality_gate": "finality_gate", "ppo_full": "ppo:models/ppo_full.zip",
                 "outside file": f"{work / 'probe_then_ship.py'}:ProbeThenShip"}
        for i, spec in enumerate(specs.values()):
            subprocess.run([py, "-m", "eval", "submit", spec, "--name", f"b{i}", "--out",
                            str(work / f"b{i}.finality")], cwd=ROOT, check=True,
                           capture_output=True)
        times = {n: {"headline": [], "grade": [], "verify": []} for n in specs}
        seed = ["--master-seed-file", str(work / "seed")]
        for r in range(args.repeats):
            for i, (name, spec) in enumerate(specs.items()):
                head = [py, "-m", "eval", "headline", "--policies", spec, "--no-progress"]
                times[name]["headline"].append(
                    timed([*head, "--split", "private", *seed, "--out", str(work / f"h{r}_{i}p")],
                          ROOT)
                    + timed([*head, "--out", str(work / f"h{r}_{i}")], ROOT))
                times[name]["grade"].append(timed(
                    [py, "-c", GRADE, spec, str(work / "seed"), str(work / f"g{r}_{i}")], ROOT))
                times[name]["verify"].append(timed(
                    [py, "-m", "eval", "verify", str(work / f"b{i}.finality"), *seed,
                     "--no-progress", "--out", str(work / f"v{r}_{i}")], ROOT))
    print(f"fastest of {args.repeats}, 3,210 episodes each (private + public, 321 tasks x 5 "
          "seeds), 2 workers, fresh processes:")
    for name, t in times.items():
        head, grade, verify = min(t["headline"]), min(t["grade"]), min(t["verify"])
        print(f"  {name:<14} headline x2 {head:6.1f} s   bare grade {grade:6.1f} s   verify "
              f"{verify:6.1f} s   verify / headline {verify / head:.2f}   verify / grade "
              f"{verify / grade:.2f}")


if __name__ == "__main__":
    main()
