"""Env speed: `Finality-v0` steps per second under a uniformly random policy, resets included,
side by side with `CartPole-v1` (both through `gym.make`, in the same run): the two are timed in
interleaved blocks (a block of one, then a block of the other, `--blocks` times), so that a
machine that speeds up or slows down mid-run moves both; prints the median of each block's rate
and the median of the blocks' ratios; and the seconds an `rgb_array` frame takes.

    .venv/bin/python benchmarks/env.py [--blocks 15] [--seconds 0.3]

Both envs draw their random actions the same way (`env.action_space.sample()`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import finality_gym  # noqa: F401  (registers the envs)


class Stepper:
    """One env under a random policy, stepped in timed blocks."""

    def __init__(self, env_id: str):
        self.env = gym.make(env_id)
        self.env.reset(seed=0)
        self.env.action_space.seed(0)

    def block(self, seconds: float) -> float:
        """Steps per second over one block of about `seconds`."""
        sample, step, reset = self.env.action_space.sample, self.env.step, self.env.reset
        steps = 0
        start = time.perf_counter()
        while True:
            for _ in range(500):
                _, _, terminated, truncated, _ = step(sample())
                if terminated or truncated:
                    reset()
            steps += 500
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15, help="blocks of each env")
    parser.add_argument("--seconds", type=float, default=0.3, help="seconds a block")
    args = parser.parse_args()
    cartpole, finality = Stepper("CartPole-v1"), Stepper("Finality-v0")
    cartpole.block(args.seconds), finality.block(args.seconds)  # warm up
    pairs = [(cartpole.block(args.seconds), finality.block(args.seconds))
             for _ in range(args.blocks)]
    print(f"CartPole-v1 steps/s: {statistics.median(c for c, _ in pairs):,.0f}")
    print(f"Finality-v0 steps/s (resets included): {statistics.median(f for _, f in pairs):,.0f}")
    print(f"ratio Finality / CartPole: {statistics.median(f / c for c, f in pairs):.2f} (median "
          f"of {args.blocks} interleaved blocks)")
    print(f"rgb_array render, seconds a frame (a finished case, fault marks included): "
          f"{seconds_a_frame():.3f}")


def seconds_a_frame(frames: int = 5) -> float:
    """The timeline picture of one finished case with several reads and retries, redrawn."""
    env = gym.make("Finality-v0", render_mode="rgb_array")
    env.reset(seed=3)
    terminated = truncated = False
    for action in [0, 1, 2, 3, 4, 5] * 6:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    env.render()  # the first frame imports matplotlib and draws the shared layer
    start = time.perf_counter()
    for _ in range(frames):
        env.render()
    return (time.perf_counter() - start) / frames


if __name__ == "__main__":
    main()
