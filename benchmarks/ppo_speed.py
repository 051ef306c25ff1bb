"""PPO training speed on this machine: steps per second per process and per core.

Training is limited by PPO itself (the policy's forward pass at every vectorized step and the
gradient updates), not by the env. This script trains the README recipe (no validation, no
checkpoints: only `model.learn`) under a few layouts, every layout's processes started at once,
and prints the steps/s of each process and of the whole machine, all measured in one run so
the ratios compare like with like:

    .venv/bin/python benchmarks/ppo_speed.py [--steps 40000] [--masked | --recurrent] [--variants]

Layouts: one process with torch's default threads, one process with one thread, and as many
one-thread processes as cores (what `python -m train sweep` runs); with `--recurrent`, the last
also with sb3-contrib's own gradient updates, without `train/recurrent.py`'s.
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
    steps, algo, threads, env_id, overrides = args
    import torch

    if threads:
        torch.set_num_threads(threads)
    from train import recurrent
    from train.config import TrainConfig
    from train.run import make_envs, new_model

    stock = overrides.pop("stock", False)
    config = TrainConfig(env=env_id, algo=algo, **overrides)
    model = new_model(config, make_envs(config))
    if stock:  # RecurrentPPO's updates as sb3-contrib ships them, without train/recurrent.py's
        recurrent.RecurrentActorCriticPolicy._process_sequence = staticmethod(
            recurrent.STEP_BY_STEP)
        recurrent.buffers.pad = recurrent.STOCK_PAD
    model.learn(total_timesteps=config.n_steps * config.n_envs)  # warm up
    started = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - started)


def layout(processes: int, threads: int | None, steps: int, algo: str, env_id: str,
           overrides: dict) -> list[float]:
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(one, [(steps, algo, threads, env_id, overrides)] * processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--masked", action="store_true", help="MaskablePPO on FinalityNoProbe-v0")
    parser.add_argument("--recurrent", action="store_true",
                        help="RecurrentPPO (its recipe: 64-unit LSTM) on FinalityIdentityProbe-v0")
    parser.add_argument("--variants", action="store_true",
                        help="also time other batch sizes, epochs and network sizes (2 processes)")
    args = parser.parse_args()
    algo = "maskable_ppo" if args.masked else "recurrent_ppo" if args.recurrent else "ppo"
    env_id = {"maskable_ppo": "FinalityNoProbe-v0", "recurrent_ppo": "FinalityIdentityProbe-v0"
              }.get(algo, "Finality-v0")
    cores = os.cpu_count() or 1
    print(f"{env_id}, {algo}, {args.steps} steps a process, {cores} cores")
    rows = [("1 process, default threads", 1, None, {}),
            ("1 process, 1 thread", 1, 1, {}),
            (f"{cores} processes, 1 thread each", cores, 1, {}),
            (f"{cores + 1} processes, 1 thread each", cores + 1, 1, {})]
    if args.recurrent:
        rows.insert(3, (f"{cores} x 1 thread, sb3-contrib's own updates", cores, 1,
                        {"stock": True}))
    if args.variants:
        rows += [(f"{cores} x 1 thread, batch 1024", cores, 1, {"batch_size": 1024}),
                 (f"{cores} x 1 thread, 5 epochs", cores, 1, {"n_epochs": 5}),
                 (f"{cores} x 1 thread, net 64x64", cores, 1, {"net_arch": (64, 64)}),
                 (f"{cores} x 1 thread, 16 envs x 128", cores, 1, {"n_envs": 16, "n_steps": 128}),
                 (f"{cores} x 1 thread, 32 envs x 64", cores, 1, {"n_envs": 32, "n_steps": 64})]
    for name, processes, threads, overrides in rows:
        rates = layout(processes, threads, args.steps, algo, env_id, overrides)
        total = sum(rates)
        print(f"  {name:34s} {total:7.0f} steps/s in all, "
              f"{total / min(processes, cores):6.0f} per core "
              f"({', '.join(f'{r:.0f}' for r in rates)} per process)", flush=True)


if __name__ == "__main__":
    main()
