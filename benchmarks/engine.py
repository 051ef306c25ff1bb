"""Engine speed: tool calls per second under a uniformly random policy, constructions included,
measured in the same run as Gymnasium's CartPole-v1 steps per second; prints the ratio.

    .venv/bin/python benchmarks/engine.py [--seconds 3]

The random policy is `random` (docs/world.md section 9) (a uniformly random tool, wait from {10, 30, 60, 120}, a
random key). Each episode is built fresh over the public corpus's tasks with seeds 0..4 and ends
with its record, as the grader would take it.
"""

from __future__ import annotations

import argparse
import random
import time

from env import Stepper  # benchmarks/env.py: the same CartPole measurement

import finality_gym
from finality_gym.episode import TOOLS

WAITS = (10, 30, 60, 120)
KEYS = ("original", "fresh")


def engine_calls_per_second(seconds: float) -> float:
    tasks = finality_gym.load_corpus("public").tasks
    rng = random.Random(0)
    choice = rng.choice
    calls = 0
    episodes = 0
    start = time.perf_counter()
    while True:
        for i in range(1000):
            ep = finality_gym.Episode(tasks[(episodes + i) % len(tasks)], seed=i % 5)
            while not ep.done:
                tool = choice(TOOLS)
                if tool == "wait":
                    ep.call(tool, ticks=choice(WAITS))
                elif tool == "retry_capture":
                    ep.call(tool, key=choice(KEYS))
                else:
                    ep.call(tool)
                calls += 1
            ep.record()
        episodes += 1000
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    cartpole = Stepper("CartPole-v1").block(args.seconds)
    engine = engine_calls_per_second(args.seconds)
    print(f"CartPole-v1 steps/s (gym.make, action_space.sample()): {cartpole:,.0f}")
    print(f"finality engine tool calls/s (random policy, constructions and records included): "
          f"{engine:,.0f}")
    print(f"ratio engine / CartPole: {engine / cartpole:.2f}")


if __name__ == "__main__":
    main()
