"""`sb3:PATH` grades a model of any stable-baselines3 or sb3-contrib algorithm with a Discrete
action space exactly as the model plays `Finality-v0` itself: the class the archive names, torch
seeded from the brief at every episode for an actor-critic, greedy for a Q-learner and ARS, a
fresh LSTM state at every episode, the env's masks for MaskablePPO. Models are tiny and trained
for a few hundred steps at most: what is checked is how the grader plays them, not their skill."""

import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import ARS, QRDQN, TRPO, MaskablePPO, RecurrentPPO
from stable_baselines3 import A2C, DQN, SAC

import finality_gym
from agents import make_policy
from eval.__main__ import main as eval_cli
from eval.grading.runfolder import read_rows
from finality_gym.policy import brief_for

PUBLIC = finality_gym.load_corpus("public")
TASKS = tuple(t.task_id for t in PUBLIC.tasks[::16])  # 21 tasks across the archetypes
NET = {"net_arch": [16]}
RECURRENT = {**NET, "lstm_hidden_size": 16}
# A Q-learner's exploration rate is saved with it; a high one makes SB3's epsilon-greedy
# `predict(deterministic=False)` visibly different from the greedy policy `sb3:` must play.
Q_LEARNING = {"learning_starts": 50, "buffer_size": 1_000, "batch_size": 16, "train_freq": 4,
              "exploration_fraction": 0.5, "exploration_final_eps": 0.5}


def _trained(model, steps: int):
    model.learn(steps)
    return model


# Action indices with the default waits (the table in `FinalityEnv`'s docstring).
READ_LEDGER, WAIT_120, SHIP, CLOSE = 1, 8, 11, 15


def _rule(model, x: int, weight: float, bias: float, before: int, after: int):
    """Overwrite an actor-critic's policy head with a rule of one input, so that what a test
    checks shows in every episode (a barely trained policy samples nearly uniformly whatever it
    sees): the first unit of the hidden layer is tanh(weight * x + bias) of input `x` (an
    observation field, or the LSTM's output), and the policy takes `before` while that unit is
    negative and `after` once it is positive (logits 10 times the unit; every other action's 0)."""
    with torch.no_grad():
        layer = model.policy.mlp_extractor.policy_net[0]
        layer.weight.zero_()
        layer.bias.zero_()
        layer.weight[0, x] = weight
        layer.bias[0] = bias
        head = model.policy.action_net
        head.weight.zero_()
        head.bias.zero_()
        head.weight[before, 0] = -10
        head.weight[after, 0] = 10
    return model


def _ships_late(model):
    """A MaskablePPO that waits 120 ticks at a time until about t=660 (`time_since_handover`
    0.32), then ships: past the deadline `ship` is masked, so with the masks it does something
    else, and without them it calls a refused `ship` until the budget lapses."""
    return _rule(model, 0, 50.0, -16.0, WAIT_120, SHIP)


def _counting(model):
    """A RecurrentPPO whose LSTM counts the calls of its episode (one cell, input and forget
    gates open, adding tanh(0.2) a call): it reads the ledger for its first two calls and has
    closed by about its fourth. Started from the state another episode left, it closes at its
    first call (with probability 0.95 or more when sampled)."""
    with torch.no_grad():
        lstm = model.policy.lstm_actor
        for parameter in lstm.parameters():
            parameter.zero_()
        size = lstm.hidden_size  # gates in PyTorch's order: input, forget, cell, output
        lstm.bias_ih_l0[[0, size, 3 * size]] = 10.0
        lstm.bias_ih_l0[2 * size] = 0.2
    return _rule(model, 0, 4.0, -2.0, READ_LEDGER, CLOSE)


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sb3")
    env = gym.make("Finality-v0")
    built = {
        "dqn": _trained(DQN("MlpPolicy", env, policy_kwargs=NET, seed=0, device="cpu",
                            **Q_LEARNING), 300),
        "qrdqn": _trained(QRDQN("MlpPolicy", env, policy_kwargs={**NET, "n_quantiles": 5}, seed=0,
                                device="cpu", **Q_LEARNING), 300),
        "a2c": _trained(A2C("MlpPolicy", env, n_steps=8, policy_kwargs=NET, seed=0,
                            device="cpu"), 200),
        "recurrent": _trained(RecurrentPPO("MlpLstmPolicy", env, n_steps=64, batch_size=64,
                                           n_epochs=1, policy_kwargs=RECURRENT, seed=0,
                                           device="cpu"), 64),
        "counting": _counting(RecurrentPPO("MlpLstmPolicy", env, policy_kwargs=RECURRENT,
                                           device="cpu")),
        "maskable": _ships_late(_trained(MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=64,
                                                     n_epochs=1, policy_kwargs=NET, seed=0,
                                                     device="cpu"), 64)),
        "trpo": _trained(TRPO("MlpPolicy", env, n_steps=64, batch_size=64, policy_kwargs=NET,
                              seed=0, device="cpu"), 64),
        "ars": ARS("LinearPolicy", env, zero_policy=False, seed=0, device="cpu"),
        "sac": SAC("MlpPolicy", gym.make("Pendulum-v1"), buffer_size=1_000,
                   policy_kwargs=dict(NET), device="cpu"),  # SAC writes into the dict it gets
        "cartpole": DQN("MlpPolicy", gym.make("CartPole-v1"), policy_kwargs=NET, device="cpu"),
        "other_waits": A2C("MlpPolicy", gym.make("Finality-v0", wait_ticks=(10, 30)),
                           policy_kwargs=NET, device="cpu"),
    }
    paths = {}
    for name, model in built.items():
        model.save(folder / f"{name}.zip")
        paths[name] = folder / f"{name}.zip"
    paths["renamed"] = folder / "ppo_model.zip"  # an A2C archive under a PPO-sounding name
    shutil.copy(paths["a2c"], paths["renamed"])
    return {"folder": folder, "paths": paths, "models": built}


