"""RL Baselines3 Zoo trains on `Finality-v0` with the project's recipe (`train/zoo/ppo.yml`), and
the model it saves is graded with `sb3:` as that model, its `vecnormalize.pkl` applied.

The zoo runs as users run it (docs/training.md, "Training with RL Baselines3 Zoo"): its own
entry point, `python -m rl_zoo3.train`, in a process of its own from the repository root; the
grading is `python -m eval headline`. Each graded episode is checked against the same model
played by SB3's own `PPO.load` (and, for the normalized model, SB3's own `VecNormalize.load`) in
`gym.make("Finality-v0")`, torch seeded from the brief as `sb3:` seeds it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from rl_zoo3.utils import ALGOS, get_wrapper_class
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import finality_gym
from agents.learned.vecnormalize import normalization_file
from finality_gym.episode import compact_calls
from tests.learned.sb3_reference import played
from train.config import TrainConfig
from finality_gym.wrappers import RelativeGap

ROOT = Path(__file__).resolve().parents[2]
HYPERPARAMETERS = ROOT / "train" / "zoo" / "ppo.yml"
PUBLIC = finality_gym.load_corpus("public")
TASKS = tuple(t.task_id for t in PUBLIC.tasks[::40])  # 9 tasks across the archetypes
STEPS = 4096  # two rollouts of the recipe's 8 envs x 256 steps
REFUND = 12  # in the env's action table (FinalityEnv's docstring)


def _zoo_train(folder: Path, *params: str) -> Path:
    """Train with the zoo's own entry point, as docs/training.md says, for `STEPS`; `params`
    overrides hyperparameters (`-params key:value`). Returns the model the zoo saved."""
    command = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo",
               "--gym-packages", "finality_gym", "--env", "Finality-v0",
               "-conf", str(HYPERPARAMETERS.relative_to(ROOT)), "-f", str(folder),
               "--seed", "0", "-n", str(STEPS), "--device", "cpu", "--num-threads", "1",
               "--eval-freq", "-1", *(("-params", *params) if params else ())]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder / "ppo" / "Finality-v0_1" / "Finality-v0.zip"  # the zoo's layout


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A model trained by the zoo with the recipe, one with `normalize: true`, and the rows of
    one `python -m eval headline` grading both with `sb3:`, by spec."""
    base = tmp_path_factory.mktemp("zoo")
    models = {"plain": _zoo_train(base / "plain"),
              "normalized": _zoo_train(base / "normalized", "normalize:True")}
    specs = {name: f"sb3:{path}" for name, path in models.items()}
    out = base / "graded"
    command = [sys.executable, "-m", "eval", "headline", "--out", str(out), "--seeds", "1",
               "--tasks", ",".join(TASKS), "--policies", ",".join(specs.values()),
               "--workers", "1", "--no-progress"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    return models, {name: {r["task_id"]: r for r in rows if r["policy"] == spec}
                    for name, spec in specs.items()}


def _played(model, task_id: str, seed: int, normalize=None) -> list:
    """The calls of one episode as SB3 plays the model, as a row records them."""
    return json.loads(json.dumps(compact_calls(played(model, task_id, seed,
                                                      normalize=normalize).history)))


def test_the_hyperparameters_are_the_projects_recipe():
    """The zoo file holds `TrainConfig`'s PPO recipe for every env id, and the zoo knows PPO
    (MaskablePPO it does not: the file has no entry for it)."""
    config = TrainConfig(algo="ppo")
    recipe = {**config.hyperparameters, "gamma": config.gamma, "n_envs": config.n_envs,
              "n_timesteps": config.timesteps, "policy": "MlpPolicy",
              "policy_kwargs": {"net_arch": list(config.net_arch)},
              "env_wrapper": f"{RelativeGap.__module__}.{RelativeGap.__qualname__}"}
    entries = yaml.safe_load(HYPERPARAMETERS.read_text())
    assert set(entries) == set(finality_gym.ENV_IDS)
    for env_id, entry in entries.items():
        assert entry == recipe, env_id
    assert ALGOS["ppo"] is PPO and "maskable_ppo" not in ALGOS


def test_the_zoo_trains_on_the_relative_gap():
    """The wrapper the zoo builds from the file (its own `get_wrapper_class`) rewards minus the
    gap over the order value at the end, not the env's dollars: the recipe's reward."""
    wrap = get_wrapper_class(yaml.safe_load(HYPERPARAMETERS.read_text())["Finality-v0"])
    env = wrap(gym.make("Finality-v0"))
    rewards = []
    for task_id in TASKS:
        env.reset(options={"task_id": task_id, "fault_seed": 0})
        _, reward, terminated, _, _ = env.step(REFUND)
        record = env.unwrapped.episode.record()
        assert terminated and reward == -record.gap / record.order_value, task_id
        rewards.append((reward, -record.gap / 100 / env.unwrapped.reward_scale))
    assert any(relative != dollars for relative, dollars in rewards)  # the wrapper changed it


def test_the_zoo_saves_a_model_graded_as_that_model(graded):
    """The zoo's final model, graded with `sb3:`, plays every episode as SB3 plays it; the zoo
    recorded the recipe's wrapper with the run."""
    models, rows = graded
    path = models["plain"]
    assert not (path.parent / "Finality-v0" / "vecnormalize.pkl").exists()
    # the zoo's config.yml: an OrderedDict of the hyperparameters, as [key, value] pairs under
    # a tag for Python's class, which safe_load refuses
    tag, pairs = (path.parent / "Finality-v0" / "config.yml").read_text().split("\n", 1)
    assert tag == "!!python/object/apply:collections.OrderedDict"
    assert dict(yaml.safe_load(pairs)[0])["env_wrapper"] == "finality_gym.wrappers.RelativeGap"
    assert set(rows["plain"]) == set(TASKS)
    sb3_model = PPO.load(path, device="cpu")
    for task_id, row in rows["plain"].items():
        assert row["calls"] == _played(sb3_model, task_id, 0), task_id


def test_the_zoos_vecnormalize_is_applied(graded):
    """With `normalize: true` the zoo saves `<run>/Finality-v0/vecnormalize.pkl`; `sb3:` finds it
    beside the model and acts on observations normalized as SB3's own `VecNormalize.load` does,
    which is not how the model acts on raw ones."""
    models, rows = graded
    path = models["normalized"]
    stats = VecNormalize.load(path.parent / "Finality-v0" / "vecnormalize.pkl",
                              DummyVecEnv([lambda: gym.make("Finality-v0")]))
    stats.training = False
    sb3_model = PPO.load(path, device="cpu")
    raw_differs = False
    assert set(rows["normalized"]) == set(TASKS)
    for task_id, row in rows["normalized"].items():
        assert row["calls"] == _played(sb3_model, task_id, 0, stats.normalize_obs), task_id
        raw_differs |= row["calls"] != _played(sb3_model, task_id, 0)
    assert raw_differs


def test_every_layout_of_saved_statistics_is_found(tmp_path):
    """Statistics saved with a model are found wherever SB3 and the zoo save them (a zoo run of
    an env registered under another id too, and an SB3 checkpoint's own), never another
    model's; two are refused."""
    def saved(*paths: str) -> list[Path]:
        for path in paths:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).touch()
        return [tmp_path / path for path in paths]

    run = "logs/ppo/MyFinality-v0_3_0123abcd-0123-4567-89ab-0123456789ab"
    stats, *models = saved(f"{run}/MyFinality-v0/vecnormalize.pkl", f"{run}/MyFinality-v0.zip",
                           f"{run}/best_model.zip", f"{run}/rl_model_4096_steps.zip")
    assert [normalization_file(model) for model in models] == [stats] * 3
    stats, model, later = saved("ckpt/ppo_vecnormalize_1000_steps.pkl", "ckpt/ppo_1000_steps.zip",
                                "ckpt/ppo_2000_steps.zip")
    assert normalization_file(model) == stats and normalization_file(later) is None
    _, model = saved("runs/other/vecnormalize.pkl", "runs/model.zip")
    assert normalization_file(model) is None
    saved("ckpt/vecnormalize.pkl")
    with pytest.raises(ValueError, match="has 2 observation normalizations saved with it"):
        normalization_file(tmp_path / "ckpt" / "ppo_1000_steps.zip")
