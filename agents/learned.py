"""Run any policy over `Finality-v0` observations through the shared runner.

`GymPolicy` decodes each tool result with the env's own `ObservationEncoder`, so a policy trained
on the env sees, under the grader, exactly the observations it was trained on.
`load_sb3(path)` loads a saved stable-baselines3 model (PPO, or sb3-contrib's MaskablePPO).
Loading a model unpickles code inside SB3's zip: load only files you trust.

A PPO policy is graded as what PPO trains: a stochastic policy. Its actions are sampled, with
torch's generator seeded from the brief's seed at the start of every episode, so an episode's
actions depend only on (task, seed), whatever ran before it or in which process, and the two
halves of a twin pair sample alike before `t_det`. `greedy=True` takes the most likely action
instead (the `ppo-greedy:PATH` spec); in this partially observed world the greedy policy of a
trained model can be much worse than the policy itself (see the README).
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
    """`predict(observation, action_mask) -> action index` behind the policy interface;
    `start(seed)`, if given, runs at the start of every episode (to seed a sampler)."""

    def __init__(self, name: str, predict: Predict, wait_ticks: tuple[int, ...] = DEFAULT_WAITS,
                 start: Callable[[int], object] | None = None):
        self.name = name
        self.predict = predict
        self.start = start
        self.encoder = ObservationEncoder(tuple(wait_ticks))

    def plan(self):
        if self.start is not None:
            self.start(self.brief.seed)
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


def load_sb3(path: str | Path, greedy: bool = False) -> GymPolicy:
    """A saved SB3 model as a policy. Only load files you trust: SB3's zip holds pickled code."""
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
    return sb3_policy(model, f"ppo{'-greedy' if greedy else ''}:{path}", greedy)


def sb3_policy(model, name: str, greedy: bool = False) -> GymPolicy:
    """A stable-baselines3 model in memory (PPO or MaskablePPO) as a policy: sampled with a
    per-episode seed, or greedy."""
    import torch
    from sb3_contrib import MaskablePPO
    masked = isinstance(model, MaskablePPO)

    def predict(obs: np.ndarray, mask: np.ndarray) -> int:
        if masked:
            action, _ = model.predict(obs, deterministic=greedy, action_masks=mask)
        else:
            action, _ = model.predict(obs, deterministic=greedy)
        return int(action)

    return GymPolicy(name, predict, start=None if greedy else torch.manual_seed)
