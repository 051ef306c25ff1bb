"""A saved stable-baselines3 model archive, read as data, never as code.

A model runs in the grader's own process: SB3's `load` unpickles fields of the zip's `data` (a
pickle there runs whatever it names, with the grader's rights), while acting needs only the
policy's weights and its shape. So the algorithm, the policy class (one of the algorithm's own,
by name), the spaces (Finality's, once the plain fields SB3 writes beside its pickles match
them) and the policy's arguments are read from that JSON, never from a pickle; the weights come
from `policy.pth` through `torch.load(weights_only=True)`, which refuses anything but tensors;
the optimizer's state and the training-time fields are never read. An argument SB3 kept only as
a pickle (a custom features extractor, an activation outside a short list of torch's) is refused
by name. The policy so built predicts exactly as the model SB3 loads: a model's `predict` is its
policy's. What is read is bounded before it is read or built: the zip's directory, each member's
inflated size and ratio (`opened`, `member`), the weights' own archive and index (`_weights`),
the policy's widths, depth and parameters, counted from its arguments (`_checked_size`).
`unpickled_model` loads through SB3's own `load` instead, running the archive's pickles: only for
files one trusts (`allow_pickle`, `agents/learned/policy.py`).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np
from gymnasium.spaces import Discrete
from gymnasium.wrappers import FrameStackObservation

from finality_gym.encoder import DEFAULT_WAITS
from finality_gym.env import FinalityEnv

from .algorithms import ALGORITHMS, PPO_ALGORITHMS, Algorithm
from .vecnormalize import check_pickle

MAX_STACK = 64  # observations a frame-stacked model may stack (`stack_depth`)
# The policy a model may build (`_checked_size`): SB3 initializes a layer of n units in time
# ~n**3 (orthogonal initialization), so [12288, 12288] stalls the grader for minutes, while
# [2048, 2048] for actor and critic (8.7M parameters) is built in about a second. SB3's default
# is [64, 64]; the shipped PPO has 50,321 parameters.
MAX_WIDTH = 2048  # units of a layer, an LSTM's hidden size, QR-DQN's quantiles
MAX_LAYERS = 64  # layers of one network, or of an LSTM
MAX_PARAMETERS = 1 << 24
# What is read of a zip, and at most how much (`opened`, `member`): the directory that `zipfile`
# holds whole in memory (SB3's: 372 bytes; a bundle's 2,000 files: ~0.5 MB), a model's `data`
# JSON (10-20 KB) and its weights (4 bytes a parameter, and their index); SB3 and torch store
# their members, so a ratio of inflated to stored size beyond `ZIP_RATIO` is a bomb's.
ZIP_DIRECTORY = 1 << 20
MEMBER_BYTES = {"data": 4 << 20, "policy.pth": 4 * MAX_PARAMETERS + (1 << 20)}
ZIP_RATIO = 100


def opened(source: Path | io.BytesIO, where: str) -> zipfile.ZipFile:
    """The zip archive `source`, opened once its central directory, which `zipfile` parses whole
    into objects (each entry 46 bytes or more on disk, ten times that in memory), is known to be
    at most `ZIP_DIRECTORY` bytes (the ZIP64 directory's, if it has one, as `zipfile` reads)."""
    if isinstance(source, Path):
        with open(source, "rb") as handle:
            end = zipfile._EndRecData(handle)  # zipfile's own reading of the directory's size
    else:
        end = zipfile._EndRecData(source)
    if end is None:
        raise ValueError(f"{where} is not a zip archive")
    if end[zipfile._ECD_SIZE] > ZIP_DIRECTORY:
        raise ValueError(f"{where}: its zip directory is {end[zipfile._ECD_SIZE]:,} bytes, over "
                         f"the limit of {ZIP_DIRECTORY:,} (ZIP_DIRECTORY)")
    return zipfile.ZipFile(source)


def member(archive: zipfile.ZipFile, name: str, limit: int, where: str, label: str) -> bytes:
    """The member `name` of `archive`, read once its inflated size is known to be at most
    `ZIP_RATIO` times its stored size and at most `limit` bytes (named `label` in the refusal),
    and read to at most `limit` bytes whatever its header said."""
    info = archive.getinfo(name)
    if info.file_size > ZIP_RATIO * max(info.compress_size, 1):
        raise ValueError(f"{where}: its member {name} inflates {info.file_size:,} bytes from "
                         f"{info.compress_size:,}, a ratio over {ZIP_RATIO} (ZIP_RATIO)")
    if info.file_size > limit:
        raise ValueError(f"{where}: its member {name} inflates to {info.file_size:,} bytes, over "
                         f"the limit of {limit:,} ({label})")
    with archive.open(info) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{where}: its member {name} inflates past {limit:,} bytes ({label})")
    return data


def read_data(path: Path, kind: str) -> tuple[dict, Algorithm, int]:
    """The zip's `data` JSON, the algorithm that saved it and its observations' stack depth
    (`stack_depth`), once checked to be a model of Finality's observation and action spaces
    trained by an algorithm the spec `kind` grades (`ppo`: PPO or MaskablePPO; `sb3`: any of
    `ALGORITHMS`): the adapter feeds it Finality's observations and reads its actions through
    Finality's action table, so a model of another env or `wait_ticks` would be graded as a
    policy it is not (or fail deep in a worker). The algorithm is the one the archive names,
    never guessed from the file's name. Nothing but `data` is read."""
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a stable-baselines3 model (not a zip archive)")
    with opened(path, str(path)) as archive:
        if "data" not in archive.namelist():
            raise ValueError(f"{path} is not a stable-baselines3 model (no data member)")
        text = member(archive, "data", MEMBER_BYTES["data"], str(path), "MEMBER_BYTES['data']")
    try:
        data = json.loads(text)
        algorithm = _algorithm(data)
        saved = {"observation": _saved_space(data["observation_space"]),
                 "action": _saved_space(data["action_space"])}
        stack = stack_depth(data["observation_space"])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a stable-baselines3 model ({exc!r})") from None
    if kind == "ppo" and algorithm not in PPO_ALGORITHMS:
        hint = f": grade it with sb3:{path}" if algorithm in ALGORITHMS else ""
        raise ValueError(f"{path} was trained by {algorithm}, not PPO or MaskablePPO{hint}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{path} was trained by {algorithm}, not one sb3: grades "
                         f"({', '.join(ALGORITHMS)})")
    expected = finality_spaces(stack)
    for space, why in (("observation", ""), ("action", f" (wait_ticks {DEFAULT_WAITS})")):
        if saved[space] != _space_summary(expected[space]):
            raise ValueError(f"{path} was trained with {space} space {saved[space]}; Finality's "
                             f"is {_space_summary(expected[space])}{why}")
    if not _same_bounds(data["observation_space"], expected["observation"]):
        raise _other_bounds(path, "observation", expected)
    return data, ALGORITHMS[algorithm], stack


def stack_depth(entry: dict) -> int:
    """How many of Finality's observations a model's observation stacks: N for a Box of shape
    (N, 58), 2 <= N <= `MAX_STACK` (Gymnasium's `FrameStackObservation`, `--frame-stack N` of
    `python -m train`), 1 otherwise (whatever the shape, checked against Finality's after)."""
    shape = tuple(entry.get("_shape") or ())
    width = finality_spaces()["observation"].shape[0]
    return shape[0] if len(shape) == 2 and shape[1] == width and 2 <= shape[0] <= MAX_STACK else 1


def unpickled_model(path: Path, cls, stack: int = 1):
    """The model as SB3's own `load` makes it, running the archive's pickles; the spaces it
    unpickles are compared in full."""
    expected = finality_spaces(stack)
    try:
        # Unpickles: code in the file runs here. Only `allow_pickle` reaches this (every other
        # load reads the archive as data, `read_data`), and never for a submitted bundle (`eval
        # verify` and `eval submit` load with `allow_pickle=False`; a bundle asking for it is
        # refused). The file is trusted by the operator who asked: `--trust-pickles`, recorded
        # in run.json and refused for the private split; never a submitter's file.
        model = cls.load(path, device="cpu")  # trusted: the operator's file, never a submitter's
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


def built_policy(path: Path, data: dict, cls, stack: int = 1):
    """The archive's policy, built by the project: the algorithm's own policy class, on
    Finality's spaces, with the arguments `data` holds as JSON, and the weights of `policy.pth`
    loaded strictly (every tensor the policy has, no other), in evaluation mode. This is what
    SB3's `load` builds for acting: it constructs the policy from the same class, spaces and
    arguments (the spaces checked equal, the optimizer's arguments aside) and loads the same
    state dict into it."""
    import torch
    expected = finality_spaces(stack)
    policy_class = _policy_class(path, data["policy_class"], cls)
    arguments = _policy_arguments(path, data.get("policy_kwargs") or {})
    _checked_size(path, cls.__name__, arguments, expected["observation"].shape)
    schedule = (_no_learning,) if ALGORITHMS[cls.__name__].scheduled else ()
    try:
        weights = _weights(path)
    except ValueError as exc:  # no weights, not torch's archive, or over a limit
        raise ValueError(f"{path} could not be loaded as {cls.__name__}: {exc}") from None
    try:
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


def _weights(path: Path) -> bytes:
    """`policy.pth`, within `MEMBER_BYTES`, once its own archive (torch's) is known to hold
    stored records only, no more of them than its bytes (records that overlap would each be
    read whole) and an index (`data.pkl`) that `check_pickle` passes."""
    where = f"{path}'s policy.pth"
    with opened(path, str(path)) as archive:
        if "policy.pth" not in archive.namelist():
            raise ValueError(f"{path} has no policy.pth: no weights to load")
        weights = member(archive, "policy.pth", MEMBER_BYTES["policy.pth"], str(path),
                         "MEMBER_BYTES['policy.pth']")
    with opened(io.BytesIO(weights), where) as inner:
        records = inner.infolist()
        if any(r.compress_type != zipfile.ZIP_STORED for r in records) or sum(
                r.file_size for r in records) > len(weights):
            raise ValueError(f"{where} holds records compressed, or more than its bytes: torch "
                             "stores each once, as the grader reads them")
        for record in records:
            if record.filename.endswith("/data.pkl") or record.filename == "data.pkl":
                check_pickle(inner.read(record), f"{where} ({record.filename})")
    return weights


def _checked_size(path: Path, algorithm: str, arguments: dict, shape: tuple[int, ...]) -> None:
    """Refuses, before anything is built, a policy with a layer wider than `MAX_WIDTH`, a
    network deeper than `MAX_LAYERS` or more than `MAX_PARAMETERS` parameters, counted from its
    arguments as the algorithm's policy class builds its networks (an upper bound: the
    recurrent critic counted as an LSTM of its own, ARS's LinearPolicy as its MlpPolicy)."""
    net = arguments.get("net_arch")
    net = [64, 64] if net is None else net  # every policy's default
    pi, vf = (net.get("pi", []), net.get("vf", [])) if isinstance(net, dict) else (net, net)
    quantiles = arguments.get("n_quantiles", 200 if algorithm == "QRDQN" else 1)
    hidden, depth = arguments.get("lstm_hidden_size", 256), arguments.get("n_lstm_layers", 1)
    for name, layers in (("net_arch pi", pi), ("net_arch vf", vf)):
        if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
            raise ValueError(f"{path}'s policy_kwargs {name} is {layers!r}, not a list of at "
                             f"most {MAX_LAYERS} widths (MAX_LAYERS)")
    sizes = [(f"net_arch {what}", n, MAX_WIDTH, "MAX_WIDTH") for what, layers in
             (("pi", pi), ("vf", vf)) for n in layers]
    sizes += [("n_quantiles", quantiles, MAX_WIDTH, "MAX_WIDTH"),
              ("lstm_hidden_size", hidden, MAX_WIDTH, "MAX_WIDTH"),
              ("n_lstm_layers", depth, MAX_LAYERS, "MAX_LAYERS")]
    for name, n, limit, label in sizes:
        if type(n) is not int or not 1 <= n <= limit:
            raise ValueError(f"{path}'s policy_kwargs {name} is {n!r}, not a whole number from 1 "
                             f"to {limit:,} ({label})")
    inputs, actions = math.prod(shape), int(finality_spaces()["action"].n)
    if algorithm in ("DQN", "QRDQN", "ARS"):  # a Q-network (and its target), or ARS's one
        count = (1 if algorithm == "ARS" else 2) * _mlp(inputs, pi, actions * quantiles)
    else:
        lstm = sum(4 * hidden * ((inputs if i == 0 else hidden) + hidden) + 8 * hidden
                   for i in range(depth)) if algorithm == "RecurrentPPO" else 0
        width = hidden if lstm else inputs
        count = 2 * lstm + _mlp(width, pi, actions) + _mlp(width, vf, 1)
    if count > MAX_PARAMETERS:
        raise ValueError(f"{path}'s policy would have {count:,} parameters, over the limit of "
                         f"{MAX_PARAMETERS:,} (MAX_PARAMETERS)")


def _mlp(width: int, layers: list[int], out: int) -> int:
    """The parameters of linear layers of `layers` units, then `out`, on `width` inputs."""
    count = 0
    for units in [*layers, out]:
        count, width = count + width * units + units, units
    return count


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


@lru_cache(maxsize=None)
def finality_spaces(stack: int = 1) -> dict:
    """The observation and action spaces of `Finality-v0` with the default waits, the ones this
    adapter encodes (every probe arm shares them); with `stack` > 1 the observation space of
    Gymnasium's `FrameStackObservation` of that depth over them."""
    env = FinalityEnv(wait_ticks=DEFAULT_WAITS)
    if stack > 1:
        env = FrameStackObservation(env, stack)
    return {"observation": env.observation_space, "action": env.action_space}
