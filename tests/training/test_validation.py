"""The practitioner's pieces in the installed package: the training reward (`reward="relative"`
and `finality_gym.wrappers.RelativeGap`), the graded validation (`finality_gym.validation`) and
the stable-baselines3 callback (`finality_gym.callbacks`), which `python -m train` uses too."""

import gymnasium as gym
import numpy as np
import pytest
from sb3_contrib import MaskablePPO
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import finality_gym
from agents.learned.policy import sb3_policy
from eval.grading.grader import RunConfig, grade_in_process
from finality_gym.callbacks import ValidationCallback
from finality_gym.policy import GymPolicy, PolicyError
from finality_gym.validation import VALIDATION_SEED, validate, validation_tasks
from finality_gym.wrappers import RelativeGap
from train.__main__ import main as train_cli
from train.config import TrainConfig
from train.run import ValidationCallback as RunValidation
from train.run import make_envs


def _rewards(env, seed: int, steps: int = 400) -> list[tuple[float, int, int]]:
    """(reward, gap, order value) at every end of random play."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    out = []
    for _ in range(steps):
        _, reward, terminated, truncated, info = env.step(int(rng.integers(16)))
        if terminated or truncated:
            out.append((reward, int(info["gap"]), int(info["order_value"])))
            env.reset()
    return out


def test_the_training_reward_is_minus_the_gap_over_the_order_value():
    """The env option and the wrapper give the same reward, -gap / order value, at every end;
    it differs from the dollar reward wherever the gap is not zero; train/ trains on it."""
    option = _rewards(gym.make("Finality-v0", reward="relative"), 3)
    wrapped = _rewards(RelativeGap(gym.make("Finality-v0")), 3)
    dollars = _rewards(gym.make("Finality-v0"), 3)
    assert option == wrapped and len(option) > 30
    assert all(r == -gap / value for r, gap, value in option)
    assert [g for _, g, _ in dollars] == [g for _, g, _ in option]  # the same episodes
    assert any(a != b for (a, *_), (b, *_) in zip(option, dollars))
    envs = make_envs(TrainConfig(n_envs=2))
    assert all(env.unwrapped.reward == "relative" for env in envs.envs)


def _scripted(obs: np.ndarray, mask: np.ndarray) -> int:
    """Probe while allowed and no answer is in, then wait once, then refund."""
    if mask[4] and obs[42] == 1.0:  # probe_original_none: no answer yet
        return 4
    return 5 if obs[0] < 0.02 else 12


@pytest.mark.parametrize("probe", ["full", "none"])
def test_validation_is_the_graders_grade_on_the_validation_cases(probe):
    """The package's validation gives the mean gap, exact and premature rates of the rows the
    shared grader writes for the same cases (every 2nd unit of public, fault seed 100)."""
    tasks = validation_tasks(2)
    units = finality_gym.load_corpus("public").units
    assert len(tasks) == sum(len(u) for u in units[::2]) and len(tasks) < len(units)
    result = validate(GymPolicy("scripted", _scripted), probe)
    rows = grade_in_process(GymPolicy("scripted", _scripted), "scripted", RunConfig(
        ("scripted",), split="public", seeds=(VALIDATION_SEED,), probe=probe,
        tasks=tuple(t.task_id for t in tasks)))
    gaps = np.array([r["gap"] for r in rows]) / 100
    assert result == {"mean_gap": float(gaps.mean()),
                      "exact_rate": float(np.mean([r["gap"] == 0 for r in rows])),
                      "premature_rate": float(np.mean([r["premature"] for r in rows])),
                      "episodes": len(rows)}
    assert 0 < result["mean_gap"] and 0 < result["exact_rate"] < 1
    with pytest.raises(ValueError, match="probe: unknown arm 'partial'"):
        validate(GymPolicy("scripted", _scripted), "partial")
    for bad in (99, -1, 8.0, "ship"):
        with pytest.raises(PolicyError, match=f"predict returned {bad!r}, not an action index"):
            validate(GymPolicy("bad", lambda obs, mask, bad=bad: bad))


def test_the_callback_logs_the_grade_of_the_model_as_the_grader_plays_it(tmp_path):
    """Trained from one's own script: the callback validates at the start, every `eval_every`
    steps and at the end, in the training env's arm; TensorBoard holds `validation/mean_gap` at
    those steps with those values; and the last equals the grade of the same model played by the
    grader's own adapter (`sb3_policy`, the `sb3:` spec's)."""
    env = gym.make("FinalityNoProbe-v0", reward="relative")
    model = MaskablePPO("MlpPolicy", env, gamma=1.0, n_steps=128, batch_size=64, n_epochs=1,
                        seed=0, device="cpu", tensorboard_log=str(tmp_path / "tb"))
    callback = ValidationCallback(eval_every=256, stride=8)
    model.learn(600, callback=callback)
    assert callback.probe == "none"
    steps = [h["timesteps"] for h in callback.history]
    assert steps[0] == 1 and steps[-1] == model.num_timesteps and len(steps) >= 3
    assert callback.best == min(callback.history, key=lambda h: h["mean_gap"])
    (events,) = (tmp_path / "tb").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = {e.step: e.value for e in acc.Scalars("validation/mean_gap")}
    assert logged == pytest.approx({h["timesteps"]: h["mean_gap"] for h in callback.history})
    assert {"validation/exact_rate", "validation/premature_rate"} <= set(acc.Tags()["scalars"])
    graded = validate(sb3_policy(model, "sb3"), "none", stride=8)
    assert graded == {k: v for k, v in callback.history[-1].items() if k != "timesteps"}


def test_the_callback_refuses_what_it_cannot_play():
    """Another env without `probe=`/`policy=`, a frame-stacked model and one on normalized
    observations are refused by name."""
    model = MaskablePPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=64,
                        device="cpu")
    with pytest.raises(ValueError, match="the training env is a CartPoleEnv, not a Finality"):
        model.learn(64, callback=ValidationCallback(eval_every=64))
    for wrapped, what in ((gym.wrappers.FrameStackObservation(gym.make("Finality-v0"), 2),
                           r"shape \(2, 58\), not the env's own observation \(a frame stack"),
                          (gym.wrappers.NormalizeObservation(gym.make("Finality-v0")),
                           r"shape \(58,\), not the env's own observation \(an observation "
                           r"wrapper")):
        model = MaskablePPO("MlpPolicy", wrapped, n_steps=64, batch_size=64, device="cpu")
        with pytest.raises(ValueError, match=what):
            model.learn(64, callback=ValidationCallback(eval_every=64))
    with pytest.raises(ValueError, match="eval_every: must be an int >= 1"):
        ValidationCallback(eval_every=0)


def test_train_validates_with_the_package_callback_and_takes_workers(capsys):
    assert issubclass(RunValidation, ValidationCallback)
    assert train_cli(["ppo", "--workers", "0", "--out", "/nonexistent/never"]) == 2
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
