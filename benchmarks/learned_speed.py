"""Grading speed of saved stable-baselines3 models, in the grader's process: `ppo:` and `sb3:` on
the shipped `models/ppo_full.zip` (PPO, a 128x128 MLP: the two specs share one loading and
playing path, so their rates should match), and `sb3:` on a tiny DQN and a tiny RecurrentPPO
(built here, untrained) on `public` x 1 seed (321 episodes). Each figure is the whole
`grade(..., workers=1)` call into a fresh folder (the model's load check and load included),
after one warm-up run that pays for importing torch; the specs take turns, and each rate is the
median of `--repeats` runs. Episodes end at different lengths under different models, so calls/s
(the policy's decisions) is printed beside episodes/s; the ratios are to `ppo:` within one run.

    .venv/bin/python benchmarks/learned_speed.py [--repeats 3]
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


def tiny_archives(folder: Path) -> dict[str, Path]:
    """An untrained DQN (64x64 MLP) and RecurrentPPO (a 32-cell LSTM, then a 64 layer): their
    speed, not their skill, is what is measured."""
    import gymnasium as gym
    from sb3_contrib import RecurrentPPO
    from stable_baselines3 import DQN

    import finality_gym  # noqa: F401  (registers Finality-v0)
    env = gym.make("Finality-v0")
    models = {"dqn": DQN("MlpPolicy", env, buffer_size=1_000, seed=0, device="cpu",
                         policy_kwargs={"net_arch": [64, 64]}),
              "recurrent": RecurrentPPO("MlpLstmPolicy", env, n_steps=64, seed=0, device="cpu",
                                        policy_kwargs={"net_arch": [64],
                                                       "lstm_hidden_size": 32})}
    for name, model in models.items():
        model.save(folder / f"{name}.zip")
    return {name: folder / f"{name}.zip" for name in models}


def timed(spec: str, folder: Path) -> tuple[float, int, int]:
    """Seconds for one whole grading of `spec` on public x 1 seed, its episodes and calls."""
    from eval.grading.grader import RunConfig, grade
    with tempfile.TemporaryDirectory(dir=folder) as out:
        started = time.perf_counter()
        rows = grade(RunConfig((spec,), seeds=(0,)), Path(out), workers=1, progress=False)
        seconds = time.perf_counter() - started
    return seconds, len(rows), sum(row["calls_used"] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each spec (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny = tiny_archives(folder)
        specs = ["ppo:models/ppo_full.zip", "sb3:models/ppo_full.zip", f"sb3:{tiny['dqn']}",
                 f"sb3:{tiny['recurrent']}"]
        labels = dict(zip(specs, ["ppo:models/ppo_full.zip", "sb3:models/ppo_full.zip",
                                  "sb3:tiny DQN", "sb3:tiny RecurrentPPO"]))
        timed(specs[0], folder)  # warm-up: torch and SB3 imported once, for every spec
        runs: dict[str, list] = {spec: [] for spec in specs}
        for _ in range(args.repeats):
            for spec in specs:
                runs[spec].append(timed(spec, folder))
    print(f"public x 1 seed, in process (workers=1), median of {args.repeats} runs")
    base = None
    for spec in specs:
        episodes, calls = runs[spec][0][1:]
        seconds = statistics.median(run[0] for run in runs[spec])
        rate = (episodes / seconds, calls / seconds)
        base = base or rate
        print(f"  {labels[spec]:26s} {episodes} episodes, {calls:5d} calls in {seconds:5.2f} s: "
              f"{rate[0]:6.1f} episodes/s ({rate[0] / base[0]:.2f}x ppo:), "
              f"{rate[1]:7.1f} calls/s ({rate[1] / base[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
