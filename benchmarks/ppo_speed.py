"""PPO training speed on this machine: steps per second per process and per core.

Training is limited by PPO itself (the policy's forward pass at every vectorized step and the
gradient updates), not by the env. This script trains the README recipe (no validation, no
checkpoints: only `model.learn`) under a few layouts, every layout's processes started at once,
and prints the steps/s of each process and of the whole machine, all measured in one run so
the ratios compare like with like:

    .venv/bin/python benchmarks/ppo_speed.py [--steps 40000] [--masked]

Layouts: one process with torch's default threads, one process with one thread, and as many
one-thread processes as cores (what `python -m train sweep` runs).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one(args: tuple) -> float:
    steps, masked, threads, env_id, overrides = args
    import torch

    if threads:
        torch.set_num_threads(threads)
    from train.config import ALGOS, TrainConfig
    from train.run import make_envs

    config = TrainConfig(env=env_id, masked=masked, **overrides)
    envs = make_envs(config)
    model = ALGOS[config.algo].cls()("MlpPolicy", envs, learning_rate=config.learning_rate,
                              n_steps=config.n_steps, batch_size=config.batch_size,
                              n_epochs=config.n_epochs, gamma=config.gamma, seed=config.seed,
                              ent_coef=config.ent_coef, device="cpu",
                              policy_kwargs={"net_arch": list(config.net_arch)})
    model.learn(total_timesteps=config.n_steps * config.n_envs)  # warm up
    started = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - started)


def layout(processes: int, threads: int | None, steps: int, masked: bool, env_id: str,
           overrides: dict) -> list[float]:
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(one, [(steps, masked, threads, env_id, overrides)] * processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--masked", action="store_true", help="MaskablePPO on FinalityNoProbe-v0")
    parser.add_argument("--variants", action="store_true",
                        help="also time other batch sizes, epochs and network sizes (2 processes)")
    args = parser.parse_args()
    env_id = "FinalityNoProbe-v0" if args.masked else "Finality-v0"
    cores = os.cpu_count() or 1
    print(f"{env_id}, {'MaskablePPO' if args.masked else 'PPO'}, {args.steps} steps a process, "
          f"{cores} cores")
    rows = [("1 process, default threads", 1, None, {}),
            ("1 process, 1 thread", 1, 1, {}),
            (f"{cores} processes, 1 thread each", cores, 1, {}),
            (f"{cores + 1} processes, 1 thread each", cores + 1, 1, {})]
    if args.variants:
        rows += [(f"{cores} x 1 thread, batch 1024", cores, 1, {"batch_size": 1024}),
                 (f"{cores} x 1 thread, 5 epochs", cores, 1, {"n_epochs": 5}),
                 (f"{cores} x 1 thread, net 64x64", cores, 1, {"net_arch": (64, 64)}),
                 (f"{cores} x 1 thread, 16 envs x 128", cores, 1, {"n_envs": 16, "n_steps": 128})]
    for name, processes, threads, overrides in rows:
        rates = layout(processes, threads, args.steps, args.masked, env_id, overrides)
        total = sum(rates)
        print(f"  {name:34s} {total:7.0f} steps/s in all, "
              f"{total / min(processes, cores):6.0f} per core "
              f"({', '.join(f'{r:.0f}' for r in rates)} per process)", flush=True)


if __name__ == "__main__":
    main()
