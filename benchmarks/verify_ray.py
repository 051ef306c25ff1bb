"""What `eval verify --backend ray` costs against a local verify: for three bundles (the finality
gate, the shipped PPO model as `sb3:`, and an outside policy file, sandboxed), the wall time of
`python -m eval verify BUNDLE --out NEW_BOARD` with 2 worker processes here, and the same with
`--backend ray --workers 2` on a two-node Ray cluster started on this machine
(`ray.cluster_utils.Cluster`, one CPU a node, joined through `RAY_ADDRESS` as an operator's own
cluster is): private and public split, all tasks x 5 seeds each. Every verify a fresh process
(Ray's connection and, for outside code, the sandbox's self-test on each node are in its time),
the two alternated, fastest of `--repeats`; the ratios are of one run. The rows are compared
too: they must be the same bytes.

    .venv/bin/python benchmarks/verify_ray.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ray.cluster_utils import Cluster

from verify_cost import POLICY  # benchmarks/verify_cost.py: the same outside policy

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def rows(board: Path) -> dict[str, bytes]:
    return {str(p.relative_to(board)): p.read_bytes() for p in board.glob("*/*/episodes.jsonl")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    py = sys.executable
    os.environ["RAY_worker_niceness"] = "0"  # as `distributed.connect` asks of its own Ray
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        on_ray = {**os.environ, "RAY_ADDRESS": cluster.address}
        here = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            (work / "probe_then_ship.py").write_text(POLICY)
            subprocess.run([py, "-m", "eval", "keygen", "--out", str(work / "seed")], cwd=ROOT,
                           check=True, capture_output=True)
            specs = {"finality_gate": "finality_gate", "ppo_full": "sb3:models/ppo_full.zip",
                     "outside file": f"{work / 'probe_then_ship.py'}:ProbeThenShip"}
            for i, spec in enumerate(specs.values()):
                subprocess.run([py, "-m", "eval", "submit", spec, "--name", f"b{i}", "--out",
                                str(work / f"b{i}.finality")], cwd=ROOT, check=True,
                               capture_output=True)
            times = {n: {"local": [], "ray": []} for n in specs}
            same = {n: True for n in specs}
            for r in range(args.repeats):
                for i, name in enumerate(specs):
                    verify = [py, "-m", "eval", "verify", str(work / f"b{i}.finality"),
                              "--master-seed-file", str(work / "seed"), "--no-progress",
                              "--workers", "2"]
                    local, remote = work / f"local{r}_{i}", work / f"ray{r}_{i}"
                    times[name]["local"].append(timed([*verify, "--out", str(local)], here))
                    times[name]["ray"].append(timed(
                        [*verify, "--backend", "ray", "--out", str(remote)], on_ray))
                    same[name] &= rows(local) == rows(remote) and len(rows(local)) == 2
    finally:
        cluster.shutdown()
    print(f"fastest of {args.repeats}, one bundle a verify, 3,210 episodes each (private + "
          "public, 321 tasks x 5 seeds); local: 2 worker processes; ray: 2 tasks in flight on "
          "a two-node local cluster (one CPU a node); fresh processes:")
    for name, t in times.items():
        local, ray = min(t["local"]), min(t["ray"])
        print(f"  {name:<14} local {local:6.1f} s   ray {ray:6.1f} s   ray - local "
              f"{ray - local:+6.1f} s   ray / local {ray / local:.2f}   rows "
              f"{'identical' if same[name] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
