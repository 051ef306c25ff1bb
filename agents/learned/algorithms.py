"""The stable-baselines3 algorithms the project knows, in one table: every SB3 and sb3-contrib
algorithm that can act in a Discrete action space. The grader plays a saved model of any of them
(`sb3:PATH`, `agents/learned/policy.py`); `python -m train` trains those marked `trained`, under
their snake-case name (`--algo`, a run's `config.json`, its checkpoints' names). It lives here, not
in `train/`, because the grader needs it and never imports the trainer."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its SB3 class (`name`, in `package`) and its snake-case name (`algo`);
    whether `python -m train` trains it and with which of its policies; and how the grader plays
    it: whether its policy is a distribution to sample (an actor-critic's) or greedy by nature (a
    Q-learner's argmax, ARS's), whether it takes the env's action masks, whether it carries a
    recurrent state through an episode, and whether its policy is built with a learning-rate
    schedule (ARS's has no optimizer)."""

    name: str
    algo: str
    package: str
    trained: bool = False
    policy: str = "MlpPolicy"
    sampled: bool = True
    masked: bool = False
    recurrent: bool = False
    scheduled: bool = True

    def cls(self) -> type:
        """The SB3 class (sb3-contrib is imported only when one of its algorithms is asked for)."""
        return getattr(importlib.import_module(self.package), self.name)


# By class name, the name a saved model's algorithm goes by: SB3's own, then sb3-contrib's.
ALGORITHMS = {algorithm.name: algorithm for algorithm in (
    Algorithm("PPO", "ppo", "stable_baselines3", trained=True),
    Algorithm("A2C", "a2c", "stable_baselines3", trained=True),
    Algorithm("DQN", "dqn", "stable_baselines3", trained=True, sampled=False),
    Algorithm("MaskablePPO", "maskable_ppo", "sb3_contrib", trained=True, masked=True),
    Algorithm("RecurrentPPO", "recurrent_ppo", "sb3_contrib", trained=True,
              policy="MlpLstmPolicy", recurrent=True),
    Algorithm("TRPO", "trpo", "sb3_contrib"),
    Algorithm("QRDQN", "qrdqn", "sb3_contrib", sampled=False),
    Algorithm("ARS", "ars", "sb3_contrib", sampled=False, scheduled=False),
)}
# What `ppo:PATH` grades, as it did before `sb3:`; a trained run's best model of any other
# algorithm is graded as `sb3:PATH`.
PPO_ALGORITHMS = ("PPO", "MaskablePPO")
