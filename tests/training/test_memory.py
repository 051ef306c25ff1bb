"""The two kinds of memory a trained agent can have here: RecurrentPPO, whose gradient updates
`train/recurrent.py` makes fast (one LSTM call a sequence, one indexing a padded field) without
changing what they compute, and a stack of the last observations (`--frame-stack N`, Gymnasium's
`FrameStackObservation`), graded by `sb3:` with the stack the model was trained on."""

import json
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import FrameStackObservation
from sb3_contrib.common.recurrent import buffers
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3 import PPO

import finality_gym
from eval.__main__ import main as eval_cli
from eval.grading.runfolder import read_rows
from train.__main__ import main as train_cli
from train.config import TrainConfig
from train.export import export
from train.recurrent import STEP_BY_STEP, STOCK_PAD, fast_updates, padded, process_sequence
from train.run import make_envs, new_model

from tests.learned.sb3_reference import played

TASKS = tuple(t.task_id for t in finality_gym.load_corpus("public").tasks[::40])
WAIT_120, CLOSE = 8, 15  # action indices with the default waits
RECURRENT = TrainConfig(env="FinalityIdentityProbe-v0", algo="recurrent_ppo", n_envs=2,
                        n_steps=128, batch_size=64, n_epochs=1, lstm_hidden_size=16,
                        net_arch=(16,))


@pytest.fixture(autouse=True)
def _stock_sb3_contrib():
    """Each test starts from sb3-contrib as released, whatever an earlier test trained."""
    yield
    RecurrentActorCriticPolicy._process_sequence = staticmethod(STEP_BY_STEP)
    buffers.pad = STOCK_PAD


@pytest.fixture(scope="module")
def rollout():
    """A RecurrentPPO model and a full rollout buffer of the identity arm (short episodes: most
    minibatch sequences start an episode)."""
    torch.manual_seed(0)
    model = new_model(RECURRENT, make_envs(RECURRENT))
    model.learn(RECURRENT.n_steps * RECURRENT.n_envs)
    RecurrentActorCriticPolicy._process_sequence = staticmethod(STEP_BY_STEP)
    buffers.pad = STOCK_PAD
    return model


def _minibatches(model, pad) -> list:
    buffers.pad = pad
    np.random.seed(7)  # the buffer draws where its minibatches start
    return list(model.rollout_buffer.get(RECURRENT.batch_size))


