"""Run any policy over `Finality-v0` observations through the shared runner.

`GymPolicy` decodes each tool result with the env's own `ObservationEncoder`, so a policy trained
on the env sees, under the grader, exactly the observations it was trained on.
`load_sb3(path, kind=...)` loads a saved stable-baselines3 model and refuses one trained on other
spaces (another env, other `wait_ticks`) or by an algorithm the spec does not grade: `sb3:PATH`
grades any algorithm of `ALGORITHMS` (every SB3 and sb3-contrib algorithm with a Discrete action
space), `ppo:PATH` only PPO and MaskablePPO, as it always has. The algorithm is read from the
archive, never guessed from the file's name.

A model is loaded as data, never as code, because it runs in the grader's own process: SB3's
`load` unpickles fields of the zip's `data` (a pickle there runs whatever it names, with the
grader's rights), while acting needs only the policy's weights and its shape. So the algorithm,
the policy class (one of the algorithm's own, by name), the spaces (Finality's, once the plain
fields SB3 writes beside its pickles match them) and the policy's arguments are read from that
JSON, never from a pickle; the weights come from `policy.pth` through
`torch.load(weights_only=True)`, which refuses anything but tensors; the optimizer's state and
the training-time fields are never read. An argument SB3 kept only as a pickle (a custom
features extractor, an activation outside a short list of torch's) is refused by name. The
policy so built predicts exactly as the model SB3 loads: a model's `predict` is its policy's.
`allow_pickle=True` loads through SB3's own `load` instead, running the archive's pickles: only
for files one trusts. A `vecnormalize.pkl` saved with the model (beside it, or where RL
Baselines3 Zoo writes it, `<folder>/<env id>/vecnormalize.pkl`) is applied to every observation
as SB3's `VecNormalize.normalize_obs` applies it at evaluation; it is a pickle too, read by an
unpickler that records what the file names, calls nothing and rebuilds only arrays of plain
numbers (`_Recorder`), whichever loader reads the model.

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
import io
import json
import pickle
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from gymnasium.spaces import Discrete

from finality_gym.encoder import DEFAULT_WAITS, ObservationEncoder
from finality_gym.env import FinalityEnv
from finality_gym.registration import ENV_IDS

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
    Q-learner's argmax, ARS's), whether it takes the env's action masks, whether it carries
    a recurrent state through an episode, and whether its policy is built with a learning-rate
    schedule (ARS's has no optimizer)."""

    package: str
    sampled: bool = True
    masked: bool = False
    recurrent: bool = False
    scheduled: bool = True


# Every SB3 and sb3-contrib algorithm that can act in a Discrete action space, by class name.
ALGORITHMS = {
    "PPO": Algorithm("stable_baselines3"),
    "A2C": Algorithm("stable_baselines3"),
    "DQN": Algorithm("stable_baselines3", sampled=False),
    "MaskablePPO": Algorithm("sb3_contrib", masked=True),
    "RecurrentPPO": Algorithm("sb3_contrib", recurrent=True),
    "TRPO": Algorithm("sb3_contrib"),
    "QRDQN": Algorithm("sb3_contrib", sampled=False),
    "ARS": Algorithm("sb3_contrib", sampled=False, scheduled=False),
}
PPO_ALGORITHMS = ("PPO", "MaskablePPO")  # what `ppo:PATH` grades, as it did before `sb3:`


