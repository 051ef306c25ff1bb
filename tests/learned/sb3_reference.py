"""A saved SB3 model played by SB3 itself, as the reference `sb3:` grading must agree with: the
model's own `predict` through `gym.make("Finality-v0")`, torch seeded from the brief at the start
of the episode as `sb3:` seeds it."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.wrappers import FrameStackObservation
import torch

from finality_gym import load_corpus
from finality_gym.episode import Episode
from finality_gym.policy import brief_for

PUBLIC = load_corpus("public")


def played(model, task_id: str, seed: int, greedy: bool = False, normalize=None,
           frame_stack: int = 1) -> Episode:
    """The ended episode of `model` on a public task; observations through `normalize` (a
    VecNormalize's `normalize_obs`, say) if given, stacked by Gymnasium's
    `FrameStackObservation` if `frame_stack` > 1."""
    env = gym.make("Finality-v0")
    if frame_stack > 1:
        env = FrameStackObservation(env, frame_stack)
    obs, _ = env.reset(options={"task_id": task_id, "fault_seed": seed})
    torch.manual_seed(brief_for(PUBLIC.task(task_id), seed, "full").seed)
    done = False
    while not done:
        action, _ = model.predict(obs if normalize is None else normalize(obs),
                                  deterministic=greedy)
        obs, _, terminated, truncated, _ = env.step(int(action))
        done = terminated or truncated
    return env.unwrapped.episode
