"""`onnx:PATH` and `onnx-greedy:PATH` play a policy network exported to ONNX as `sb3:` plays the
model itself, and `python -m train export` writes such a graph from any algorithm `sb3:` grades.

The shipped PPO model and tiny freshly trained models (A2C, DQN, MaskablePPO, RecurrentPPO: a
plain actor, Q-values, the mask input, the recurrent state) are exported by the real exporter,
run by the real onnxruntime and graded beside `sb3:` on tasks across the archetypes; a CleanRL
style actor exported by hand as a user would is graded against the same actor in torch. Graphs
outside the contract are refused by name, before anything is written."""

import hashlib
import re
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.maskable.distributions import MaskableCategorical
from stable_baselines3 import A2C, DQN
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import finality_gym
from agents import make_policy
from finality_gym.policy import GymPolicy
from agents.learned.onnx_policy import Exponentials, probabilities
from eval.grading.grader import RunConfig, grade, grade_in_process, input_identity
from eval.grading.runfolder import read_rows
from train.__main__ import main as train_cli
from train.export import export

PUBLIC = finality_gym.load_corpus("public")
TASKS = tuple(t.task_id for t in PUBLIC.tasks[::16])  # 21 tasks across the archetypes
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_full.zip"
NET = {"net_arch": [16]}
OBS_DIM = 58  # Finality-v0's observation, checked against the env below