def load_sb3(path: str | Path, greedy: bool = False, kind: str = "ppo",
             allow_pickle: bool = False) -> GymPolicy:
    """A saved SB3 model as the policy `kind:PATH` names (`ppo` or `sb3`; `-greedy` when
    `greedy`), loaded as data: no pickle of the archive is run (the module docstring says how).
    `allow_pickle=True` loads it with SB3's own `load`, which runs the pickles inside the zip:
    only for files one trusts.

    The model must be a model of Finality's observation and action spaces, trained by an algorithm
    the kind grades (`ppo`: PPO or MaskablePPO; `sb3`: any of `ALGORITHMS`): the adapter feeds
    it Finality's observations and reads its actions through Finality's action table, so a
    model of another env or `wait_ticks` would be graded as a policy it is not (or fail deep in
    a worker). The algorithm is the one the archive names, so the policy built is the one that
    algorithm saved. What the zip's `data` JSON tells is checked before anything else is read."""
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
    if not _same_bounds(data["observation_space"], expected["observation"]):
        raise _other_bounds(path, "observation", expected)
    normalize = _normalization(path)
    try:
        import torch
        cls = getattr(importlib.import_module(ALGORITHMS[algorithm].package), algorithm)
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise ImportError("loading a model needs the 'train' extra: pip install -e .[train]") from exc
    torch.set_num_threads(1)  # one small forward pass per step: threads only add overhead
    if allow_pickle:
        actor = _unpickled(path, cls, expected)
    else:
        actor = _built(path, data, cls, expected)
    # One greedy forward pass now (it draws no random number): torch initializes its kernels
    # on the first, and a policy loaded at import then forks its cases with them ready (11 ms
    # less a case here for an outside policy: `benchmarks/outside_policy.py`).
    actor.predict(np.zeros(expected["observation"].shape, dtype=np.float32), deterministic=True)
    return _playing(actor, ALGORITHMS[algorithm], f"{kind}{'-greedy' if greedy else ''}:{path}",
                    greedy, normalize)


def _unpickled(path: Path, cls, expected: dict):
    """The model as SB3's own `load` makes it, running the archive's pickles; the spaces it
    unpickles are compared in full."""
    try:  # trusted by the operator: only with allow_pickle (--trust-pickles, never private)
        model = cls.load(path, device="cpu")
    except Exception as exc:  # a damaged archive fails in many ways deep inside SB3
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {exc!r}") from None
    for space, actual in (("observation", model.observation_space),
                          ("action", model.action_space)):
        if actual != expected[space]:
            raise _other_bounds(path, space, expected)
    return model


def _other_bounds(path: Path, space: str, expected: dict) -> ValueError:
    return ValueError(f"{path} was trained with {space} space bounds other than Finality's "
                      f"{_space_summary(expected[space])}")


def _built(path: Path, data: dict, cls, expected: dict):
    """The archive's policy, built by the project: the algorithm's own policy class, on
    Finality's spaces, with the arguments `data` holds as JSON, and the weights of `policy.pth`
    loaded strictly (every tensor the policy has, no other), in evaluation mode. This is what
    SB3's `load` builds for acting: it constructs the policy from the same class, spaces and
    arguments (the spaces checked equal, the optimizer's arguments aside) and loads the same
    state dict into it."""
    import torch
    policy_class = _policy_class(path, data["policy_class"], cls)
    arguments = _policy_arguments(path, data.get("policy_kwargs") or {})
    schedule = (_no_learning,) if ALGORITHMS[cls.__name__].scheduled else ()
    try:
        with zipfile.ZipFile(path) as archive:
            weights = archive.read("policy.pth")
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = re.search(r"WeightsUnpickler error:\s*([^\n]*)", str(exc))
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: its policy.pth is not "
                         f"plain tensors ({reason.group(1) if reason else exc})") from None
    except Exception as exc:
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {exc!r}") from None
    try:
        policy = policy_class(expected["observation"], expected["action"], *schedule, **arguments)
        policy.load_state_dict(state, strict=True)
    except Exception as exc:  # arguments the class does not take, weights of another shape
        reason = " ".join(str(exc).split())
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {reason}") from None
    policy.set_training_mode(False)
    return policy


def _no_learning(_progress: float) -> float:
    """The learning rate of a policy built to act: its optimizer is never stepped."""
    return 0.0


