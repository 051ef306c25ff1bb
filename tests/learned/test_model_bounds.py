"""A submitted model runs bounded in the grader's process (issue 41, classes 5 and 6).

Each test is an attack a red team made on 8b36e67, written as the attack it is: a graph that
loops ~1e15 times on real observations (zeros pass), one that allocates 2**29 floats from a few
bytes, one that multiplies two 2048 x 2048 matrices at every step, one with a random operator
(other rows at every grading), an SB3 archive whose `data` inflates to 1 GiB, a zip directory of
a million entries, a `net_arch` of two 12,288-wide layers (initialized in time ~n**3), weights
whose index holds keys made to collide, a `vecnormalize.pkl` of 2M such keys, four bundles of
250 KB inflating to 240 MiB each. On 8b36e67 each stalled the grader, flooded its memory or
changed its rows; here each is refused before it runs, quickly, in words that name the limit,
and where it goes through `eval verify` the board is left as it was."""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import threading
import time
import tracemalloc
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from stable_baselines3 import PPO

import finality_gym  # noqa: F401  (registers the ids)
from agents import make_policy
from agents.learned.onnx_policy import BOUNDS, load_onnx
from agents.learned.vecnormalize import check_pickle
from eval.__main__ import main as eval_cli
from eval.board.bundle import BundleError, pack, read_bundle
from finality_gym.corpus import new_master_seed

OBS_DIM, ACTIONS = 58, 16
MiB = 1 << 20
PRIME = (1 << 61) - 1  # n and n + k * PRIME hash alike in Python: keys made to collide
VERIFY = ["--subset", "stratified", "--seeds", "1", "--workers", "1", "--no-progress"]


def _quickly(seconds: float, call, *args) -> str:
    """The words `call(*args)` is refused with, within `seconds` (the attack took minutes, hours
    or gigabytes on 8b36e67)."""
    started = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        call(*args)
    assert time.perf_counter() - started < seconds, caught.value
    return str(caught.value)


# ------------------------------------------------------------------------- ONNX graphs
def _constant(name: str, value, dtype=np.float32):
    array = np.asarray(value, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(array,
                                                                                      name))