def _rows(specs, out, probe="full") -> dict[str, dict[str, dict]]:
    """{spec: {task id: row without the policy's name}}, graded in this process."""
    grade(RunConfig(tuple(specs), seeds=(0,), tasks=TASKS, probe=probe), out, workers=1,
          progress=False)
    graded: dict = {}
    for row in read_rows(out / "episodes.jsonl"):  # whole, with their calls
        graded.setdefault(row["policy"], {})[row["task_id"]] = {**row, "policy": ""}
    return graded


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (archive, exported graph)}: the shipped PPO model through the CLI, tiny models of
    four other algorithms through `export`."""
    folder = tmp_path_factory.mktemp("onnx")
    env = gym.make("Finality-v0")
    tiny = {
        "a2c": A2C("MlpPolicy", env, n_steps=8, policy_kwargs=NET, seed=0, device="cpu"),
        "dqn": DQN("MlpPolicy", env, policy_kwargs=NET, learning_starts=50, buffer_size=1_000,
                   batch_size=16, seed=0, device="cpu"),
        "maskable": MaskablePPO("MlpPolicy", gym.make("FinalityNoProbe-v0"), n_steps=64,
                                batch_size=64, n_epochs=1, policy_kwargs=NET, seed=0,
                                device="cpu"),
        "recurrent": RecurrentPPO("MlpLstmPolicy", env, n_steps=64, batch_size=64, n_epochs=1,
                                  policy_kwargs={**NET, "lstm_hidden_size": 16}, seed=0,
                                  device="cpu"),
    }
    paths = {"ppo": (folder / "ppo_full.zip", folder / "ppo_full.onnx")}
    shutil.copy(SHIPPED, paths["ppo"][0])
    assert train_cli(["export", str(paths["ppo"][0]), "--onnx", str(paths["ppo"][1])]) == 0
    for name, model in tiny.items():
        model.learn(300 if name == "dqn" else 64)
        model.save(folder / f"{name}.zip")
        paths[name] = (folder / f"{name}.zip", folder / f"{name}.onnx")
        export(*paths[name])
    return paths


def test_the_exported_graphs_follow_the_contract(models):
    import onnxruntime as ort
    assert gym.make("Finality-v0").observation_space.shape == (OBS_DIM,)
    expected = {"ppo": ({"obs"}, {"logits"}), "a2c": ({"obs"}, {"logits"}),
                "dqn": ({"obs"}, {"q_values"}), "maskable": ({"obs", "action_mask"}, {"logits"}),
                "recurrent": ({"obs", "state_in"}, {"logits", "state_out"})}
    for name, (_, graph) in models.items():
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}
        assert (set(inputs), set(outputs)) == expected[name], name
        assert inputs["obs"].shape == ["batch", OBS_DIM] and inputs["obs"].type == "tensor(float)"
        feed = {"obs": np.zeros((5, OBS_DIM), dtype=np.float32)}  # a batch of 5
        if "action_mask" in inputs:
            feed["action_mask"] = np.ones((5, 16), dtype=bool)
        if "state_in" in inputs:
            feed["state_in"] = np.zeros((5, *inputs["state_in"].shape[1:]), dtype=np.float32)
        first = session.run(None, feed)[0]
        assert first.shape == (5, 16) and first.dtype == np.float32
        assert {o.domain for o in onnx.load(str(graph)).opset_import} <= {"", "ai.onnx"}


def test_greedy_rows_are_those_of_sb3_greedy(models, tmp_path):
    specs = [f"{kind}:{models[name][i]}" for name in models
             for kind, i in (("sb3-greedy", 0), ("onnx-greedy", 1))]
    graded = _rows(specs, tmp_path)
    for name, (archive, graph) in models.items():
        differ = [t for t in TASKS if graded[f"sb3-greedy:{archive}"][t]
                  != graded[f"onnx-greedy:{graph}"][t]]
        assert not differ, f"{name}: onnx-greedy: plays otherwise than sb3-greedy: on {differ}"


def test_sampled_rows_are_those_of_sb3(models, tmp_path):
    """The same generator stream, and probabilities that agree to float precision here (a near
    tie between two actions could tell them apart: docs/usage.md counts how often it did)."""
    specs = [f"{kind}:{models[name][i]}" for name in models
             for kind, i in (("sb3", 0), ("onnx", 1))]
    graded = _rows(specs, tmp_path)
    for name, (archive, graph) in models.items():
        ours, theirs = graded[f"onnx:{graph}"], graded[f"sb3:{archive}"]
        differ = [t for t in TASKS if ours[t] != theirs[t]]
        assert not differ, f"{name}: onnx: plays otherwise than sb3: on {differ}"
    # sampled, not greedy: the tiny A2C's sampled episodes are not its greedy ones
    graph = models["a2c"][1]
    assert _rows([f"onnx-greedy:{graph}"], tmp_path / "greedy")[f"onnx-greedy:{graph}"] != \
        graded[f"onnx:{graph}"]


def test_a_maskable_model_plays_as_sb3_plays_it_where_the_mask_bites(models, tmp_path):
    """In the no-probe arm the probe is masked at every step (the model was trained there)."""
    archive, graph = models["maskable"]
    specs = [f"sb3:{archive}", f"onnx:{graph}", f"sb3-greedy:{archive}", f"onnx-greedy:{graph}"]
    graded = _rows(specs, tmp_path, probe="none")
    assert graded[specs[0]] == graded[specs[1]] and graded[specs[2]] == graded[specs[3]]
    calls = [call[1] for row in graded[specs[1]].values() for call in row["calls"]]
    assert "probe_processor" not in calls and len(set(calls)) > 5


@pytest.mark.parametrize("masked", [False, True])
def test_the_sampler_picks_what_sb3s_categorical_samples(masked):
    rng = np.random.default_rng(1)
    draws = Exponentials(16)
    for seed in range(400):
        logits = (rng.normal(size=16) * rng.choice([0.1, 1.0, 5.0])).astype(np.float32)
        mask = rng.random(16) < 0.7 if masked else None
        if masked:
            mask[rng.integers(16)] = True
        draws.seed(seed)
        torch.manual_seed(seed)
        if masked:  # MaskablePPO's distribution; PPO's is torch's (SB3's CategoricalDistribution)
            distribution = MaskableCategorical(logits=torch.from_numpy(logits)[None])
            distribution.apply_masking(torch.from_numpy(mask)[None])
        else:
            distribution = torch.distributions.Categorical(logits=torch.from_numpy(logits)[None])
        for _ in range(3):  # the draws of a step, then of the next ones
            theirs = int(distribution.sample())
            ours = int(np.argmax(probabilities(logits, mask) / draws.draw()))
            assert ours == theirs, (seed, logits, mask)
            assert not masked or mask[ours]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter's notice
def test_a_hand_exported_cleanrl_actor_plays_as_it_does_in_torch(tmp_path):
    """A CleanRL-style agent: an `nn.Sequential` actor, exported by hand as its user would."""
    torch.manual_seed(3)
    actor = torch.nn.Sequential(torch.nn.Linear(OBS_DIM, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 16))
    with torch.no_grad():
        actor[-1].weight.mul_(20)  # a policy that prefers some actions, not a uniform one
    path = tmp_path / "cleanrl.onnx"
    torch.onnx.export(actor, torch.zeros(1, OBS_DIM), str(path), input_names=["obs"],
                      output_names=["logits"], dynamic_axes={"obs": {0: "n"}, "logits": {0: "n"}},
                      dynamo=False)

    def act(obs: np.ndarray, mask: np.ndarray) -> int:
        with torch.no_grad():
            logits = actor(torch.from_numpy(obs)[None])
        return int(torch.distributions.Categorical(logits=logits).sample())

    config = RunConfig(("cleanrl",), seeds=(0,), tasks=TASKS)
    in_torch = grade_in_process(GymPolicy("cleanrl", act, start=torch.manual_seed), "cleanrl",
                                config)
    graded = _rows([f"onnx:{path}"], tmp_path / "graded")[f"onnx:{path}"]
    assert [graded[row["task_id"]] for row in in_torch] == [{**row, "policy": ""}
                                                            for row in in_torch]
    assert len({row["disposition"] for row in in_torch}) > 1  # it acts on what it sees


def test_a_float_mask_is_fed_and_the_masked_actions_are_never_taken(tmp_path):
    """A graph that prefers exactly the masked actions (logits -10 x the mask, given as
    float32): in the no-probe arm every allowed action has -10 and the probe 0, so only the
    runner's masking keeps it from calling the probe."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [-10.0])
    path = _graph(tmp_path, "float_mask", [("obs", TensorProto.FLOAT, ["n", OBS_DIM]),
                                           ("action_mask", TensorProto.FLOAT, ["n", 16])],
                  [("logits", TensorProto.FLOAT, ["n", 16])],
                  [helper.make_node("Constant", [], ["scale"], value=scale),
                   helper.make_node("Mul", ["action_mask", "scale"], ["logits"])])
    for kind in ("onnx", "onnx-greedy"):
        grade(RunConfig((f"{kind}:{path}",), seeds=(0,), tasks=TASKS, probe="none"),
              tmp_path / kind, workers=1, progress=False)
        rows = read_rows(tmp_path / kind / "episodes.jsonl")
        tools = [call[1] for row in rows for call in row["calls"]]
        assert len(tools) > len(rows) and "probe_processor" not in tools, kind


