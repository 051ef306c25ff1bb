"""Run any policy over `Finality-v0` observations through the shared runner.

`GymPolicy` decodes each tool result with the env's own `ObservationEncoder`, so a policy trained
on the env sees, under the grader, exactly the observations it was trained on.
`load_sb3(path, kind=...)` loads a saved stable-baselines3 model and refuses one trained on other
spaces (another env, other `wait_ticks`) or by an algorithm the spec does not grade: `sb3:PATH`
grades any algorithm of `ALGORITHMS` (every SB3 and sb3-contrib algorithm with a Discrete action
space), `ppo:PATH` only PPO and MaskablePPO, as it always has. The algorithm is read from the
archive, never guessed from the file's name. Loading a model unpickles code inside SB3's zip:
load only files you trust.

An actor-critic model (PPO, MaskablePPO, RecurrentPPO, A2C, TRPO) is graded as what it trains: a
stochastic policy. Its actions are sampled, with torch's generator seeded from the brief's seed
at the start of every episode, so an episode's actions depend only on (task, seed), whatever ran
before it or in which process, and the two halves of a twin pair sample alike before `t_det`.
`greedy=True` takes the most likely action instead (`sb3-greedy:PATH`, `ppo-greedy:PATH`); in
this partially observed world the greedy policy of a trained model can be much worse than the
policy itself (see the README). DQN, QR-DQN and ARS are greedy by nature and act greedily under
both specs: a Q-learner's policy is the argmax of its values (SB3's `predict(deterministic=False)`
adds epsilon-greedy exploration, a training device drawn from numpy's global generator rather
than torch's, so it would be neither the learned policy nor reproducible) and ARS's Discrete
policy is an argmax. RecurrentPPO keeps its LSTM state from step to step of an episode and starts
every episode from a fresh state. MaskablePPO is given the env's action masks; the others may
choose a masked action, which the world refuses like any late `ship`.
"""

from __future__ import annotations

