"""The observation normalization saved with a stable-baselines3 model, read as data.

The statistics saved with a model (`normalization_file` says where SB3, its checkpoints and RL
Baselines3 Zoo put them) are applied to every observation as SB3's `VecNormalize.normalize_obs`
applies them at evaluation, whichever loader reads the model (`agents/learned/policy.py`); never
ignored: a model trained on normalized observations and graded on raw ones is graded as a
policy it is not. It is a pickle, and the grader runs it in its own process, so it is read
by an unpickler that records what the file names, calls nothing and rebuilds only arrays of
plain numbers (`_Recorder`), once its size and what its opcodes ask for are known to be near
what a VecNormalize holds (`check_pickle`; the model's own `policy.pth` index too).
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
from pathlib import Path
from typing import Callable

import numpy as np

from finality_gym.registration import ENV_IDS

def normalization_file(path: Path) -> Path | None:
    """The `vecnormalize.pkl` saved with a model archive, if any, wherever these save it:

    - stable-baselines3's users: `vecnormalize.pkl` beside the model;
    - SB3's `CheckpointCallback(save_vecnormalize=True)`: `<prefix>_vecnormalize_<n>_steps.pkl`
      beside the checkpoint `<prefix>_<n>_steps.zip`;
    - RL Baselines3 Zoo: `<run>/<env name>/vecnormalize.pkl`, for each model of the run folder
      `<run>` = `<env name>_<k>` (or `<env name>_<k>_<uuid>`): the final `<env name>.zip`,
      `best_model.zip`, the checkpoints. The env name is found from the run folder's name or
      the model's, or is one of Finality's ids, so a zoo run of an env registered under
      another id (with Finality's spaces) is found too.

    Two are one too many: which one the model was trained with cannot be told."""
    folder = path.parent
    checkpoint = re.fullmatch(r"(.+)_(\d+)_steps", path.stem)
    own = [folder / "vecnormalize.pkl"]
    if checkpoint:
        own.append(folder / f"{checkpoint[1]}_vecnormalize_{checkpoint[2]}_steps.pkl")
    zoo = [file for file in sorted(folder.glob("*/vecnormalize.pkl"))
           if _zoo_env_folder(file.parent.name, path)]
    found = [file for file in own + zoo if file.is_file()]
    if len(found) > 1:
        raise ValueError(f"{path} has {len(found)} observation normalizations saved with it "
                         f"({', '.join(map(str, found))}): keep only the one it was trained with")
    return found[0] if found else None


def _zoo_env_folder(name: str, path: Path) -> bool:
    """Whether a folder `name` beside the model `path` is where RL Baselines3 Zoo keeps a run's
    statistics: the folder of the run's env name (the zoo's `<env name>_<k>[_<uuid>]` run
    folder, the final model `<env name>.zip`, or a Finality id)."""
    run = re.escape(name) + r"_\d+(_[0-9a-f-]{36})?"
    return name in ENV_IDS or name == path.stem or re.fullmatch(run, path.parent.name) is not None


_VEC_NORMALIZE = ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize")
_RUNNING_MEAN_STD = ("stable_baselines3.common.running_mean_std", "RunningMeanStd")


def normalization(path: Path, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray] | None:
    """The observation normalization of the `vecnormalize.pkl` saved with a model, if any, as
    `VecNormalize.normalize_obs` computes it when the model is evaluated (statistics frozen;
    rewards are not the policy's input): `(obs - mean) / sqrt(var + epsilon)` in float64,
    clipped to `clip_obs`, cast to float32. Its statistics must be of observations of `shape`
    (Finality's). Read with `_Recorder`: no code of the file runs."""
    file = normalization_file(path)
    if file is None:
        return None
    with open(file, "rb") as handle:
        raw = handle.read(PICKLE_BYTES + 1)
    check_pickle(raw, f"{file} (saved with {path})")
    try:
        saved = _Recorder(io.BytesIO(raw)).load()
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
    if mean.shape != shape or var.shape != shape or mean.dtype.kind != "f" or var.dtype.kind != "f":
        raise ValueError(f"{file} (saved with {path}) normalizes observations of shape "
                         f"{mean.shape}, not Finality's {shape}")
    scale = np.sqrt(var + epsilon)

    def normalize(obs: np.ndarray) -> np.ndarray:
        return np.clip((obs - mean) / scale, -clip, clip).astype(np.float32)
    return normalize


# A pickle read as data: a VecNormalize (two RunningMeanStd of the observation's shape, a few
# scalars, its spaces, a list or two of one item per env: 3 KB and 519 opcodes for one env,
# 18 KB and 837 for 64) or the index of a model's weights (`sb3_archive`: 2-3 KB, 538-896
# opcodes), with room to spare; a random generator's state (a space's, once seeded) holds 2 to 4
# integers beyond 2**53.
PICKLE_BYTES = 1 << 20
PICKLE_OPCODES = 1 << 16
PICKLE_BIG_INTS = 64
_MEMO = ("PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET")
_TEXT_INTS = ("INT", "LONG", "LONG1", "LONG4")  # the opcodes of an integer of any size


def check_pickle(data: bytes, what: str) -> None:
    """Refuses, naming the limit, a pickle whose reading could stall or flood the grader, read
    opcode by opcode before anything of it is built: over `PICKLE_BYTES` (`data` is read to one
    byte more) or `PICKLE_OPCODES` (every object, key and item takes one); a memo index beyond
    `PICKLE_OPCODES` (the unpickler makes its memo as long as the index: ten bytes can ask for
    32 GiB); over `PICKLE_BIG_INTS` integers beyond 2**53 (keys made to collide in a dict are
    such integers, n and n + k * (2**61 - 1) hashing alike: 2M of them take hours to insert)."""
    if len(data) > PICKLE_BYTES:
        raise ValueError(f"{what} is over {PICKLE_BYTES:,} bytes (PICKLE_BYTES): no "
                         "VecNormalize or index of weights is near that")
    opcodes, big = pickletools.genops(data), 0
    for count in range(1, PICKLE_OPCODES + 2):
        try:
            op, arg, _ = next(opcodes)
        except StopIteration:
            return
        except ValueError as exc:  # pickletools' words for a damaged pickle
            raise ValueError(f"{what} is not a pickle ({exc})") from None
        if op.name in _MEMO and arg > PICKLE_OPCODES:
            raise ValueError(f"{what} asks for a memo of {arg:,} entries, beyond "
                             f"{PICKLE_OPCODES:,} (PICKLE_OPCODES)")
        big += op.name in _TEXT_INTS and type(arg) is int and abs(arg) > 1 << 53
        if big > PICKLE_BIG_INTS:
            raise ValueError(f"{what} holds over {PICKLE_BIG_INTS} integers beyond 2**53 "
                             "(PICKLE_BIG_INTS): keys made to collide are such integers")
    raise ValueError(f"{what} has over {PICKLE_OPCODES:,} opcodes (PICKLE_OPCODES): objects, "
                     "keys and items far beyond a VecNormalize's")


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