def _graph(tmp_path: Path, name: str, nodes: list, extra: str | None = None) -> Path:
    """A policy graph on the contract (obs [N, 58] in, logits [N, 16] out): logits are
    obs @ w (+ `extra`, a tensor the attack computes, broadcast)."""
    weights = np.random.default_rng(0).normal(size=(OBS_DIM, ACTIONS))
    head = [_constant("w", weights), helper.make_node("MatMul", ["obs", "w"],
                                                      ["base" if extra else "logits"])]
    if extra:
        head.append(helper.make_node("Add", ["base", extra], ["logits"]))
    graph = helper.make_graph(nodes + head, name,
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT,
                                                             ["n", OBS_DIM])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             ["n", ACTIONS])])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _loop_on_observation(tmp_path: Path) -> Path:
    """A Loop of max(obs) * 1e15 trips: none on a zero observation, ~1e15 on a real one."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Identity", ["v"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 1])])
    return _graph(tmp_path, "loop", [
        helper.make_node("ReduceMax", ["obs"], ["peak"], keepdims=0),
        _constant("scale", 1e15), helper.make_node("Mul", ["peak", "scale"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["trips"], to=TensorProto.INT64),
        _constant("true", True, bool), _constant("zero", [[0.0]]),
        helper.make_node("Loop", ["trips", "true", "zero"], ["looped"], body=body)], "looped")


def _filled(tmp_path: Path, name: str, shape_nodes: list) -> Path:
    """A graph that fills the tensor of shape `shape` (made by `shape_nodes`) and sums it."""
    return _graph(tmp_path, name, shape_nodes + [
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["summed"], keepdims=0)], "summed")


def _squared(tmp_path: Path, n: int, times: int) -> Path:
    """`times` products of an n x n matrix (drawn from the observation, so that nothing is
    computed once for all when the session is made) with itself, chained, at every call."""
    nodes = [_constant("shape", [n, n], np.int64),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"]),
             helper.make_node("ReduceMax", ["obs"], ["peak"], keepdims=1),
             helper.make_node("Add", ["ones", "peak"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{i}", "m0"], [f"m{i + 1}"]) for i in range(times)]
    nodes.append(helper.make_node("ReduceSum", [f"m{times}"], ["summed"], keepdims=0))
    return _graph(tmp_path, f"squared_{n}_{times}", nodes, "summed")


def test_a_loop_fed_by_the_observation_is_refused(tmp_path):
    graph = _loop_on_observation(tmp_path)
    for kind in ("onnx", "onnx-greedy"):
        said = _quickly(5, make_policy, f"{kind}:{graph}")
        assert "Loop" in said and "control flow" in said and "OPERATORS" in said


def test_a_flood_of_memory_is_refused_before_a_session_is_made(tmp_path):
    fixed = _filled(tmp_path, "fixed", [_constant("shape", [1, 1 << 29], np.int64)])
    assert "Bounds.tensor_elements" in _quickly(5, load_onnx, fixed)
    # its size drawn from the observation: none on zeros, 2**29 on a real observation
    drawn = _filled(tmp_path, "drawn", [
        helper.make_node("ReduceMax", ["obs"], ["peak"], keepdims=0, axes=[1]),
        _constant("scale", float(1 << 29)), helper.make_node("Mul", ["peak", "scale"], ["n"]),
        helper.make_node("Cast", ["n"], ["shape"], to=TensorProto.INT64)])
    assert "does not follow from the inputs'" in _quickly(5, load_onnx, drawn)
    many = _graph(tmp_path, "many", [_constant("shape", [1024, 1024], np.int64)] + [
        helper.make_node("ConstantOfShape", ["shape"], [f"c{i}"]) for i in range(20)])
    assert "Bounds.total_elements" in _quickly(5, load_onnx, many)


def test_a_stall_of_work_is_refused_and_a_long_call_is_stopped(tmp_path):
    """8.6 G multiply-adds a call is refused by `Bounds.work`; with that bound lifted, the
    wall-time watch stops a call of 256 products of 1024 x 1024 matrices (~9 s here) between two
    of them, and loading leaves no thread behind (a fork server refuses an import that does)."""
    assert "Bounds.work" in _quickly(5, load_onnx, _squared(tmp_path, 2048, 1))
    lifted = replace(BOUNDS, total_elements=1 << 30, work=1 << 40, call_seconds=0.25)
    threads = threading.active_count()
    said = _quickly(3, load_onnx, _squared(tmp_path, 1024, 256), False, lifted)
    assert "Bounds.call_seconds" in said and threading.active_count() == threads


@pytest.mark.parametrize("operator", ["RandomUniform", "RandomNormal", "Bernoulli",
                                      "RandomUniformLike", "Multinomial", "Dropout"])
def test_a_random_operator_is_refused(tmp_path, operator):
    """A row that changes from one grading to the next: a verified grade would not be a
    function of the bundle (on 8b36e67, 29 to 30 of 30 rows differed)."""
    made = {"RandomUniform": helper.make_node("RandomUniform", [], ["noise"], shape=[1, 16]),
            "RandomNormal": helper.make_node("RandomNormal", [], ["noise"], shape=[1, 16]),
            "Bernoulli": helper.make_node("Bernoulli", ["half"], ["noise"]),
            "RandomUniformLike": helper.make_node("RandomUniformLike", ["half"], ["noise"]),
            "Multinomial": helper.make_node("Multinomial", ["half"], ["noise"],
                                            dtype=TensorProto.FLOAT),
            "Dropout": helper.make_node("Dropout", ["half", "ratio", "train"], ["noise"])}
    nodes = [_constant("half", np.full((1, 16), 0.5)), _constant("ratio", 0.5),
             _constant("train", True, bool), made[operator]]
    said = _quickly(5, make_policy, f"onnx:{_graph(tmp_path, operator, nodes, 'noise')}")
    assert operator in said and ("random" in said or "training_mode" in said)


def test_the_load_check_plays_real_observations(tmp_path):
    """Logits plus sqrt(-max(obs)): finite on a zero observation, NaN on the env's."""
    graph = _graph(tmp_path, "nan_on_real", [
        helper.make_node("ReduceMax", ["obs"], ["peak"], keepdims=1),
        helper.make_node("Neg", ["peak"], ["negated"]),
        helper.make_node("Sqrt", ["negated"], ["root"])], "root")
    assert "no action to choose" in _quickly(5, make_policy, f"onnx-greedy:{graph}")