def test_a_run_folder_exports_its_best_model(models, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(models["a2c"][0], run / "best_model.zip")
    assert train_cli(["export", str(run), "--onnx", str(tmp_path / "best.onnx")]) == 0
    assert "exported A2C" in capsys.readouterr().out
    make_policy(f"onnx:{tmp_path / 'best.onnx'}")
    assert train_cli(["export", str(tmp_path), "--onnx", str(tmp_path / "x.onnx")]) == 2
    assert "holds no best_model.zip" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_export_refuses_a_model_saved_with_a_normalization(models, tmp_path):
    folder = tmp_path / "normalized"
    folder.mkdir()
    shutil.copy(models["a2c"][0], folder / "model.zip")
    VecNormalize(DummyVecEnv([lambda: gym.make("Finality-v0")])).save(folder / "vecnormalize.pkl")
    with pytest.raises(ValueError, match="observation normalization"):
        export(folder / "model.zip", folder / "model.onnx")
    assert sorted(p.name for p in folder.iterdir()) == ["model.zip", "vecnormalize.pkl"]


def test_the_spec_hashes_the_graph_alone(models, tmp_path):
    graph = tmp_path / "model.onnx"
    shutil.copy(models["ppo"][1], graph)
    (tmp_path / "vecnormalize.pkl").write_bytes(b"not part of an ONNX policy")
    assert input_identity(f"onnx:{graph}") == hashlib.sha256(graph.read_bytes()).hexdigest()
    assert input_identity(f"onnx-greedy:{graph}") == input_identity(f"onnx:{graph}")


def _graph(tmp_path, name, inputs, outputs, nodes, domains=(("", 17),)):
    """A hand-built graph: `inputs` and `outputs` as (name, element type, shape)."""
    model = helper.make_model(
        helper.make_graph(nodes, name, [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs]),
        opset_imports=[helper.make_opsetid(d, v) for d, v in domains])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _linear(width: int, actions: int, obs: str = "obs", out: str = "logits") -> list:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [width, actions],
                                np.zeros(width * actions, dtype=np.float32))
    return [helper.make_node("Constant", [], ["w"], value=weight),
            helper.make_node("MatMul", [obs, "w"], [out])]


