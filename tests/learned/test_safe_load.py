"""A saved model is loaded as data: no pickle inside its archive, or in the `vecnormalize.pkl`
saved with it, runs in the grader's process (`agents/learned/policy.py`), and the policy built from
the archive's data acts exactly as the model SB3's own `load` makes. Each attack plants a payload
that creates a marker file when it is unpickled: loaded the default way, the marker never
appears; unpickled (`allow_pickle=True`, `pickle.load`, `torch.load(weights_only=False)`), it
does, so every test here can fail."""

import base64
import contextlib
import io
import json
import pickle
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3 import PPO
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import finality_gym
from tests.learned.sb3_reference import played
from agents import make_policy, run_episode
from agents.learned.policy import load_sb3
from eval.__main__ import main as eval_cli
from eval.grading.grader import RunConfig, grade_in_process
from finality_gym.registration import ENV_IDS

PUBLIC = finality_gym.load_corpus("public")
TASKS = tuple(t.task_id for t in PUBLIC.tasks[::32])  # 11 tasks across the archetypes
MODELS = Path(__file__).resolve().parents[2] / "models"
# Each shipped model, its algorithm and the env id of its probe arm.
SHIPPED = {"ppo_full.zip": (PPO, "Finality-v0"),
           "ppo_noprobe.zip": (MaskablePPO, "FinalityNoProbe-v0")}
NET = {"net_arch": [16]}


class Payload:
    """Creates `marker` when unpickled: a pickle may call any function it names, here `open`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class Extractor(BaseFeaturesExtractor):
    """A features extractor of the submitter's own: SB3 saves its class only as a pickle."""

    def __init__(self, observation_space, features_dim: int = 8):
        super().__init__(observation_space, features_dim)
        self.layer = torch.nn.Linear(observation_space.shape[0], features_dim)

    def forward(self, observations):
        return self.layer(observations)


class Softish(torch.nn.Module):
    """An activation of the submitter's own."""

    def forward(self, x):
        return x / (1 + x.abs())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """An untrained PPO model, saved: what is checked is how it is loaded."""
    path = tmp_path_factory.mktemp("model") / "ppo.zip"
    PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, policy_kwargs=dict(NET), seed=0,
        device="cpu").save(path)
    return path