GRADED = ("dqn", "qrdqn", "a2c", "recurrent", "counting", "maskable", "trpo", "ars", "renamed")
SPECS = tuple(f"{kind}:{{{name}}}" for name in GRADED for kind in ("sb3", "sb3-greedy"))


def _headline(out, specs, tasks=TASKS) -> list[dict]:
    """The CLI's rows, graded in one worker: this process, whose model cache then holds each
    model across episodes (a spawned worker would spend more time importing torch than
    grading)."""
    assert eval_cli(["headline", "--policies", ",".join(specs), "--seeds", "1", "--tasks",
                     ",".join(tasks), "--out", str(out), "--no-progress", "--sandbox", "off",
                     "--workers", "1"]) == 0
    return read_rows(out / "episodes.jsonl")


@pytest.fixture(scope="module")
def graded(archives):
    """Every graded archive under `sb3:` and `sb3-greedy:`, in one headline run:
    {spec: {task id: row}}."""
    specs = [spec.format(**archives["paths"]) for spec in SPECS]
    rows = _headline(archives["folder"] / "headline", specs)
    by_spec: dict = {spec: {} for spec in specs}
    for row in rows:
        by_spec[row["policy"]][row["task_id"]] = row
    return by_spec


def play_in_env(model, task_id: str, seed: int, greedy: bool) -> dict:
    """One episode of `model` played through `gym.make("Finality-v0")` by the rule `sb3:`
    states: an actor-critic samples with torch seeded from the brief, a Q-learner and ARS are
    greedy, an LSTM starts from a zero state, MaskablePPO gets the env's masks. The record as a
    row holds it (through JSON)."""
    env = gym.make("Finality-v0", info="full")  # `record` in the last step's info
    obs, _ = env.reset(options={"task_id": task_id, "fault_seed": seed})
    deterministic = greedy or isinstance(model, (DQN, QRDQN, ARS))
    if not deterministic:
        torch.manual_seed(brief_for(PUBLIC.task(task_id), seed, "full").seed)
    state, start, done = None, np.ones(1, dtype=bool), False
    while not done:
        if isinstance(model, RecurrentPPO):
            action, state = model.predict(obs, state=state, episode_start=start,
                                          deterministic=deterministic)
            start = np.zeros(1, dtype=bool)
        elif isinstance(model, MaskablePPO):
            action, _ = model.predict(obs, deterministic=deterministic,
                                      action_masks=env.unwrapped.action_masks())
        else:
            action, _ = model.predict(obs, deterministic=deterministic)
        obs, _, terminated, truncated, info = env.step(int(action))
        done = terminated or truncated
    return json.loads(json.dumps(info["record"].to_dict()))


@pytest.mark.parametrize("kind", ["sb3", "sb3-greedy"])
@pytest.mark.parametrize("name", GRADED)
def test_sb3_grades_a_model_as_it_plays_the_env(archives, graded, name, kind):
    path = archives["paths"][name]
    model = archives["models"]["a2c" if name == "renamed" else name]
    rows = graded[f"{kind}:{path}"]
    assert sorted(rows) == sorted(TASKS)
    for task_id, row in rows.items():
        played = play_in_env(model, task_id, 0, greedy=kind == "sb3-greedy")
        assert {k: row[k] for k in played} == played, (name, kind, task_id)