# ------------------------------------------------------------------------- zips by hand
def _zip(members: list[tuple], shared: bool = False) -> bytes:
    """A zip written by hand: `members` as (name, method, stored bytes, CRC, size); `shared`:
    every directory entry points at the first member's bytes."""
    local, central, offset = [], [], 0
    for name, method, raw, crc, size in members:
        named = name.encode()
        if not (shared and local):
            local.append(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 33, crc,
                                     len(raw), size, len(named), 0) + named + raw)
        central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 33, crc,
                                   len(raw), size, len(named), 0, 0, 0, 0, 0o100644 << 16,
                                   0 if shared else offset) + named)
        offset = 0 if shared else offset + len(local[-1])
    files, directory = b"".join(local), b"".join(central)
    count = min(len(central), 0xFFFF)
    return files + directory + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count,
                                           len(directory), len(files), 0)


def _zeros_deflated(size: int) -> tuple[bytes, int]:
    """A deflate stream of `size` zero bytes (a multiple of 16 MiB; ~1 KB a MiB) and its CRC:
    one 16 MiB block, fully flushed, repeated."""
    block, zeros = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(16 * MiB)
    chunk = block.compress(zeros) + block.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // len(zeros)):
        crc = zlib.crc32(zeros, crc)
    return chunk * (size // len(zeros)) + block.flush(), crc


def _stored(name: str, data: bytes) -> tuple:
    return name, 0, data, zlib.crc32(data), len(data)


def _colliding(n: int) -> bytes:
    """A pickle of a dict of `n` integer keys that all hash alike: n**2 / 2 comparisons to
    build (30,000 keys: 6 s; 2M: hours)."""
    out = [b"\x80\x04}"]  # protocol 4, an empty dict
    for start in range(0, n, 1000):
        out.append(b"(")  # a mark, then keys and values, then SETITEMS
        for k in range(start + 1, min(n, start + 1000) + 1):
            key = (k * PRIME).to_bytes(11, "little", signed=True)
            out.append(b"\x8a\x0b" + key + b"N")  # LONG1 of 11 bytes, None
        out.append(b"u")
    return b"".join(out) + b"."


# ------------------------------------------------------------------------- SB3 models
@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "ppo.zip"
    PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, policy_kwargs={"net_arch": [8]},
        seed=0, device="cpu").save(path)
    return path


def _members(source: Path, changed: dict) -> list[tuple]:
    """The archive's members, stored, `changed` ones replaced (by bytes, or a member tuple)."""
    with zipfile.ZipFile(source) as archive:
        found = {n: archive.read(n) for n in archive.namelist()} | changed
    return [data if isinstance(data, tuple) else _stored(name, data)
            for name, data in found.items()]


def _with_arguments(model: Path, out: Path, **arguments) -> Path:
    with zipfile.ZipFile(model) as archive:
        data = json.loads(archive.read("data"))
    data["policy_kwargs"] = {**data["policy_kwargs"], **arguments}
    out.write_bytes(_zip(_members(model, {"data": json.dumps(data).encode()})))
    return out


def test_an_archive_bomb_is_refused_before_it_inflates(model, tmp_path):
    raw, crc = _zeros_deflated(1 << 30)  # 1 GiB from ~1 MB
    bomb = tmp_path / "bomb.zip"
    bomb.write_bytes(_zip(_members(model, {"data": ("data", 8, raw, crc, 1 << 30)})))
    assert "ZIP_RATIO" in _quickly(5, make_policy, f"sb3:{bomb}")
    flood = tmp_path / "directory.zip"  # a million entries, all pointing at one
    flood.write_bytes(_zip([("f%07d" % i, 0, b"", 0, 0) for i in range(1_000_000)], True))
    assert "ZIP_DIRECTORY" in _quickly(2, make_policy, f"sb3:{flood}")


@pytest.mark.parametrize("arguments,limit", [
    ({"net_arch": [12288, 12288]}, "MAX_WIDTH"),
    ({"net_arch": {"pi": [2048] * 6, "vf": [2048] * 6}}, "MAX_PARAMETERS"),
    ({"net_arch": [1] * 5000}, "MAX_LAYERS")])
def test_a_network_too_large_to_build_is_refused_before_it_is_built(model, tmp_path,
                                                                       arguments, limit):
    wide = _with_arguments(model, tmp_path / "wide.zip", **arguments)
    assert limit in _quickly(5, make_policy, f"sb3:{wide}")