def _policy_class(path: Path, entry: dict, cls) -> type:
    """The policy class an archive names, found among the algorithm's own (`cls.policy_aliases`:
    `MlpPolicy`, `LinearPolicy`, ...) by the module and class name SB3 writes beside its pickle:
    the module in `__module__`, the class in the text of each method it defines
    (`"__init__": "<function ActorCriticPolicy.__init__ at 0x...>"`)."""
    module = entry.get("__module__")
    owners = {found.group(1) for key, text in entry.items() if isinstance(text, str)
              for found in [re.search(rf"<function ([\w.]+)\.{re.escape(key)} at 0x", text)]
              if found}
    for policy in cls.policy_aliases.values():
        if owners == {policy.__qualname__} and policy.__module__ == module:
            return policy
    named = f"{module}.{'/'.join(sorted(owners)) or '?'}"
    raise ValueError(f"{path} has the policy class {named}, none of {cls.__name__}'s "
                     f"({', '.join(cls.policy_aliases)})")


# Policy arguments acting does not use: the optimizer's (its state is never loaded, it is never
# stepped; the policy builds its default one) and the device (SB3's `load` drops it too).
_UNUSED_ARGUMENTS = ("optimizer_class", "optimizer_kwargs", "device")
# Activations a policy may be built with (SB3 keeps `activation_fn` only as a pickle, with the
# class's text beside it): torch's own, without parameters or arguments.
_ACTIVATIONS = ("ReLU", "Tanh", "ELU", "LeakyReLU", "SELU", "CELU", "GELU", "SiLU", "Mish",
                "Sigmoid", "Softplus", "Softsign", "Hardtanh", "Hardswish", "Tanhshrink")


def _policy_arguments(path: Path, entry: dict) -> dict:
    """The policy's arguments (`policy_kwargs`) from what SB3 writes as JSON: the dict itself
    when it is JSON, else, beside its pickle, each item that is JSON and the text of each that
    is not. A class is rebuilt from its text when it is one of torch's activations or SB3's
    `FlattenExtractor` (the default of every policy `sb3:` grades); any other item kept only as
    a pickle is refused by name. Like SB3's `load`, it reads the `net_arch` of SB3 < 1.8 (a
    list holding one dict) as that dict."""
    import torch
    from stable_baselines3.common.torch_layers import FlattenExtractor
    classes = {"activation_fn": [getattr(torch.nn, name) for name in _ACTIVATIONS],
               "features_extractor_class": [FlattenExtractor]}
    if not isinstance(entry, dict):
        raise ValueError(f"{path}'s policy_kwargs is not a JSON object")
    if ":serialized:" in entry and entry.get(":type:") != str(dict):
        raise ValueError(f"{path}'s policy_kwargs is a {entry.get(':type:')}, saved only as a "
                         "pickle, which the grader does not load")
    arguments = {}
    for key, value in entry.items():
        if key in (":type:", ":serialized:") or key in _UNUSED_ARGUMENTS:
            continue
        if key in classes:
            known = {str(c): c for c in classes[key]}
            if value not in known:
                raise ValueError(f"{path}'s policy_kwargs {key!r} is {value}, saved only as a "
                                 "pickle, which the grader does not load; it rebuilds "
                                 f"{', '.join(c.__name__ for c in classes[key])}")
            arguments[key] = known[value]
        elif isinstance(value, str):  # no policy argument is a string: this is a pickle's text
            raise ValueError(f"{path}'s policy_kwargs {key!r} ({value}) is saved only as a "
                             "pickle, which the grader does not load")
        else:
            arguments[key] = value
    net_arch = arguments.get("net_arch")
    if isinstance(net_arch, list) and net_arch and isinstance(net_arch[0], dict):
        arguments["net_arch"] = net_arch[0]
    return arguments


def normalization_file(path: Path) -> Path | None:
    """The `vecnormalize.pkl` saved with a model archive, if any: beside it, or where RL
    Baselines3 Zoo writes it, in a folder named for the env id beside the model. Two are one too
    many: which one the model was trained with cannot be told."""
    found = [file for file in (path.parent / "vecnormalize.pkl",
                               *(path.parent / env_id / "vecnormalize.pkl" for env_id in ENV_IDS))
             if file.is_file()]
    if len(found) > 1:
        raise ValueError(f"{path} has {len(found)} observation normalizations saved with it "
                         f"({', '.join(map(str, found))}): keep only the one it was trained with")
    return found[0] if found else None