def _outcomes(rows: dict) -> dict:
    return {task_id: (row["disposition"], row["gap"]) for task_id, row in rows.items()}


@pytest.mark.parametrize("name", ["dqn", "qrdqn", "ars"])
def test_a_greedy_algorithm_acts_greedily_under_sb3(archives, graded, name):
    path = archives["paths"][name]
    assert _outcomes(graded[f"sb3:{path}"]) == _outcomes(graded[f"sb3-greedy:{path}"])


@pytest.mark.parametrize("name", ["a2c", "recurrent", "trpo"])
def test_an_actor_critic_samples_under_sb3(archives, graded, name):
    """The sampled and greedy rows differ: the comparisons above test the sampling rule."""
    path = archives["paths"][name]
    assert _outcomes(graded[f"sb3:{path}"]) != _outcomes(graded[f"sb3-greedy:{path}"])


@pytest.mark.parametrize("kind", ["sb3", "sb3-greedy"])
def test_recurrent_state_starts_fresh_at_every_episode(archives, tmp_path, kind):
    """One worker grades two episodes with one loaded model, in the order A, B and in the order
    B, A: the counting LSTM would close the second episode at its first call if it started from
    the state the first one left."""
    spec = f"{kind}:{archives['paths']['counting']}"
    pair = TASKS[:2]
    forward = _headline(tmp_path / "ab", [spec], pair)
    backward = _headline(tmp_path / "ba", [spec], pair[::-1])
    assert [r["task_id"] for r in forward] == list(pair)
    assert [r["task_id"] for r in backward] == list(pair[::-1])
    assert {r["task_id"]: r for r in forward} == {r["task_id"]: r for r in backward}
    assert all(r["tool_counts"].get("read_ledger") for r in forward)


def test_maskable_ppo_is_given_the_masks(archives, graded):
    """Past the deadline the masked policy never calls the `ship` it prefers."""
    for kind in ("sb3", "sb3-greedy"):
        rows = graded[f"{kind}:{archives['paths']['maskable']}"].values()
        assert all(r["end_t"] > 600 and not r["tool_counts"].get("ship") for r in rows), kind


@pytest.mark.parametrize("name, problem", [
    ("cartpole", "was trained with observation space Box(shape (4,), float32); Finality's is "
                 "Box(shape (58,), float32)"),
    ("other_waits", "was trained with action space Discrete(14); Finality's is Discrete(16) "
                    "(wait_ticks (10, 30, 60, 120))"),
    ("sac", "was trained by an algorithm with a stable_baselines3.sac.policies policy, not one "
            "sb3: grades (PPO, A2C, DQN, MaskablePPO, RecurrentPPO, TRPO, QRDQN, ARS)"),
    ("dqn", "was trained by DQN, not PPO or MaskablePPO: grade it with sb3:{path}"),
])
def test_a_model_for_something_else_is_refused_by_name(archives, name, problem, tmp_path,
                                                       capsys):
    path = archives["paths"][name]
    kind = "ppo" if name == "dqn" else "sb3"
    out = tmp_path / "headline"
    assert eval_cli(["headline", "--policies", f"{kind}:{path}", "--seeds", "1", "--tasks",
                     TASKS[0], "--out", str(out), "--no-progress", "--sandbox", "off"]) == 2
    assert f"error: {path} {problem.format(path=path)}\n" in capsys.readouterr().err
    assert not out.exists()


def test_the_class_comes_from_the_archive_not_its_name(archives, monkeypatch):
    """`ppo_model.zip` holds an A2C model: it is graded as A2C (its rows are A2C's, above), read
    as data, or by A2C's own `load` where pickles are allowed; `ppo:` refuses it."""
    path = archives["paths"]["renamed"]
    loaded = []
    load = A2C.load.__func__
    monkeypatch.setattr(A2C, "load", classmethod(
        lambda cls, *args, **kwargs: loaded.append(cls) or load(cls, *args, **kwargs)))
    assert make_policy(f"sb3:{path}").name == f"sb3:{path}"
    assert loaded == []
    assert make_policy(f"sb3:{path}", allow_pickle=True).name == f"sb3:{path}"
    assert loaded == [A2C]
    with pytest.raises(ValueError, match=f"{path} was trained by A2C, not PPO or MaskablePPO"):
        make_policy(f"ppo:{path}")