def _refused(tmp_path) -> dict[str, tuple]:
    """{what: (graph, the words its refusal must say)} for hand-built graphs outside the
    contract."""
    obs = ("obs", TensorProto.FLOAT, ["n", OBS_DIM])
    logits = ("logits", TensorProto.FLOAT, ["n", 16])
    return {
        "custom_domain": (_graph(tmp_path, "custom", [obs], [logits], [helper.make_node(
            "Policy", ["obs"], ["logits"], domain="com.example")],
            (("", 17), ("com.example", 1))), "operator domain(s) com.example"),
        "narrow_obs": (_graph(tmp_path, "narrow", [("obs", TensorProto.FLOAT, ["n", 57])],
                              [logits], _linear(57, 16)), "[N, 58]"),
        "few_actions": (_graph(tmp_path, "few", [obs], [("logits", TensorProto.FLOAT, ["n", 15])],
                               _linear(OBS_DIM, 15)), "[N, 16]"),
        "double_obs": (_graph(tmp_path, "double", [("obs", TensorProto.DOUBLE, ["n", OBS_DIM])],
                              [("logits", TensorProto.DOUBLE, ["n", OBS_DIM])],
                              [helper.make_node("Identity", ["obs"], ["logits"])]),
                       "tensor(double)"),
        "other_input": (_graph(tmp_path, "other", [("observation", TensorProto.FLOAT,
                                                     ["n", OBS_DIM])], [logits],
                               _linear(OBS_DIM, 16, obs="observation")), "observation"),
        "other_output": (_graph(tmp_path, "probs", [obs], [("probs", TensorProto.FLOAT,
                                                             ["n", 16])],
                                _linear(OBS_DIM, 16, out="probs")), "one of logits or q_values"),
        "state_in_alone": (_graph(tmp_path, "stateless", [obs, ("state_in", TensorProto.FLOAT,
                                                                 ["n", 4])], [logits],
                                  _linear(OBS_DIM, 16)), "state_in without state_out"),
    }


def test_graphs_outside_the_contract_are_refused_by_name_and_change_nothing(models, tmp_path):
    external = tmp_path / "external.onnx"
    onnx.save_model(onnx.load(str(models["ppo"][1])), str(external), save_as_external_data=True,
                    location="weights.bin", all_tensors_to_one_file=True, size_threshold=0)
    refused = _refused(tmp_path) | {"external_data": (external, "external data")}
    out = tmp_path / "graded"
    config = RunConfig(("do_nothing",), seeds=(0,), tasks=TASKS[:2])
    grade(config, out, workers=1, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for what, (graph, words) in refused.items():
        for kind in ("onnx", "onnx-greedy"):
            with pytest.raises(ValueError) as caught:
                make_policy(f"{kind}:{graph}")
            assert words in str(caught.value) and str(graph) in str(caught.value), what
            with pytest.raises(ValueError, match=re.escape(words)):
                grade(RunConfig(("do_nothing", f"{kind}:{graph}"), seeds=(0,), tasks=TASKS[:2]),
                      out, workers=1, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert len(read_rows(out / "episodes.jsonl")) == 2
