"""`RelativeGap`: the training reward (`FinalityEnv`'s `reward="relative"`: minus the gap over
the order value) as a wrapper, for trainers that take a wrapper class rather than env arguments
(RL Baselines3 Zoo's `env_wrapper: finality_gym.wrappers.RelativeGap`). Anywhere env arguments
reach the env, `gym.make(id, reward="relative")` (or `gym.make_vec`) is the same reward.
"""

from __future__ import annotations

import gymnasium as gym

from .env import relative_reward


class RelativeGap(gym.Wrapper):
    """The ended episode's reward becomes `relative_reward(gap, order_value)`, read from the
    env's info; every other step's stays 0."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info["ended"]:
            reward = relative_reward(int(info["gap"]), int(info["order_value"]))
        return obs, reward, terminated, truncated, info