_VEC_NORMALIZE = ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize")
_RUNNING_MEAN_STD = ("stable_baselines3.common.running_mean_std", "RunningMeanStd")


def _normalization(path: Path) -> Callable[[np.ndarray], np.ndarray] | None:
    """The observation normalization of the `vecnormalize.pkl` saved with a model, if any, as
    `VecNormalize.normalize_obs` computes it when the model is evaluated (statistics frozen;
    rewards are not the policy's input): `(obs - mean) / sqrt(var + epsilon)` in float64,
    clipped to `clip_obs`, cast to float32. Read with `_Recorder`: no code of the file runs."""
    file = normalization_file(path)
    if file is None:
        return None
    try:
        with open(file, "rb") as handle:
            saved = _Recorder(handle).load()
        if _where(saved) != _VEC_NORMALIZE:
            raise ValueError(f"it holds {_named(saved)}")
        state = saved.state
        if not state["norm_obs"]:
            return None
        stats = state["obs_rms"]
        if _where(stats) != _RUNNING_MEAN_STD:
            raise ValueError("its obs_rms is not one RunningMeanStd")
        mean, var = _array(stats.state["mean"]), _array(stats.state["var"])
        epsilon, clip = _number(state["epsilon"]), _number(state["clip_obs"])
    except Exception as exc:  # whatever a damaged or foreign file makes the reader meet
        raise ValueError(f"{file} (saved with {path}) is not a VecNormalize of stable-baselines3 "
                         f"read as data ({exc})") from None
    shape = _finality_spaces()["observation"].shape
    if mean.shape != shape or var.shape != shape or mean.dtype.kind != "f" or var.dtype.kind != "f":
        raise ValueError(f"{file} (saved with {path}) normalizes observations of shape "
                         f"{mean.shape}, not Finality's {shape}")
    scale = np.sqrt(var + epsilon)

    def normalize(obs: np.ndarray) -> np.ndarray:
        return np.clip((obs - mean) / scale, -clip, clip).astype(np.float32)
    return normalize


class _Recorded:
    """What a pickle names (a class or function, as `(module, name)` in `where`) and each object
    it asks to build from one, kept as inert data: the arguments and the state it gives are
    stored, nothing is imported or called."""

    __slots__ = ("args", "state")
    where: tuple[str, str] = ("", "")

    def __new__(cls, *args, **kwargs):
        record = super().__new__(cls)
        record.args, record.state = args, None
        return record

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state) -> None:
        self.state = state


class _Recorder(pickle.Unpickler):
    """An unpickler that runs nothing: every global a pickle names (`find_class`, the only way a
    pickle reaches code) is a fresh subclass of `_Recorded`, so building an object, calling a
    function or setting a state only records it. What comes out is made of Python's plain
    values and records; `_array` and `_number` rebuild numpy's from their bytes."""

    def __init__(self, file):
        super().__init__(file)
        self.named: dict = {}

    def find_class(self, module: str, name: str) -> type:
        key = (module, name)
        if key not in self.named:
            self.named[key] = type("Recorded", (_Recorded,), {"__slots__": (), "where": key})
        return self.named[key]


def _where(value) -> tuple[str, str] | None:
    """The global a value read by `_Recorder` records (a class it names, or an object built
    from one), or None for Python's plain values."""
    recorded = value if isinstance(value, type) else type(value)
    return recorded.where if issubclass(recorded, _Recorded) else None


def _named(value) -> str:
    """What a value read from a pickle is, in an error: the global it records, or its type."""
    where = _where(value)
    return f"a {'.'.join(where)}" if where else f"a {type(value).__name__}"


# numpy's picklers, in numpy 1 (`numpy.core`) and numpy 2 (`numpy._core`), and the plain dtypes
# an array is rebuilt with (never an object dtype: its items would be pointers).
_RECONSTRUCT = {(f"{core}.multiarray", "_reconstruct") for core in ("numpy.core", "numpy._core")}
_FROMBUFFER = {(f"{core}.numeric", "_frombuffer") for core in ("numpy.core", "numpy._core")}
_SCALAR = {(f"{core}.multiarray", "scalar") for core in ("numpy.core", "numpy._core")}
_DTYPES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")


