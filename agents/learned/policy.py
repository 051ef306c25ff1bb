"""Run any policy over `Finality-v0` observations through the shared runner.

Every model here plays as a `finality_gym.policy.GymPolicy`, which decodes each tool result with
the env's own `ObservationEncoder`, so a policy trained on the env sees, under the grader, exactly
the observations it was trained on.
`load_sb3(path, kind=...)` loads a saved stable-baselines3 model and refuses one trained on other
spaces (another env, other `wait_ticks`) or by an algorithm the spec does not grade: `sb3:PATH`
grades any algorithm of `ALGORITHMS` (`agents/learned/algorithms.py`: every SB3 and sb3-contrib
algorithm with a Discrete action space), `ppo:PATH` only PPO and MaskablePPO, as it always has.
The algorithm is read from the archive, never guessed from the file's name.

A model is loaded as data, never as code, because it runs in the grader's own process: its
archive is read by `agents/learned/sb3_archive.py` (the policy's arguments from the `data` JSON, its
weights as plain tensors) unless `allow_pickle=True`, which loads through SB3's own `load`,
running the archive's pickles: only for files one trusts. A `vecnormalize.pkl` saved with the
model is applied to every observation as SB3 applies it at evaluation, read as data too
(`agents/learned/vecnormalize.py`), whichever loader reads the model.

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
every episode from a fresh state. A model trained on a stack of the last N observations
(Gymnasium's `FrameStackObservation`, `python -m train --frame-stack N`) is given the same
stack, emptied at every episode's start. MaskablePPO is given the env's action masks; the others may
choose a masked action, which the world refuses like any late `ship`.

A network run outside torch (`onnx:`, `agents/learned/onnx_policy.py`) samples as SB3 does with
what is here (`probabilities`, `Exponentials`), and is checked on load on the env's own observations
(`real_steps`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from finality_gym.encoder import DEFAULT_WAITS, ObservationEncoder
from finality_gym.policy import GymPolicy

from .algorithms import ALGORITHMS, Algorithm
from .sb3_archive import built_policy, finality_spaces, read_data, unpickled_model
from .vecnormalize import normalization, normalization_file

__all__ = ["Exponentials", "load_sb3", "normalization_file", "probabilities",
           "real_steps", "sb3_policy"]

Predict = Callable[[np.ndarray, np.ndarray], int]  # GymPolicy's `predict`
MASKED = -1e8  # what MaskablePPO gives a masked action's logit


def load_sb3(path: str | Path, greedy: bool = False, kind: str = "ppo",
             allow_pickle: bool = False) -> GymPolicy:
    """A saved SB3 model as the policy `kind:PATH` names (`ppo` or `sb3`; `-greedy` when
    `greedy`), loaded as data: no pickle of the archive is run (the module docstring says how).
    `allow_pickle=True` loads it with SB3's own `load`, which runs the pickles inside the zip:
    only for files one trusts.

    The model must be a model of Finality's spaces, trained by an algorithm the kind grades
    (`sb3_archive.read_data` says why); what the zip's `data` JSON tells is checked before
    anything else is read, and the policy built is the one the algorithm it names saved."""
    path = Path(path)
    data, algorithm, stack = read_data(path, kind)
    observation = finality_spaces(stack)["observation"]
    normalize = normalization(path, observation.shape)
    try:
        import torch
        cls = algorithm.cls()
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise ImportError("loading a model needs the 'train' extra: pip install -e .[train]") from exc
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    actor = (unpickled_model(path, cls, stack) if allow_pickle
             else built_policy(path, data, cls, stack))
    # One greedy forward pass now (it draws no random number): torch initializes its kernels
    # on the first, and a policy loaded at import then forks its cases with them ready (11 ms
    # less a case here for an outside policy: `benchmarks/outside_policy.py`).
    actor.predict(np.zeros(observation.shape, dtype=np.float32), deterministic=True)
    return _playing(actor, algorithm, f"{kind}{'-greedy' if greedy else ''}:{path}", greedy,
                    normalize)


def sb3_policy(model, name: str, greedy: bool = False) -> GymPolicy:
    """A stable-baselines3 model in memory (a model being trained) as a policy, played as the
    module docstring says: sampled with a per-episode seed, or greedy (always, for an algorithm
    greedy by nature)."""
    return _playing(model, ALGORITHMS[_trained_by(model)], name, greedy)


def _playing(actor, algorithm: Algorithm, name: str, greedy: bool,
             normalize: Callable[[np.ndarray], np.ndarray] | None = None) -> GymPolicy:
    """A model, or the policy `load_sb3` builds, as a policy: both `predict` alike (a model's
    `predict` passes its arguments to its policy's; a Q-learner's adds exploration only when
    not deterministic, and it always is here). `normalize`, if given, is applied to every
    observation first."""
    import torch
    deterministic = greedy or not algorithm.sampled
    seed = None if deterministic else torch.manual_seed
    if algorithm.recurrent:
        memory = _Recurrent(actor, deterministic, seed)
        act, start = memory.predict, memory.start
    elif algorithm.masked:
        def act(obs: np.ndarray, mask: np.ndarray) -> int:
            return int(actor.predict(obs, deterministic=deterministic, action_masks=mask)[0])
        start = seed
    else:
        def act(obs: np.ndarray, mask: np.ndarray) -> int:
            return int(actor.predict(obs, deterministic=deterministic)[0])
        start = seed
    if normalize is not None:
        def act_normalized(obs: np.ndarray, mask: np.ndarray, act=act) -> int:
            return act(normalize(obs), mask)
        act = act_normalized
    shape = actor.observation_space.shape
    if len(shape) == 2:  # a frame-stacked model (`sb3_archive.stack_depth`)
        frames = _Stacked(shape[0], act, start)
        act, start = frames.predict, frames.start
    return GymPolicy(name, act, start=start)


def _trained_by(model) -> str:
    """The algorithm of a model in memory: the nearest class of its lineage that `ALGORITHMS`
    names (a subclass of PPO plays as PPO)."""
    for cls in type(model).__mro__:
        if cls.__name__ in ALGORITHMS and cls.__module__.startswith(
                ALGORITHMS[cls.__name__].package):
            return cls.__name__
    raise ValueError(f"a {type(model).__name__} model is none of the algorithms sb3: grades "
                     f"({', '.join(ALGORITHMS)})")


class _Stacked:
    """The last `depth` observations of the episode, oldest first, as Gymnasium's
    `FrameStackObservation` gives them to a model in training: at the episode's first step its
    first observation fills every place ("reset" padding). Emptied at every episode's start, so
    no observation of another episode is ever stacked."""

    def __init__(self, depth: int, act: Predict, start: Callable[[int], object] | None):
        self.depth = depth
        self.act = act
        self.then = start
        self.frames: np.ndarray | None = None

    def start(self, seed: int) -> None:
        self.frames = None
        if self.then is not None:
            self.then(seed)

    def predict(self, obs: np.ndarray, mask: np.ndarray) -> int:
        if self.frames is None:
            self.frames = np.repeat(obs[None], self.depth, axis=0)
        else:
            self.frames = np.concatenate((self.frames[1:], obs[None]))
        return self.act(self.frames, mask)


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


class Exponentials:
    """The random numbers `torch.multinomial(probs, 1, True)` draws to sample one action (as
    SB3's `Categorical.sample()` calls it): one `exponential_` of a float32 [1, n] tensor from a
    torch generator, the action being the argmax of `probs / draws` (torch's own fast path for a
    single sample). The generator is seeded as `torch.manual_seed(seed)` seeds torch's, so the
    draws are those `sb3:` makes."""

    def __init__(self, n: int):
        try:
            import torch
        except ImportError as exc:
            raise ImportError("onnx:PATH samples with torch's generator, as sb3: does: it needs "
                              "the 'train' extra (pip install -e .[train]); onnx-greedy:PATH "
                              "needs only the 'onnx' extra") from exc
        self.generator = torch.Generator()
        self.tensor = torch.empty((1, n), dtype=torch.float32)
        self.array = self.tensor.numpy()  # the same memory

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def draw(self) -> np.ndarray:
        self.tensor.exponential_(1.0, generator=self.generator)
        return self.array[0]


def probabilities(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """SB3's `Categorical(logits=...)` probabilities, in float32 (`MaskableCategorical`'s, the
    mask applied, when `mask` is given): the logits normalized by their log-sum-exp, masked and
    normalized again, then their softmax."""
    logits = logits - _logsumexp(logits)
    if mask is not None:
        logits = np.where(mask, logits, np.float32(MASKED))
        logits = logits - _logsumexp(logits)
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def _logsumexp(x: np.ndarray) -> np.float32:
    top = x.max()
    return top + np.log(np.exp(x - top).sum())


PROBE_EPISODES = 2  # per probe arm: the episodes a load check plays (`real_steps`)


@lru_cache(maxsize=1)
def real_steps() -> tuple[tuple[np.ndarray, np.ndarray, bool], ...]:
    """(observation, action mask, whether it starts an episode) at every step of
    `PROBE_EPISODES` episodes of the env under each probe arm, from fixed seeds, acting at
    random among the allowed actions and mostly short of a disposition (so that episodes run
    on): what a policy meets when graded, where one checked on zeros alone can hide what it
    does (`agents/learned/onnx_policy.py`'s load check)."""
    from finality_gym.env import FinalityEnv
    from finality_gym.episode import PROBE_ARMS
    from finality_gym.world import DISPOSITIONS
    rng = np.random.default_rng(0)
    final = np.array([tool in DISPOSITIONS for tool, _ in
                      ObservationEncoder(DEFAULT_WAITS).actions])
    steps = []
    for arm in PROBE_ARMS:
        env = FinalityEnv(probe=arm, wait_ticks=DEFAULT_WAITS)
        for seed in range(PROBE_EPISODES):
            obs, _ = env.reset(seed=seed)
            done, first = False, True
            while not done:
                mask = env.action_masks()
                steps.append((obs, mask, first))
                going = mask & ~final if rng.random() < 0.9 and (mask & ~final).any() else mask
                obs, _, ended, cut, _ = env.step(int(rng.choice(np.flatnonzero(going))))
                done, first = ended or cut, False
    return tuple(steps)