def test_weights_whose_index_holds_colliding_keys_are_refused(model, tmp_path):
    with zipfile.ZipFile(model) as archive:
        inner = zipfile.ZipFile(io.BytesIO(archive.read("policy.pth")))
        records = [(n, _colliding(30_000) if n.endswith("/data.pkl") else inner.read(n))
                   for n in inner.namelist()]
    weights = _zip([_stored(n, data) for n, data in records])
    forged = tmp_path / "forged.zip"
    forged.write_bytes(_zip(_members(model, {"policy.pth": weights})))
    assert "PICKLE_BIG_INTS" in _quickly(5, make_policy, f"sb3:{forged}")


@pytest.mark.parametrize("keys,limit", [(2_000_000, "PICKLE_BYTES"),
                                        (30_000, "PICKLE_BIG_INTS")])
def test_a_vecnormalize_of_colliding_keys_is_refused(model, tmp_path, keys, limit):
    folder = tmp_path / "normalized"
    folder.mkdir()
    (folder / "ppo.zip").write_bytes(model.read_bytes())
    (folder / "vecnormalize.pkl").write_bytes(_colliding(keys))
    assert limit in _quickly(5, make_policy, f"sb3:{folder / 'ppo.zip'}")


@pytest.mark.parametrize("pickled,limit", [
    (b"\x80\x04N\x94r\xff\xff\xff\xff.", "a memo of 4,294,967,295 entries"),  # 32 GiB of memo
    (b"\x80\x04]" + (b"(" + b"K\x01" * 1000 + b"e") * 70 + b".", "PICKLE_OPCODES"),
    (b"\x80\x04N" + b" " * MiB + b".", "PICKLE_BYTES")])
def test_a_pickle_read_as_data_is_bounded_before_it_is_built(pickled, limit):
    with pytest.raises(ValueError, match=re.escape(limit)):
        check_pickle(pickled, "vecnormalize.pkl")


# ------------------------------------------------------------------------- bundles
def _bombs(tmp_path: Path) -> list[Path]:
    """Four ONNX bundles of ~250 KB, each member inflating to 240 MiB, its hash right (within
    `MAX_BYTES`: 8b36e67 inflated all four and held them at once)."""
    size = 240 * MiB
    raw, crc = _zeros_deflated(size)
    digest = hashlib.sha256(bytes(size)).hexdigest()
    paths = []
    for i in range(4):
        manifest = {"format": "finality-bundle/1", "name": f"bomb{i}", "kind": "onnx",
                    "spec": "onnx:model.onnx", "files": {"model.onnx": digest}}
        paths.append(tmp_path / f"bomb{i}.finality")
        paths[-1].write_bytes(_zip([_stored("manifest.json", json.dumps(manifest).encode()),
                                    ("policy/model.onnx", 8, raw, crc, size)]))
    return paths


def test_bundles_that_inflate_are_refused_one_at_a_time(tmp_path, capsys):
    bombs = _bombs(tmp_path)
    assert all(p.stat().st_size < 300_000 for p in bombs)
    tracemalloc.start()
    for bomb in bombs:
        with pytest.raises(BundleError, match="is compressed"):
            read_bundle(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * MiB, f"{peak:,} bytes held to refuse four bundles"
    seed = tmp_path / "seed"
    seed.write_text(f"{new_master_seed()}\n")
    assert eval_cli(["verify", *map(str, bombs), "--master-seed-file", str(seed), "--out",
                     str(tmp_path / "board"), *VERIFY]) == 2
    assert "is compressed" in capsys.readouterr().err and not (tmp_path / "board").exists()


def test_a_looping_graph_submitted_is_refused_by_verify(tmp_path, capsys):
    """Through `eval verify`, where the red team hung it: refused with the limit's name before
    anything is written."""
    bundle = tmp_path / "loop.finality"
    bundle.write_bytes(pack({"name": "loop", "kind": "onnx", "spec": "onnx:model.onnx"},
                            {"model.onnx": _loop_on_observation(tmp_path).read_bytes()}))
    seed = tmp_path / "seed"
    seed.write_text(f"{new_master_seed()}\n")
    started = time.perf_counter()
    assert eval_cli(["verify", str(bundle), "--master-seed-file", str(seed), "--out",
                     str(tmp_path / "board"), *VERIFY]) == 2
    assert time.perf_counter() - started < 30
    said = capsys.readouterr().err
    assert "control flow" in said and "OPERATORS" in said and not (tmp_path / "board").exists()