import importlib
import json
import zipfile
from dataclasses import dataclass
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
    `start(seed)`, if given, runs at the start of every episode (to seed a sampler, to reset a
    recurrent state)."""

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


@dataclass(frozen=True)
class Algorithm:
    """How the grader plays one stable-baselines3 algorithm: the package its class lives in,
    whether its policy is a distribution to sample (an actor-critic's) or greedy by nature (a
    Q-learner's argmax, ARS's), whether it takes the env's action masks, and whether it carries
    a recurrent state through an episode."""

    package: str
    sampled: bool = True
    masked: bool = False
    recurrent: bool = False


# Every SB3 and sb3-contrib algorithm that can act in a Discrete action space, by class name.
ALGORITHMS = {
    "PPO": Algorithm("stable_baselines3"),
    "A2C": Algorithm("stable_baselines3"),
    "DQN": Algorithm("stable_baselines3", sampled=False),
    "MaskablePPO": Algorithm("sb3_contrib", masked=True),
    "RecurrentPPO": Algorithm("sb3_contrib", recurrent=True),
    "TRPO": Algorithm("sb3_contrib"),
    "QRDQN": Algorithm("sb3_contrib", sampled=False),
    "ARS": Algorithm("sb3_contrib", sampled=False),
}
PPO_ALGORITHMS = ("PPO", "MaskablePPO")  # what `ppo:PATH` grades, as it did before `sb3:`


def load_sb3(path: str | Path, greedy: bool = False, kind: str = "ppo") -> GymPolicy:
    """A saved SB3 model as the policy `kind:PATH` names (`ppo` or `sb3`; `-greedy` when
    `greedy`). Only load files you trust: SB3's zip holds pickled code.

    The model must be a model of Finality's observation and action spaces, trained by an algorithm
    the kind grades (`ppo`: PPO or MaskablePPO; `sb3`: any of `ALGORITHMS`): the adapter feeds
    it Finality's observations and reads its actions through Finality's action table, so a
    model of another env or `wait_ticks` would be graded as a policy it is not (or fail deep in
    a worker). The algorithm is the one the archive names, so the class that loads it is the
    class that saved it. What the zip's `data` JSON tells is checked before any pickle is
    loaded; the loaded spaces are compared in full after."""
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
    if kind == "ppo" and algorithm not in PPO_ALGORITHMS:
        hint = f": grade it with sb3:{path}" if algorithm in ALGORITHMS else ""
        raise ValueError(f"{path} was trained by {algorithm}, not PPO or MaskablePPO{hint}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{path} was trained by {algorithm}, not one sb3: grades "
                         f"({', '.join(ALGORITHMS)})")
    expected = _finality_spaces()
    for space, why in (("observation", ""), ("action", f" (wait_ticks {DEFAULT_WAITS})")):
        if saved[space] != _space_summary(expected[space]):
            raise ValueError(f"{path} was trained with {space} space {saved[space]}; Finality's "
                             f"is {_space_summary(expected[space])}{why}")
    try:
        import torch
        cls = getattr(importlib.import_module(ALGORITHMS[algorithm].package), algorithm)
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise ImportError("loading a model needs the 'train' extra: pip install -e .[train]") from exc
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    try:
        model = cls.load(path, device="cpu")
    except Exception as exc:  # a damaged archive fails in many ways deep inside SB3
        raise ValueError(f"{path} could not be loaded as {algorithm}: {exc!r}") from None
    for space, actual in (("observation", model.observation_space),
                          ("action", model.action_space)):
        if actual != expected[space]:
            raise ValueError(f"{path} was trained with {space} space bounds other than "
                             f"Finality's {_space_summary(expected[space])}")
    # One greedy forward pass now (it draws no random number): torch initializes its kernels
    # on the first, and a policy loaded at import then forks its cases with them ready (11 ms
    # less a case here for an outside policy: `benchmarks/outside_policy.py`).
    model.predict(np.zeros(expected["observation"].shape, dtype=np.float32), deterministic=True)
    return sb3_policy(model, f"{kind}{'-greedy' if greedy else ''}:{path}", greedy)


# The algorithm behind each policy module that only one algorithm saves.
_POLICY_MODULES = {
    "sb3_contrib.common.maskable.policies": "MaskablePPO",
    "sb3_contrib.common.recurrent.policies": "RecurrentPPO",
    "stable_baselines3.dqn.policies": "DQN",
    "sb3_contrib.qrdqn.policies": "QRDQN",
    "sb3_contrib.ars.policies": "ARS",
}


def _algorithm(data: dict) -> str:
    """The algorithm that saved a model, from its `data` JSON. SB3 saves the policy class, not the
    algorithm; most algorithms have a policy module of their own, but PPO, A2C and sb3-contrib's
    TRPO share `ActorCriticPolicy`: of the three only PPO saves a `clip_range`, only TRPO a
    `cg_max_steps`."""
    module = data["policy_class"]["__module__"]
    if module == "stable_baselines3.common.policies":
        return "PPO" if "clip_range" in data else "TRPO" if "cg_max_steps" in data else "A2C"
    return _POLICY_MODULES.get(module, f"an algorithm with a {module} policy")


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
    """A stable-baselines3 model in memory as a policy, played as the module docstring says:
    sampled with a per-episode seed, or greedy (always, for an algorithm greedy by nature)."""
    import torch
    algorithm = ALGORITHMS[_trained_by(model)]
    deterministic = greedy or not algorithm.sampled
    seed = None if deterministic else torch.manual_seed
    if algorithm.recurrent:
        memory = _Recurrent(model, deterministic, seed)
        return GymPolicy(name, memory.predict, start=memory.start)
    if algorithm.masked:
        def predict(obs: np.ndarray, mask: np.ndarray) -> int:
            return int(model.predict(obs, deterministic=deterministic, action_masks=mask)[0])
    else:
        def predict(obs: np.ndarray, mask: np.ndarray) -> int:
            return int(model.predict(obs, deterministic=deterministic)[0])
    return GymPolicy(name, predict, start=seed)


def _trained_by(model) -> str:
    """The algorithm of a model in memory: the nearest class of its lineage that `ALGORITHMS`
    names (a subclass of PPO plays as PPO)."""
    for cls in type(model).__mro__:
        if cls.__name__ in ALGORITHMS and cls.__module__.startswith(
                ALGORITHMS[cls.__name__].package):
            return cls.__name__
    raise ValueError(f"a {type(model).__name__} model is none of the algorithms sb3: grades "
                     f"({', '.join(ALGORITHMS)})")


class _Recurrent:
    """RecurrentPPO's LSTM state, carried from each step of an episode to the next and dropped at
    the start of every episode (a zero state, `episode_start` set at the first step, as SB3
    evaluates it), so an episode's actions never depend on the episode a worker graded before."""

    _FIRST, _LATER = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)

    def __init__(self, model, deterministic: bool, seed: Callable[[int], object] | None):
        self.model = model
        self.deterministic = deterministic
        self.seed = seed
        self.state = None
        self.episode_start = self._FIRST

    def start(self, seed: int) -> None:
        self.state = None
        self.episode_start = self._FIRST
        if self.seed is not None:
            self.seed(seed)

    def predict(self, obs: np.ndarray, mask: np.ndarray) -> int:
        action, self.state = self.model.predict(obs, state=self.state,
                                                episode_start=self.episode_start,
                                                deterministic=self.deterministic)
        self.episode_start = self._LATER
        return int(action)