def _rewritten(source: Path, target: Path, data=None, files: dict | None = None) -> Path:
    """`source` with its `data` JSON edited by `data(dict)` and members replaced by `files`."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            content = src.read(item.filename)
            if item.filename == "data" and data is not None:
                parsed = json.loads(content)
                data(parsed)
                content = json.dumps(parsed).encode()
            dst.writestr(item, (files or {}).get(item.filename, content))
    return target


def _pickled(obj) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode()


# Where the red team put its payload: a field SB3 unpickles and keeps (`_last_obs`), the
# policy's arguments (whose plain fields the loader does read) and the policy class itself.
PLANTS = {
    "_last_obs": lambda data, payload: data.update(
        _last_obs={":type:": "<class 'numpy.ndarray'>", ":serialized:": _pickled(payload)}),
    "policy_kwargs": lambda data, payload: data.update(policy_kwargs={
        ":type:": "<class 'dict'>", ":serialized:": _pickled(payload), **data["policy_kwargs"]}),
    "policy_class": lambda data, payload: data["policy_class"].update(
        {":serialized:": _pickled(payload)}),
}


@pytest.mark.parametrize("field", PLANTS)
def test_a_pickle_in_data_never_runs(model, tmp_path, field):
    marker = tmp_path / "marker"
    path = _rewritten(model, tmp_path / "ppo.zip", lambda d: PLANTS[field](d, Payload(marker)))
    for kind in ("ppo", "sb3", "ppo-greedy", "sb3-greedy"):
        policy = make_policy(f"{kind}:{path}")
        assert run_episode(policy, PUBLIC.task(TASKS[0]), 0).disposition
    assert not marker.exists()
    with contextlib.suppress(ValueError):  # a payload in place of the class breaks SB3's load
        make_policy(f"sb3:{path}", allow_pickle=True)
    assert marker.exists()


def test_a_pickle_in_data_never_runs_under_the_grader(model, tmp_path):
    marker = tmp_path / "marker"
    path = _rewritten(model, tmp_path / "ppo.zip",
                      lambda d: PLANTS["_last_obs"](d, Payload(marker)))
    out = tmp_path / "headline"
    assert eval_cli(["headline", "--policies", f"ppo:{path},sb3:{path}", "--seeds", "1",
                     "--tasks", ",".join(TASKS[:2]), "--out", str(out), "--no-progress",
                     "--sandbox", "off", "--workers", "1"]) == 0
    assert not marker.exists()
    assert "trust_pickles" not in json.loads((out / "run.json").read_text())


def test_the_unpickling_loader_is_explicit_recorded_and_never_private(model, tmp_path, capsys):
    """`--trust-pickles` runs the archive's code (so it is said in run.json and the report),
    and the private split refuses it before anything runs."""
    marker = tmp_path / "marker"
    path = _rewritten(model, tmp_path / "ppo.zip",
                      lambda d: PLANTS["_last_obs"](d, Payload(marker)))
    common = ["headline", "--policies", f"sb3:{path}", "--seeds", "1", "--tasks",
              ",".join(TASKS[:2]), "--no-progress", "--workers", "1", "--trust-pickles"]
    seed = tmp_path / "seed"
    seed.write_text(str(0x1ba96c7235734ea48d5748fdfdff0f0cf))  # 128 random bits
    assert eval_cli([*common, "--split", "private", "--master-seed-file", str(seed), "--out",
                     str(tmp_path / "private")]) == 2
    assert "--trust-pickles is refused for --split private" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "private" / "episodes.jsonl").exists()
    out = tmp_path / "trusted"
    assert eval_cli([*common, "--out", str(out)]) == 0
    assert marker.exists()
    assert json.loads((out / "run.json").read_text())["trust_pickles"] is True
    assert "**Models unpickled** (`--trust-pickles`)" in (out / "report.md").read_text()


def test_a_pickle_in_the_weights_is_refused(model, tmp_path):
    marker = tmp_path / "marker"
    with zipfile.ZipFile(model) as archive:
        state = torch.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)
    weights = io.BytesIO()
    torch.save({**state, "payload": Payload(marker)}, weights)
    path = _rewritten(model, tmp_path / "ppo.zip", files={"policy.pth": weights.getvalue()})
    for kind in ("ppo", "sb3"):
        with pytest.raises(ValueError, match=f"{path} could not be loaded as PPO: its policy.pth "
                                             "is not plain tensors"):
            make_policy(f"{kind}:{path}")
    assert not marker.exists()
    torch.load(io.BytesIO(weights.getvalue()), weights_only=False)
    assert marker.exists()


def _sensitive(model):
    """`model` with its action head drawn anew, large, so that what it sees shows in what it
    does: a barely trained policy samples nearly uniformly, and its greedy action is the same,
    whatever it sees."""
    with torch.no_grad():
        model.policy.action_net.weight.copy_(10 * torch.randn(
            model.policy.action_net.weight.shape, generator=torch.Generator().manual_seed(0)))
    return model


def _normalized(tmp_path: Path, clip_obs: float = 2.0):
    """A PPO model trained a few hundred steps on normalized observations, saved with its
    `vecnormalize.pkl` as stable-baselines3 users do; and the VecNormalize."""
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Finality-v0")]), norm_reward=False,
                        clip_obs=clip_obs)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1,
                policy_kwargs=dict(NET), seed=0, device="cpu").learn(320)
    _sensitive(model).save(tmp_path / "model.zip")
    return tmp_path / "model.zip", venv


def test_a_pickle_beside_the_model_never_runs(tmp_path, model):
    """A `vecnormalize.pkl` that is a payload is refused; a real one with a payload inside is
    applied, and the payload never runs."""
    marker = tmp_path / "marker"
    folder = tmp_path / "forged"
    folder.mkdir()
    path = _rewritten(model, folder / "ppo.zip")
    (folder / "vecnormalize.pkl").write_bytes(pickle.dumps(Payload(marker)))
    for kind in ("ppo", "sb3"):
        with pytest.raises(ValueError, match="is not a VecNormalize of stable-baselines3 read as "
                                             "data .it holds a io.open"):
            make_policy(f"{kind}:{path}")
    assert not marker.exists()

    path, venv = _normalized(tmp_path)
    venv.payload = Payload(marker)
    zoo = tmp_path / "Finality-v0"  # where RL Baselines3 Zoo saves it
    zoo.mkdir()
    venv.save(zoo / "vecnormalize.pkl")
    assert run_episode(make_policy(f"sb3:{path}"), PUBLIC.task(TASKS[0]), 0).disposition
    assert not marker.exists()
    VecNormalize.load(zoo / "vecnormalize.pkl", DummyVecEnv([lambda: gym.make("Finality-v0")]))
    assert marker.exists()

    venv.save(tmp_path / "vecnormalize.pkl")
    with pytest.raises(ValueError, match="has 2 observation normalizations saved with it"):
        make_policy(f"sb3:{path}")


def _played(model, task_id: str, seed: int, greedy: bool, normalize=None) -> dict:
    """One episode's record as SB3 plays the model (`tests/learned/sb3_reference.py`)."""
    return played(model, task_id, seed, greedy, normalize).record().to_dict()