def _array(value) -> np.ndarray:
    """A numpy array or scalar a pickle recorded, rebuilt from its bytes: `_reconstruct` with
    the state `ndarray.__setstate__` would get (protocol 2 to 4), `_frombuffer` (protocol 5) or
    `scalar`."""
    where = _where(value)
    if where in _RECONSTRUCT and _where(value.args[0]) == ("numpy", "ndarray"):
        _version, shape, dtype, fortran, raw = value.state
        return _from_bytes(raw, dtype, shape, "F" if fortran else "C")
    if where in _FROMBUFFER:
        raw, dtype, shape, order = value.args
        return _from_bytes(raw, dtype, shape, order)
    if where in _SCALAR:
        dtype, raw = value.args
        return _from_bytes(raw, dtype, (), "C")[()]
    raise ValueError(f"{_named(value)} where a numpy array belongs")


def _from_bytes(raw, dtype, shape, order: str) -> np.ndarray:
    if _where(dtype) != ("numpy", "dtype") or dtype.args[0] not in _DTYPES:
        raise ValueError("an array of a dtype other than a plain number's")
    order_mark = dtype.state[1] if dtype.state else "="
    if order_mark not in {"<", ">", "|", "="}:
        raise ValueError("an array of no byte order")
    if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError("an array of no shape")
    typed = np.dtype(dtype.args[0]).newbyteorder(order_mark)
    return np.frombuffer(_bytes(raw), dtype=typed).reshape(shape, order=order).copy()


def _bytes(value) -> bytes:
    """Bytes a pickle holds: as they are, or as protocols 0 to 2 write them, a call of
    `_codecs.encode(text, "latin1")` (done here, on the text)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if _where(value) == ("_codecs", "encode") and value.args[1:] == ("latin1",) \
            and isinstance(value.args[0], str):
        return value.args[0].encode("latin1")
    raise ValueError("an array without its bytes")


def _number(value):
    """A number a pickle holds: a Python one as it is, numpy's scalar rebuilt."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return _array(value)


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
        start = int(entry.get("start") or 0)
        return f"Discrete({int(entry['n'])}{f', start {start}' if start else ''})"
    return f"{kind}(shape {tuple(entry.get('_shape') or ())}, {entry.get('dtype')})"


def _space_summary(space) -> str:
    """A space's type and size, short enough for a one-line error (a Box's repr prints its
    bounds, 58 of each for Finality's)."""
    if isinstance(space, Discrete):
        start = int(space.start)
        return f"Discrete({int(space.n)}{f', start {start}' if start else ''})"
    return f"{type(space).__name__}(shape {space.shape}, {space.dtype})"


def _same_bounds(entry: dict, space) -> bool:
    """Whether a Box's bounds, as SB3 writes them beside its pickle (numpy's text of each array,
    every number printed so that it reads back exactly), are the space's."""
    for name in ("low", "high"):
        text = entry.get(name)
        if not isinstance(text, str) or "..." in text:  # absent, or numpy left numbers out
            return False
        try:
            saved = np.array(text.replace("[", " ").replace("]", " ").split(), dtype=np.float64)
        except ValueError:
            return False
        bound = getattr(space, name)
        if saved.shape != (bound.size,) or not np.array_equal(
                saved.astype(bound.dtype), bound.ravel()):
            return False
    return True


@lru_cache(maxsize=1)
def _finality_spaces() -> dict:
    """The observation and action spaces of `Finality-v0` with the default waits, the ones this
    adapter encodes (every probe arm shares them)."""
    env = FinalityEnv(wait_ticks=DEFAULT_WAITS)
    return {"observation": env.observation_space, "action": env.action_space}


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
    if normalize is None:
        return GymPolicy(name, act, start=start)

    def act_normalized(obs: np.ndarray, mask: np.ndarray) -> int:
        return act(normalize(obs), mask)
    return GymPolicy(name, act_normalized, start=start)


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
