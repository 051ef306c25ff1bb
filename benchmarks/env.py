"""Env speed: `Finality-v0` steps per second under a uniformly random policy, resets included,
side by side with `CartPole-v1` (both through `gym.make`, in the same run); prints the ratio;
and the seconds an `rgb_array` frame takes.

    .venv/bin/python benchmarks/env.py [--seconds 3]

Both envs draw their random actions the same way (`env.action_space.sample()`).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import finality_gym  # noqa: F401  (registers the envs)


def steps_per_second(env_id: str, seconds: float) -> float:
    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    sample = env.action_space.sample
    step = env.step
    reset = env.reset
    steps = 0
    start = time.perf_counter()
    while True:
        for _ in range(1000):
            _, _, terminated, truncated, _ = step(sample())
            if terminated or truncated:
                reset()
        steps += 1000
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    cartpole = steps_per_second("CartPole-v1", args.seconds)
    finality = steps_per_second("Finality-v0", args.seconds)
    print(f"CartPole-v1 steps/s: {cartpole:,.0f}")
    print(f"Finality-v0 steps/s (resets included): {finality:,.0f}")
    print(f"ratio Finality / CartPole: {finality / cartpole:.2f}")
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
