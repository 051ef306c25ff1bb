"""Run any policy over `Finality-v0` observations through the shared runner.

`GymPolicy` decodes each tool result with the env's own `ObservationEncoder`, so a policy trained
on the env sees, under the grader, exactly the observations it was trained on.
`load_sb3(path)` loads a saved stable-baselines3 model (PPO, or sb3-contrib's MaskablePPO) and
refuses one of another algorithm or trained on other spaces (another env, other `wait_ticks`).
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
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from gymnasium.spaces import Discrete

from finality_gym.encoder import DEFAULT_WAITS, ObservationEncoder
from finality_gym.env import FinalityEnv

from finality_gym.policy import Policy

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
    """A saved SB3 model as a policy. Only load files you trust: SB3's zip holds pickled code.

    The model must be a PPO or MaskablePPO model of Finality's observation and action spaces:
    the adapter feeds it Finality's observations and reads its actions through Finality's action
    table, so a model of another algorithm, env or `wait_ticks` would be graded as a policy it
    is not (or fail deep in a worker). What the zip's `data` JSON tells is checked before any
    pickle is loaded; the loaded spaces are compared in full after."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a stable-baselines3 model (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
        algorithm = _algorithm(data)
        saved = {"observation": _saved_space(data["observation_space"]),
                 "action": _saved_space(data["action_space"])}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a stable-baselines3 model ({exc!r})") from None
    if algorithm not in ("PPO", "MaskablePPO"):
        raise ValueError(f"{path} was trained by {algorithm}, not PPO or MaskablePPO")
    expected = _finality_spaces()
    for kind, why in (("observation", ""), ("action", f" (wait_ticks {DEFAULT_WAITS})")):
        if saved[kind] != _space_summary(expected[kind]):
            raise ValueError(f"{path} was trained with {kind} space {saved[kind]}; Finality's is "
                             f"{_space_summary(expected[kind])}{why}")
    try:
        import torch
        from sb3_contrib import MaskablePPO
        from stable_baselines3 import PPO
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise ImportError("loading a model needs the 'train' extra: pip install -e .[train]") from exc
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    cls = MaskablePPO if algorithm == "MaskablePPO" else PPO
    try:
        model = cls.load(path, device="cpu")
    except Exception as exc:  # a damaged archive fails in many ways deep inside SB3
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {exc!r}") from None
    for kind, space in (("observation", model.observation_space), ("action", model.action_space)):
        if space != expected[kind]:
            raise ValueError(f"{path} was trained with {kind} space bounds other than Finality's "
                             f"{_space_summary(expected[kind])}")
    return sb3_policy(model, f"ppo{'-greedy' if greedy else ''}:{path}", greedy)


def _algorithm(data: dict) -> str:
    """The algorithm that saved a model, from its `data` JSON. SB3 saves the policy class, not the
    algorithm, and PPO, A2C and sb3-contrib's TRPO share `ActorCriticPolicy`: of the three only
    PPO saves a `clip_range`, only TRPO a `cg_max_steps`. MaskablePPO has its own policy class."""
    module = data["policy_class"]["__module__"]
    if module == "sb3_contrib.common.maskable.policies":
        return "MaskablePPO"
    if module == "stable_baselines3.common.policies":
        return "PPO" if "clip_range" in data else "TRPO" if "cg_max_steps" in data else "A2C"
    return f"an algorithm with a {module} policy"


def _saved_space(entry: dict) -> str:
    """A space as `_space_summary` puts it, from the plain fields SB3 writes next to its pickle."""
    kind = entry[":type:"].rsplit(".", 1)[-1].rstrip("'>")
    if kind == "Discrete":
        return f"Discrete({int(entry['n'])})"
    return f"{kind}(shape {tuple(entry.get('_shape') or ())}, {entry.get('dtype')})"


def _space_summary(space) -> str:
    """A space's type and size, short enough for a one-line error (a Box's repr prints its
    bounds, 58 of each for Finality's)."""
    if isinstance(space, Discrete):
        return f"Discrete({int(space.n)})"
    return f"{type(space).__name__}(shape {space.shape}, {space.dtype})"


@lru_cache(maxsize=1)
def _finality_spaces() -> dict:
    """The observation and action spaces of `Finality-v0` with the default waits, the ones this
    adapter encodes (every probe arm shares them)."""
    env = FinalityEnv(wait_ticks=DEFAULT_WAITS)
    return {"observation": env.observation_space, "action": env.action_space}


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
