"""Run any policy over `Finality-v0` observations through the shared runner.

`GymPolicy` decodes each tool result with the env's own `ObservationEncoder`, so a policy trained
on the env sees, under the grader, exactly the observations it was trained on.
`load_sb3(path)` loads a saved stable-baselines3 model (PPO, or sb3-contrib's MaskablePPO).
Loading a model unpickles code inside SB3's zip: load only files you trust.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from finality_gym.encoder import DEFAULT_WAITS, ObservationEncoder

from .base import Policy

Predict = Callable[[np.ndarray, np.ndarray], int]


class GymPolicy(Policy):
    """`predict(observation, action_mask) -> action index` behind the policy interface."""

    def __init__(self, name: str, predict: Predict, wait_ticks: tuple[int, ...] = DEFAULT_WAITS):
        self.name = name
        self.predict = predict
        self.encoder = ObservationEncoder(tuple(wait_ticks))

    def plan(self):
        probes_answered = 0
        obs = self.encoder.reset(self.brief.order_value)
        while True:
            mask = self.encoder.masks(self.now, self.brief.probe, probes_answered)
            action = int(self.predict(obs, mask))
            result = yield self.encoder.actions[action]
            if result["tool"] == "probe_processor" and "captures" in result:
                probes_answered += 1
            obs = self.encoder.update(action, result, self.now,
                                      self.brief.budget - self.calls_left)


def load_sb3(path: str | Path) -> GymPolicy:
    """A saved SB3 model as a deterministic policy. Only load files you trust: SB3's zip holds
    pickled code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a stable-baselines3 model (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
        policy_module = data["policy_class"]["__module__"]
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a stable-baselines3 model ({exc!r})") from None
    try:
        import torch
        from sb3_contrib import MaskablePPO
        from stable_baselines3 import PPO
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise ImportError("loading a model needs the 'train' extra: pip install -e .[train]") from exc
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    cls = MaskablePPO if "maskable" in policy_module else PPO
    try:
        model = cls.load(path, device="cpu")
    except Exception as exc:  # a damaged archive fails in many ways deep inside SB3
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {exc!r}") from None
    return sb3_policy(model, f"ppo:{path}")


def sb3_policy(model, name: str) -> GymPolicy:
    """A stable-baselines3 model in memory (PPO or MaskablePPO) as a deterministic policy."""
    from sb3_contrib import MaskablePPO
    masked = isinstance(model, MaskablePPO)

    def predict(obs: np.ndarray, mask: np.ndarray) -> int:
        if masked:
            action, _ = model.predict(obs, deterministic=True, action_masks=mask)
        else:
            action, _ = model.predict(obs, deterministic=True)
        return int(action)

    return GymPolicy(name, predict)
