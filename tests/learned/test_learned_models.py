"""A saved model is checked at load against the env the `ppo:` spec grades it in: its algorithm,
its observation space and its action space, each refused with a one-line error naming the file.
`sb3:` loads the same models the same way (`tests/learned/test_sb3_specs.py` covers its other
algorithms)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from stable_baselines3 import A2C, PPO

import finality_gym
from agents import make_policy, run_episode
from agents.learned.policy import load_sb3
from eval.__main__ import main as eval_cli

PUBLIC = finality_gym.load_corpus("public")


class OtherBounds(gym.Env):
    """Finality's shapes with other observation bounds: only the loaded spaces tell it apart."""

    observation_space = spaces.Box(-1, 1, (58,), dtype=np.float32)
    action_space = spaces.Discrete(16)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Untrained models, saved: what is checked is what a model was built for, not its skill."""
    folder = tmp_path_factory.mktemp("models")
    built = {
        "ppo": PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, device="cpu"),
        "maskable": MaskablePPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, device="cpu"),
        "other_waits": PPO("MlpPolicy", gym.make("Finality-v0", wait_ticks=(10, 30)), n_steps=64,
                           device="cpu"),
        "a2c": A2C("MlpPolicy", gym.make("Finality-v0"), device="cpu"),
        "cartpole": PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, device="cpu"),
        "other_bounds": PPO("MlpPolicy", OtherBounds(), n_steps=64, device="cpu"),
    }
    for name, model in built.items():
        model.save(folder / f"{name}.zip")
    return {name: folder / f"{name}.zip" for name in built}


@pytest.mark.parametrize("kind", ["ppo", "sb3"])
@pytest.mark.parametrize("name", ["ppo", "maskable"])
def test_a_model_of_finality_loads_and_acts(models, name, kind):
    policy = make_policy(f"{kind}:{models[name]}")
    assert policy.name == f"{kind}:{models[name]}"
    record = run_episode(policy, PUBLIC.tasks[0], 0)
    assert record.disposition in ("ship", "refund", "write_off", "escalate", "close")


@pytest.mark.parametrize("name, problem", [
    ("other_waits", "was trained with action space Discrete(14); Finality's is Discrete(16) "
                    "(wait_ticks (10, 30, 60, 120))"),
    ("a2c", "was trained by A2C, not PPO or MaskablePPO: grade it with sb3:{path}"),
    ("cartpole", "was trained with observation space Box(shape (4,), float32); Finality's is "
                 "Box(shape (58,), float32)"),
    ("other_bounds", "was trained with observation space bounds other than Finality's "
                     "Box(shape (58,), float32)"),
])
def test_a_model_for_something_else_is_refused_by_the_grader(models, name, problem, tmp_path,
                                                             capsys):
    out = tmp_path / "headline"
    assert eval_cli(["headline", "--policies", f"ppo:{models[name]}", "--seeds", "1",
                     "--workers", "1", "--no-progress", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"error: {models[name]} {problem.format(path=models[name])}\n" in error
    assert not out.exists()
    with pytest.raises(ValueError, match="not PPO" if name == "a2c" else "Finality's"):
        load_sb3(models[name], greedy=True)