@pytest.mark.parametrize("greedy", [False, True])
def test_a_normalized_model_acts_on_normalized_observations(tmp_path, greedy):
    """`sb3:` applies the `vecnormalize.pkl` saved beside a model as SB3's VecNormalize does at
    evaluation (statistics frozen), and without it the model would act otherwise."""
    path, venv = _normalized(tmp_path)
    venv.save(tmp_path / "vecnormalize.pkl")
    saved = VecNormalize.load(tmp_path / "vecnormalize.pkl",
                              DummyVecEnv([lambda: gym.make("Finality-v0")]))
    saved.training = False
    sb3_model = PPO.load(path, device="cpu")
    policy = make_policy(f"sb3{'-greedy' if greedy else ''}:{path}")
    raw_differs = False
    for task_id in TASKS:
        graded = run_episode(policy, PUBLIC.task(task_id), 0).to_dict()
        assert graded == _played(sb3_model, task_id, 0, greedy, saved.normalize_obs), task_id
        raw_differs |= graded != _played(sb3_model, task_id, 0, greedy)
    assert raw_differs


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_model_acts_as_sb3_loads_it(name):
    """Action by action, under the same torch seed, against SB3's `load` and `predict` (with
    the masks, for MaskablePPO); and row by row through the grader against `allow_pickle=True`,
    the loader it replaced."""
    path = MODELS / name
    cls, env_id = SHIPPED[name]
    sb3_model = cls.load(path, device="cpu")
    env = gym.make(env_id)
    env.action_space.seed(0)
    observations, masks = [], []
    for task_id in TASKS:
        obs, _ = env.reset(options={"task_id": task_id, "fault_seed": 0})
        for _ in range(10):
            observations.append(obs)
            masks.append(env.unwrapped.action_masks())
            action = env.action_space.sample(masks[-1].astype(np.int8))
            obs, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                break
    extra = (lambda mask: {"action_masks": mask}) if cls is MaskablePPO else (lambda mask: {})
    for greedy in (False, True):
        policy = load_sb3(path, greedy=greedy, kind="sb3")
        if not greedy:  # a greedy policy draws nothing: it has no sampler to seed
            policy.start(7)
        ours = [policy.predict(obs, mask) for obs, mask in zip(observations, masks)]
        torch.manual_seed(7)
        theirs = [int(sb3_model.predict(obs, deterministic=greedy, **extra(mask))[0])
                  for obs, mask in zip(observations, masks)]
        assert ours == theirs
        assert greedy or len(set(ours)) > 1  # sampled: the comparison tests the sampling
    for kind in ("ppo", "ppo-greedy", "sb3", "sb3-greedy"):
        spec = f"{kind}:{path}"
        config = RunConfig(policies=(spec,), seeds=(0, 1), probe=ENV_IDS[env_id], tasks=TASKS)
        rows = grade_in_process(make_policy(spec), spec, config)
        unpickled = grade_in_process(make_policy(spec, allow_pickle=True), spec, config)
        assert json.dumps(rows) == json.dumps(unpickled)


def test_an_argument_saved_only_as_a_pickle_is_refused_by_name(tmp_path):
    env = gym.make("Finality-v0")
    for field, kwargs in (("features_extractor_class", {"features_extractor_class": Extractor}),
                          ("activation_fn", {"activation_fn": Softish})):
        path = tmp_path / f"{field}.zip"
        PPO("MlpPolicy", env, n_steps=64, policy_kwargs={**NET, **kwargs}, device="cpu").save(path)
        with pytest.raises(ValueError, match=f"{path}'s policy_kwargs '{field}' is <class "
                                             f"'{__name__}.{kwargs[field].__name__}'>, saved "
                                             "only as a pickle, which the grader does not load"):
            make_policy(f"sb3:{path}")
        assert make_policy(f"sb3:{path}", allow_pickle=True).name == f"sb3:{path}"


def test_arguments_saved_as_a_pickle_are_rebuilt_from_their_text(tmp_path):
    """A torch activation and per-head layers (kept only as a pickle once a class is among the
    arguments) are rebuilt: the policy predicts as SB3's loaded model."""
    path = tmp_path / "relu.zip"
    _sensitive(PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, device="cpu", policy_kwargs={
        "activation_fn": torch.nn.ReLU, "net_arch": {"pi": [8, 8], "vf": [4]}})).save(path)
    sb3_model = PPO.load(path, device="cpu")
    observations = np.random.default_rng(0).uniform(0, 1, (50, 58)).astype(np.float32)
    for greedy in (False, True):
        policy = load_sb3(path, greedy=greedy, kind="sb3")
        if not greedy:
            policy.start(3)
        ours = [policy.predict(obs, None) for obs in observations]
        torch.manual_seed(3)
        assert ours == [int(sb3_model.predict(obs, deterministic=greedy)[0])
                        for obs in observations]
