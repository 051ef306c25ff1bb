"""Training speed of the one-file trainer (`examples/masked_ppo.py`: masked PPO in plain torch on
the native vector env) against sb3-contrib's MaskablePPO with the same recipe (`python -m train
ppo --masked`'s: 8 envs x 256 steps, minibatches of 512, 10 epochs, a 128x128 network, one torch
thread) on the same arm, in one run, alternating the two `--rounds` times:

    .venv/bin/python benchmarks/example_speed.py [--steps 100000] [--rounds 2]

Each side validates twice, as the example does over a run shorter than `eval_every` (at its
first update and at its end; SB3 through `finality_gym.callbacks.ValidationCallback`), and its
steps per second count everything from the first step to the last validation. The example runs
as a user runs it (a subprocess; its final grading, after the clock stops, on one seed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV_ID = "FinalityNoProbe-v0"


def example(steps: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, str(ROOT / "examples" / "masked_ppo.py"), "--env-id",
                        ENV_ID, "--total-timesteps", str(steps), "--eval-every", str(10 * steps),
                        "--grade-seeds", "1", "--workers", "1", "--out", f"{folder}/run"],
                       check=True, capture_output=True, cwd=ROOT)
        return json.loads(Path(folder, "run", "result.json").read_text())["steps_per_second"]


def sb3(steps: int) -> float:
    code = f"""
import time, torch
torch.set_num_threads(1)
from finality_gym.callbacks import ValidationCallback
from train.config import TrainConfig
from train.run import make_envs, new_model
config = TrainConfig(env={ENV_ID!r}, algo="maskable_ppo", timesteps={steps})
model = new_model(config, make_envs(config))
started = time.perf_counter()
model.learn({steps}, callback=ValidationCallback(eval_every={10 * steps}))
print(model.num_timesteps / (time.perf_counter() - started))
"""
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=ROOT)
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="training steps a run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, alternated")
    args = parser.parse_args()
    pairs = []
    for k in range(args.rounds):
        started = time.perf_counter()
        pairs.append((example(args.steps), sb3(args.steps)))
        print(f"round {k}: example {pairs[-1][0]:,.0f} steps/s, MaskablePPO {pairs[-1][1]:,.0f} "
              f"steps/s, ratio {pairs[-1][0] / pairs[-1][1]:.2f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    best = max(e for e, _ in pairs), max(s for _, s in pairs)
    print(f"fastest of {args.rounds}: example {best[0]:,.0f} steps/s, MaskablePPO {best[1]:,.0f} "
          f"steps/s, ratio {best[0] / best[1]:.2f}")


if __name__ == "__main__":
    main()
