"""Vector env speed: env steps per second of Finality's native vector env
(`gym.make_vec(id, n)`, `finality_gym/vector.py`) against Gymnasium's `SyncVectorEnv` over the
scalar env, and CartPole-v1's `SyncVectorEnv` and native vector env, at 8, 64 and 256 envs,
under uniformly random actions (resets included), all in one run:

    .venv/bin/python benchmarks/vector_env.py [--blocks 7] [--seconds 0.3] [--envs 8,64,256]

The four are timed in interleaved blocks (one block of each in turn, `--blocks` times), so that
a machine that speeds up or slows down mid-run moves all four; it prints the median of each
one's blocks and the median of the blocks' ratios native / sync. Actions are drawn before the
clock starts, the same for every env of a size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import finality_gym  # noqa: F401  (registers the envs)

KINDS = (("Finality native", "Finality-v0", "vector_entry_point"),
         ("Finality sync", "Finality-v0", "sync"),
         ("CartPole sync", "CartPole-v1", "sync"),
         ("CartPole native", "CartPole-v1", "vector_entry_point"))


class Stepper:
    """One vector env under random actions, stepped in timed blocks."""

    def __init__(self, env_id: str, mode: str, n: int):
        self.env = gym.make_vec(env_id, n, vectorization_mode=mode)
        self.env.reset(seed=0)
        actions = self.env.single_action_space.n
        self.actions = np.random.default_rng(0).integers(0, actions, (1000, n))
        self.n = n
        self.k = 0

    def block(self, seconds: float) -> float:
        """Env steps per second over one block of about `seconds`."""
        step, actions = self.env.step, self.actions
        steps = 0
        start = time.perf_counter()
        while True:
            for _ in range(20):
                step(actions[self.k % 1000])
                self.k += 1
            steps += 20 * self.n
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=7, help="blocks of each env (default 7)")
    parser.add_argument("--seconds", type=float, default=0.3, help="seconds a block (default 0.3)")
    parser.add_argument("--envs", default="8,64,256",
                        help="numbers of envs, comma-separated (default 8,64,256)")
    args = parser.parse_args()
    if args.blocks < 1 or not args.seconds > 0:
        parser.error("--blocks must be >= 1 and --seconds > 0")
    try:
        sizes = [int(n) for n in args.envs.split(",")]
    except ValueError:
        parser.error(f"--envs: comma-separated ints, got {args.envs!r}")
    if min(sizes) < 1:
        parser.error("--envs: each number of envs must be >= 1")
    print(f"| envs | {' | '.join(name for name, *_ in KINDS)} | native / sync |")
    print(f"|---|{'---|' * len(KINDS)}---|")
    for n in sizes:
        steppers = [Stepper(env_id, mode, n) for _, env_id, mode in KINDS]
        for s in steppers:
            s.block(args.seconds / 3)  # warm up
        rates = [[s.block(args.seconds) for s in steppers] for _ in range(args.blocks)]
        medians = [statistics.median(r[i] for r in rates) for i in range(len(KINDS))]
        ratio = statistics.median(r[0] / r[1] for r in rates)
        print(f"| {n} | {' | '.join(f'{m:,.0f}' for m in medians)} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
