"""What a model says it was trained for (`agents/learned/trained_for.py`): the document stamped
into an SB3 archive loads in SB3's own loader and in the safe one, round-trips through an ONNX
graph's metadata, and `check_model` refuses a grading it contradicts (the arm, the observation
layout, the action table) with both sides named, refuses bad metadata with one clear error, and
notes once a model without any."""

from __future__ import annotations

import dataclasses
import json
import zipfile

import gymnasium as gym
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from sb3_contrib import MaskablePPO

import finality_gym
from agents import make_policy
from agents.learned import trained_for
from agents.learned.policy import load_sb3
from agents.learned.trained_for import (MEMBER, TrainedFor, action_names, check_model,
                                        observation_names, read_archive, read_onnx, stamp)
from finality_gym.encoder import OBS_FIELDS

NOPROBE = TrainedFor.of_env("FinalityNoProbe-v0")


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """An untrained MaskablePPO of the no-probe arm, saved by SB3 and stamped."""
    path = tmp_path_factory.mktemp("stamped") / "model.zip"
    MaskablePPO("MlpPolicy", gym.make("FinalityNoProbe-v0"), n_steps=8, batch_size=8, seed=0,
                device="cpu", policy_kwargs={"net_arch": [8]}).save(path)
    stamp(path, NOPROBE)
    return path


@pytest.fixture(autouse=True)
def no_notes_yet(monkeypatch):
    """Each test starts as a fresh process does: no model noted yet."""
    monkeypatch.setattr(trained_for, "_NOTED", set())


def _restamped(archive, tmp_path, document: dict | str | None):
    """The archive with its `finality.json` replaced by `document` (None: left out)."""
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(path, "w") as copy:
        for name in source.namelist():
            if name != MEMBER:
                copy.writestr(name, source.read(name))
        if document is not None:
            copy.writestr(MEMBER, document if isinstance(document, str) else json.dumps(document))
    return path


def test_every_env_id_names_its_arm_and_the_encoders_layout():
    env = gym.make("Finality-v0")
    for env_id, arm in finality_gym.ENV_IDS.items():
        found = TrainedFor.of_env(env_id)
        assert (found.env_id, found.probe) == (env_id, arm)
        assert found.observation_fields == tuple(n for n, _, _ in OBS_FIELDS)
        assert len(found.observation_fields) == env.observation_space.shape[0] == 58
        assert len(found.actions) == env.action_space.n == 16
    assert action_names()[5] == "wait(ticks=10)" and action_names()[9] == \
        "retry_capture(key=original)"
    with pytest.raises(ValueError, match="env: unknown id 'CartPole-v1'"):
        TrainedFor.of_env("CartPole-v1")


def test_a_stamped_archive_loads_in_sb3_and_in_the_safe_loader(archive):
    with zipfile.ZipFile(archive) as z:
        assert json.loads(z.read(MEMBER)) == NOPROBE.to_dict()
    assert read_archive(archive) == NOPROBE
    model = MaskablePPO.load(archive, device="cpu")  # SB3's own loader
    obs = np.zeros(58, dtype=np.float32)
    assert 0 <= int(model.predict(obs, deterministic=True)[0]) < 16
    policy = load_sb3(archive, kind="ppo")  # the data loader
    assert policy.predict(obs, np.ones(16, dtype=bool)) in range(16)
    make_policy(f"ppo:{archive}", probe="none")
    with pytest.raises(ValueError) as refused:
        make_policy(f"ppo:{archive}", probe="full")
    assert str(refused.value) == (f"ppo:{archive} was trained on FinalityNoProbe-v0 (probe arm "
                                  "none); it is graded on probe arm full: refused")
    with pytest.raises(ValueError, match="already says what it was trained for"):
        stamp(archive, NOPROBE)  # a zip would keep both copies


def test_the_document_round_trips_through_an_onnx_graphs_metadata(tmp_path):
    props = NOPROBE.onnx_props()
    assert props["finality_gym.probe"] == "none"
    assert json.loads(props["finality_gym.observation_fields"]) == list(observation_names())
    assert TrainedFor.from_onnx_props(props, "g") == NOPROBE
    assert TrainedFor.from_onnx_props({"finality_gym.algorithm": "PPO"}, "g") is None
    graph = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["obs"], ["logits"])], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 16])]))
    onnx.helper.set_model_props(graph, props)
    path = tmp_path / "g.onnx"
    path.write_bytes(graph.SerializeToString())
    assert read_onnx(path) == NOPROBE
    with pytest.raises(ValueError, match="probe arm none\\); it is graded on probe arm delayed"):
        check_model(path, True, "delayed", f"onnx:{path}")


# Each case: the stamped document made bad (from the good one), and what the error says.
BAD = [
    (lambda good: "{not json", "its finality.json is not JSON"),
    (lambda good: {"format": good["format"]}, "not exactly format, env_id, probe"),
    (lambda good: {**good, "format": "finality-trained-for/2"},
     "of format 'finality-trained-for/2'; this grader reads 'finality-trained-for/1'"),
    (lambda good: {**good, "env_id": "Finality-v1"},
     "was trained on 'Finality-v1', an env id this grader does not know"),
    (lambda good: {**good, "probe": "full"},
     "names FinalityNoProbe-v0 with probe arm 'full'; that id is probe arm none"),
    (lambda good: {**good, "actions": "ship"},
     "its training metadata's actions is not a list of 1 to 4096 names"),
]


@pytest.mark.parametrize("bad, message", BAD)
def test_bad_metadata_is_one_clear_error(archive, tmp_path, bad, message):
    document = bad(NOPROBE.to_dict())
    path = _restamped(archive, tmp_path, document)
    with pytest.raises(ValueError) as refused:
        check_model(path, False, "none", f"sb3:{path}")
    assert message in str(refused.value) and str(path) in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1
    with pytest.raises(ValueError, match="lacks finality_gym.actions"):
        TrainedFor.from_onnx_props({k: v for k, v in NOPROBE.onnx_props().items()
                                    if not k.endswith("actions")}, "g")


@pytest.mark.parametrize("field, names, said", [
    ("observation_fields", observation_names()[:-1],
     "an observation layout of 57 names, index 57 absent; the grader's has 58, index 57 "
     "'last_call_refused'"),
    ("actions", ("read_ledger", "read_processor", *action_names()[2:]),
     "an action table of 16 names, index 0 'read_ledger'; the grader's has 16, index 0 "
     "'read_processor'"),
])
def test_a_layout_the_grader_does_not_feed_is_refused_naming_the_index(archive, tmp_path, field,
                                                                        names, said):
    other = dataclasses.replace(NOPROBE, **{field: tuple(names)})
    path = _restamped(archive, tmp_path, other.to_dict())
    with pytest.raises(ValueError) as refused:
        check_model(path, False, "none", "sb3:m.zip")
    assert str(refused.value) == f"sb3:m.zip was trained with {said}: refused"


def test_a_model_without_metadata_is_graded_with_one_note_per_arm(archive, tmp_path, capsys):
    bare = _restamped(archive, tmp_path, None)
    assert read_archive(bare) is None
    for _ in range(3):
        assert make_policy(f"sb3:{bare}", probe="full") is not None
    make_policy(f"sb3:{bare}")  # no arm: nothing checked, nothing said
    make_policy(f"sb3:{bare}", probe="identity")
    notes = capsys.readouterr().err.splitlines()
    assert notes == [f"note: sb3:{bare} does not say what it was trained for (no training "
                     f"metadata): graded on probe arm {arm}, as declared"
                     for arm in ("full", "identity")]