def test_minibatches_are_padded_exactly_as_sb3_contrib_pads_them(rollout):
    stock, fast = _minibatches(rollout, STOCK_PAD), _minibatches(rollout, padded)
    assert len(stock) == len(fast) > 1
    for a, b in zip(stock, fast):
        for name in ("observations", "actions", "old_values", "old_log_prob", "advantages",
                     "returns", "episode_starts", "mask"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
        for x, y in zip(a.lstm_states.pi + a.lstm_states.vf, b.lstm_states.pi + b.lstm_states.vf):
            assert torch.equal(x, y)


def test_one_call_a_sequence_computes_what_the_step_by_step_loop_computes(rollout):
    """Values, log-probabilities and every gradient of the PPO loss's terms, on every
    minibatch of a real rollout; the minibatches do start episodes inside them, the case where
    sb3-contrib takes its loop."""
    policy = rollout.policy
    starts = 0
    for batch in _minibatches(rollout, STOCK_PAD):
        starts += int(batch.episode_starts.sum())
        results = []
        for process in (STEP_BY_STEP, process_sequence):
            RecurrentActorCriticPolicy._process_sequence = staticmethod(process)
            policy.zero_grad()
            values, log_prob, entropy = policy.evaluate_actions(
                batch.observations, batch.actions.long().flatten(), batch.lstm_states,
                batch.episode_starts)
            mask = batch.mask > 1e-8
            (log_prob[mask].sum() + values.flatten()[mask].sum() + entropy[mask].sum()).backward()
            grads = torch.cat([p.grad.flatten() for p in policy.parameters()])
            results.append((values.flatten()[mask].detach(), log_prob[mask].detach(), grads))
        for loop, one_call in zip(*results):
            assert torch.allclose(loop, one_call, rtol=1e-4, atol=1e-5)
    assert starts > 10


def test_an_episode_starting_inside_a_sequence_takes_sb3_contribs_loop():
    lstm = torch.nn.LSTM(4, 3)
    torch.manual_seed(1)
    features = torch.randn(2 * 5, 4)
    states = (torch.randn(1, 2, 3), torch.randn(1, 2, 3))
    episode_starts = torch.zeros(2 * 5)
    episode_starts[[0, 7]] = 1.0  # sequence 0 at its first step; sequence 1 at its third
    ours, theirs = (process_sequence(features, states, episode_starts, lstm),
                    STEP_BY_STEP(features, states, episode_starts, lstm))
    assert torch.equal(ours[0], theirs[0])


def test_a_run_with_fast_updates_reproduces_itself():
    def trained() -> list:
        torch.manual_seed(0)
        model = new_model(RECURRENT, make_envs(RECURRENT))
        model.learn(2 * RECURRENT.n_steps * RECURRENT.n_envs)
        return [p.detach().clone() for p in model.policy.parameters()]
    first, second = trained(), trained()
    assert RecurrentActorCriticPolicy._process_sequence is not STEP_BY_STEP
    assert buffers.pad is padded
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_fast_updates_change_only_the_two_functions():
    fast_updates()
    assert RecurrentActorCriticPolicy._process_sequence is process_sequence
    assert buffers.pad is padded


# ----------------------------------------------------------------------------- frame stacks
@pytest.fixture(scope="module")
def stacked(tmp_path_factory):
    """A PPO model of three stacked observations whose policy is a rule on the *oldest* frame's
    clock: wait 120 ticks while it reads before t=288 (x < 0.1), close after. Fed the stack it
    was trained on it closes at t=600 (the oldest of three frames passes 0.1 two waits after the
    newest); fed the newest observation three times, at t=360."""
    env = FrameStackObservation(gym.make("Finality-v0"), 3)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    with torch.no_grad():
        first = model.policy.mlp_extractor.policy_net[0]
        first.weight.zero_()
        first.bias.zero_()
        first.weight[0, 0] = 40.0  # input 0: the oldest frame's time since hand-over
        first.bias[0] = -4.0
        head = model.policy.action_net
        head.weight.zero_()
        head.bias.zero_()
        head.weight[WAIT_120, 0] = -10.0
        head.weight[CLOSE, 0] = 10.0
    folder = tmp_path_factory.mktemp("stacked")
    model.save(folder / "stacked.zip")
    return model, folder / "stacked.zip"


@pytest.mark.parametrize("kind", ["sb3", "sb3-greedy"])
def test_sb3_grades_a_frame_stacked_model_with_the_stack_it_was_trained_on(stacked, tmp_path,
                                                                          kind):
    model, path = stacked
    assert eval_cli(["headline", "--policies", f"{kind}:{path}", "--seeds", "1", "--tasks",
                     ",".join(TASKS), "--out", str(tmp_path), "--no-progress", "--sandbox", "off",
                     "--workers", "1"]) == 0
    rows = {row["task_id"]: row for row in read_rows(tmp_path / "episodes.jsonl")}
    assert sorted(rows) == sorted(TASKS)
    for task_id, row in rows.items():
        episode = played(model, task_id, 0, greedy=kind == "sb3-greedy", frame_stack=3)
        record = json.loads(json.dumps(episode.record().to_dict()))
        assert {k: row[k] for k in record} == record, task_id
    if kind == "sb3-greedy":  # the rule's own outcome: the stack is the oldest-first one
        assert {(row["disposition"], row["end_t"]) for row in rows.values()} == {("close", 600)}


def test_the_stack_is_emptied_at_every_episode(stacked, tmp_path):
    """One worker grades two episodes in the order A, B and in the order B, A: a stack left
    over from the first would close the second before t=600."""
    _, path = stacked
    orders = []
    for name, pair in (("ab", TASKS[:2]), ("ba", TASKS[1::-1])):
        assert eval_cli(["headline", "--policies", f"sb3-greedy:{path}", "--seeds", "1",
                         "--tasks", ",".join(pair), "--out", str(tmp_path / name),
                         "--no-progress", "--sandbox", "off", "--workers", "1"]) == 0
        orders.append({r["task_id"]: r for r in read_rows(tmp_path / name / "episodes.jsonl")})
    assert orders[0] == orders[1]


def test_export_refuses_a_frame_stacked_model_by_name(stacked, tmp_path):
    _, path = stacked
    with pytest.raises(ValueError, match="stacks 3 observations"):
        export(path, tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())


def test_train_frame_stack_trains_and_grades_a_stacked_model(tmp_path):
    out = tmp_path / "run"
    assert train_cli(["ppo", "--frame-stack", "2", "--timesteps", "512", "--n-envs", "2",
                      "--eval-every", "512", "--validation-stride", "32", "--checkpoint-every",
                      "512", "--final-seeds", "1", "--out", str(out)]) == 0
    saved = json.loads(zipfile.ZipFile(out / "best_model.zip").read("data"))
    assert saved["observation_space"]["_shape"] == [2, 58]
    assert json.loads((out / "config.json").read_text())["frame_stack"] == 2
    assert read_rows(out / "eval_regenerated" / "episodes.jsonl")


@pytest.mark.parametrize("depth", [0, 65])
def test_a_stack_depth_out_of_range_is_refused(depth):
    with pytest.raises(ValueError, match="frame_stack"):
        TrainConfig(frame_stack=depth)
