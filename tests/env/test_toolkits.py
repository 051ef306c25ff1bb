"""The env under the RL toolkits themselves: TorchRL, Tianshou 2 and Minari, unmodified.

Each test uses a toolkit as its users would (its own env wrapper, collector, transform or
dataset API; nothing of ours in between) and reads the action mask where that toolkit looks for
it: TorchRL's `ActionMask` from the info keys its `GymEnv` registers, a Tianshou policy from the
collector's `info`, Minari from the recorded infos. Each relies on the env's default info being
numeric and the same at every step (`FinalityEnv`'s Info section). The masked rollouts include
`FinalityNoProbe-v0`, where the probe is masked at every step: on `Finality-v0` only `ship`
after the deadline is, which random play rarely reaches, so a mask ignored would go unseen.
The toolkits are the `toolkits` extra (`make test` installs it) and are imported inside the
tests so that the rest of the suite collects without them.
"""

import gymnasium as gym
import numpy as np
import pytest

import finality_gym  # noqa: F401  (registers the ids)

NUMERIC_INFO = {"action_mask", "t", "calls_used", "order_value", "ended", "gap", "exact"}
MIXED_ARMS = ["Finality-v0", "Finality-v0", "FinalityNoProbe-v0", "FinalityNoProbe-v0"]


def test_torchrl_env_specs_hold_and_action_mask_keeps_a_rollout_to_allowed_actions():
    import torch
    from torchrl.envs import GymEnv, TransformedEnv
    from torchrl.envs.transforms import ActionMask
    from torchrl.envs.utils import check_env_specs

    torch.manual_seed(0)
    env = GymEnv("Finality-v0").auto_register_info_dict()  # every info key, as a spec
    assert NUMERIC_INFO <= set(env.observation_spec.keys())
    assert env.observation_spec["action_mask"].dtype == torch.bool
    check_env_specs(env, seed=0)
    for env_id in ("Finality-v0", "FinalityNoProbe-v0"):
        masked = TransformedEnv(GymEnv(env_id).auto_register_info_dict(), ActionMask())
        masked.set_seed(1)
        rollout = masked.rollout(600, break_when_any_done=False)
        action, mask = rollout["action"].bool(), rollout["action_mask"]  # one-hot actions
        assert rollout.shape == (600,) and (action.sum(-1) == 1).all()
        assert not (action & ~mask).any(), f"{env_id}: an action the mask forbade was taken"
        assert torch.equal(rollout["next", "ended"], rollout["next", "done"].squeeze(-1))
        assert rollout["next", "done"].sum() > 50  # many episodes, resets included
    assert (~mask[:, 4]).all()  # the no-probe arm: the mask was there to honour


def _allowed(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.choice(np.flatnonzero(m)) for m in masks])


def test_tianshou_collector_fills_its_buffer_with_masked_actions():
    from tianshou.algorithm.algorithm_base import Policy
    from tianshou.data import Batch, Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    class MaskedRandom(Policy):
        """A uniformly random policy over the actions the last info's mask allows."""

        def __init__(self, action_space):
            super().__init__(action_space=action_space)
            self.rng = np.random.default_rng(0)

        def forward(self, batch, state=None, **kwargs):
            return Batch(act=_allowed(batch.info.action_mask, self.rng), state=state)

    envs = DummyVectorEnv([lambda env_id=env_id: gym.make(env_id) for env_id in MIXED_ARMS])
    envs.seed(0)
    buffer = VectorReplayBuffer(4000, len(MIXED_ARMS))
    collector = Collector(MaskedRandom(envs.action_space[0]), envs, buffer,
                          raise_on_nan_in_buffer=True)
    collector.reset()
    stats = collector.collect(n_step=3000)
    assert stats.n_collected_steps == 3000 and stats.n_collected_episodes > 500
    assert len(buffer) == 3000 and not buffer.hasnull()  # the check Tianshou's trainer makes
    masked_states = 0
    for env_id, sub in zip(MIXED_ARMS, buffer.buffers):
        first_mask = gym.make(env_id).reset(seed=0)[1]["action_mask"]  # any task: the same
        steps = sub[sub.sample_indices(0)]
        assert set(steps.info.keys()) == NUMERIC_INFO | {"env_id"}  # the collector adds env_id
        assert steps.info.action_mask.dtype == bool and steps.info.gap.dtype == np.int64
        assert np.array_equal(steps.info.ended, steps.terminated | steps.truncated)
        before = sub.prev(sub.sample_indices(0))  # the step before; itself at an episode start
        starts = before == sub.sample_indices(0)
        masks = np.where(starts[:, None], first_mask, sub[before].info.action_mask)
        assert masks[np.arange(len(steps)), steps.act].all(), f"{env_id}: a masked action stored"
        masked_states += int((~masks).any(axis=1).sum())
    assert masked_states > 1000  # the no-probe envs' steps: the mask had something to forbid


# Minari asks every dataset for an author, an email and a code link; a test's has none to give.
@pytest.mark.filterwarnings(r"ignore:`(author|author_email|code_permalink)` is set to None")
def test_minari_records_a_dataset_with_infos_and_loads_it_back(tmp_path, monkeypatch):
    import minari
    from minari import DataCollector

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = DataCollector(gym.make("Finality-v0"), record_infos=True)
    rng = np.random.default_rng(0)
    played = []  # per episode: the infos the env returned, reset's first
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        infos, done = [info], False
        while not done:
            obs, _, terminated, truncated, info = env.step(_allowed([info["action_mask"]], rng)[0])
            infos.append(info)
            done = terminated or truncated
        played.append(infos)
    env.create_dataset("finality/masked-random-v0", eval_env="Finality-v0",
                       algorithm_name="uniform over the allowed actions",
                       description="tests/env/test_toolkits.py: a round trip of the numeric info")
    env.close()
    dataset = minari.load_dataset("finality/masked-random-v0")
    assert (tmp_path / "finality" / "masked-random-v0").is_dir()
    assert dataset.observation_space == gym.make("Finality-v0").observation_space
    assert dataset.action_space == gym.make("Finality-v0").action_space
    assert dataset.total_episodes == 8 and dataset.total_steps == sum(len(p) - 1 for p in played)
    for episode, infos in zip(dataset.iterate_episodes(), played):
        assert set(episode.infos) == NUMERIC_INFO
        for key in NUMERIC_INFO:
            assert np.array_equal(episode.infos[key], np.stack([i[key] for i in infos])), key
        assert episode.infos["ended"][-1] and not episode.infos["ended"][:-1].any()
        gap = int(episode.infos["gap"][-1])
        assert episode.rewards[-1] == np.float64(-gap / 100 / 100)  # the reward, from the info
        steps = np.arange(len(episode.actions))  # infos[i]: the state action i was taken in
        assert episode.infos["action_mask"][steps, episode.actions].all()
    assert dataset.recover_environment().spec.id == "Finality-v0"
