"""The native vector env (`finality_gym/vector.py`) against Gymnasium's `SyncVectorEnv` over the
scalar env: the same trajectories for the same seeds (observations, rewards, ends, every info
array and mask, `final_obs`/`final_info`), in each autoreset mode and every arm; the checks
Gymnasium's `check_env` makes of a single env, made of the vector env; bad input refused without
a change; and TorchRL's `GymWrapper` over it."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

import finality_gym
from finality_gym.env import FinalityEnv
from finality_gym.vector import INFO_KEYS, FinalityVectorEnv

MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


def assert_same(a, b, path="") -> None:
    """Equal values, dtypes and shapes, recursively through tuples, dicts and object arrays."""
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), path
        assert set(a) == set(b), (path, sorted(set(a) ^ set(b)))
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
        return
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype == object:
        for x, y in zip(a, b):
            assert (x is None) == (y is None), path
            if x is not None:
                assert_same(x, y, path)
    else:
        np.testing.assert_array_equal(a, b, err_msg=path)


# Gymnasium's own `TimeLimit`, which `gym.make` applies (the ids' `max_episode_steps`, 50). RL
# Zoo, once imported in a process (tests/training/test_zoo.py may run before these in one
# worker), replaces it in Gymnasium's modules with a subclass of its own that adds an info key
# and truncates differently; the reference here is Gymnasium's, the class that subclass extends.
TIME_LIMIT = next(c for c in gym.wrappers.TimeLimit.__mro__
                  if c.__name__ == "TimeLimit" and c.__module__.startswith("gymnasium."))


def pair(env_id: str, n: int, mode: AutoresetMode, max_episode_steps: int = 50, **kwargs):
    """The native vector env and `SyncVectorEnv` over the scalar env as `gym.make` builds it
    (its checker and order wrappers change no output, so they are left out)."""
    native = gym.make_vec(env_id, n, autoreset_mode=mode, max_episode_steps=max_episode_steps,
                          **kwargs)
    arm = finality_gym.ENV_IDS[env_id]

    def scalar():
        env = FinalityEnv(probe=arm, registered_probe=arm, **kwargs)
        return TIME_LIMIT(env, max_episode_steps)

    sync = gym.vector.SyncVectorEnv([scalar] * n, autoreset_mode=mode)
    assert isinstance(native.unwrapped, FinalityVectorEnv)
    return native, sync


def play_both(native, sync, steps: int, rng: np.random.Generator, seed) -> tuple[int, int]:
    """Step both with the same random actions (masked ones too: the world refuses them alike);
    every output equal; the number of episodes that ended in each."""
    assert_same(native.reset(seed=seed), sync.reset(seed=seed))
    ends = [0, 0]
    for _ in range(steps):
        actions = rng.integers(0, native.single_action_space.n, native.num_envs)
        got, want = native.step(actions), sync.step(actions)
        assert_same(got, want)
        ends[0] += int((got[2] | got[3]).sum())
        ends[1] += int((want[2] | want[3]).sum())
    return ends[0], ends[1]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_id", list(finality_gym.ENV_IDS))
def test_the_same_trajectories_as_sync_vector_env_on_10000_steps(env_id, mode):
    """64 envs, 157 steps of each: 10,048 random steps of every arm, in both autoreset modes."""
    native, sync = pair(env_id, 64, mode)
    ends, sync_ends = play_both(native, sync, 157, np.random.default_rng(7), seed=11)
    assert ends == sync_ends > 1000  # many episodes ended and restarted within the run


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES),
       arm=st.sampled_from(sorted(finality_gym.ENV_IDS)), relative=st.booleans(),
       limit=st.sampled_from([3, 7, 50]), waits=st.sampled_from([None, (5, 200)]))
def test_any_configuration_plays_as_sync_vector_env(n, seed, mode, arm, relative, limit, waits):
    """Any number of envs, seed, arm, reward, episode step limit and wait table."""
    kwargs = {"reward": "relative" if relative else "dollars"}
    if waits is not None:
        kwargs["wait_ticks"] = waits
    native, sync = pair(arm, n, mode, max_episode_steps=limit, **kwargs)
    ends, sync_ends = play_both(native, sync, 40, np.random.default_rng(seed), seed=seed)
    # 40 steps end every env's first episode at least (the 40-call budget), in both alike
    assert ends == sync_ends >= n


def test_per_env_options_and_a_partial_reset_play_as_sync_vector_env():
    """`reset_mask` (the disabled autoreset mode) and options once for every env match
    `SyncVectorEnv`; options as a sequence give each env its own task and fault seed."""
    native, sync = pair("Finality-v0", 4, AutoresetMode.DISABLED)
    task = finality_gym.load_corpus("public").tasks[5].task_id
    options = {"task_id": task, "fault_seed": 9}
    assert_same(native.reset(seed=3, options=dict(options)),
                sync.reset(seed=3, options=dict(options)))
    rng = np.random.default_rng(1)
    for _ in range(30):
        actions = rng.integers(0, 16, 4)
        got = native.step(actions)
        assert_same(got, sync.step(actions))
        ended = got[2] | got[3]
        if ended.any():
            with pytest.raises(ValueError, match="reset them"):
                native.step(actions)
            mask = {"reset_mask": ended.copy()}
            assert_same(native.reset(options=dict(mask)), sync.reset(options=dict(mask)))
    tasks = [t.task_id for t in finality_gym.load_corpus("public").tasks[:4]]
    _, info = native.reset(seed=0, options={"task_id": tasks, "fault_seed": [1, None, 3, 4]})
    for i, task_id in enumerate(tasks):
        env = native.unwrapped.envs[i]
        assert env.episode.task.task_id == task_id
        assert info["order_value"][i] == env.episode.task.order_value
    assert [native.unwrapped.envs[i].episode.seed for i in (0, 2, 3)] == [1, 3, 4]


def snapshot(env) -> tuple:
    inner = env.unwrapped
    return tuple((e.np_random.bit_generator.state["state"]["state"], id(e.episode),
                  e.episode.calls_used) for e in inner.envs)


@pytest.mark.parametrize("bad, message", [
    (np.zeros(3, dtype=np.int64), r"4 integer action indices"),
    (np.zeros(4, dtype=np.float64), r"integer action indices"),
    (np.array([0, 1, 16, 2]), r"each must lie in 0..15"),
    (np.array([0, -1, 1, 2]), r"each must lie in 0..15"),
])
def test_a_bad_action_is_refused_and_moves_no_env(bad, message):
    env = gym.make_vec("Finality-v0", 4)
    env.reset(seed=0)
    before = snapshot(env)
    with pytest.raises(ValueError, match=message):
        env.step(bad)
    assert snapshot(env) == before


@pytest.mark.parametrize("options, message", [
    ({"task_id": "no-such-task"}, r"no task 'no-such-task'"),
    ({"fault_seed": -1}, r"fault_seed must be a non-negative int"),
    ({"fault_seed": [1, 2]}, r"fault_seed as a sequence needs num_envs=4"),
    ({"task": "x"}, r"unknown keys \['task'\]"),
    ({"reset_mask": np.array([1, 0, 0, 0])}, r"reset_mask must be a bool numpy array"),
    ({"fault_seed": [1, 2, 3, -4]}, r"fault_seed must be a non-negative int"),
    ({"task_id": [1, 2, 3, 4]}, r"task_id must be a task id \(a str\); got 1"),
])
def test_a_bad_reset_is_refused_and_resets_no_env(options, message):
    """Checked for every env before any is reset: the fourth env's bad seed leaves the first
    three as they were, generators included."""
    env = gym.make_vec("Finality-v0", 4)
    env.reset(seed=0)
    env.step(np.array([0, 1, 2, 3]))
    before = snapshot(env)
    with pytest.raises(ValueError, match=message):
        env.reset(seed=5, options=options)
    assert snapshot(env) == before


@pytest.mark.parametrize("kwargs, message", [
    ({"info": "full"}, r"info: the vector env batches the numeric info only"),
    ({"autoreset_mode": "later"}, r"autoreset_mode: must be one of"),
    ({"probe": "none"}, r"Finality-v0 is the 'full' probe arm"),
    ({"reward": "euros"}, r"reward: must be 'dollars' or 'relative'"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make_vec("Finality-v0", 2, **kwargs)
    with pytest.raises(ValueError, match=r"num_envs: must be an int >= 1"):
        FinalityVectorEnv(0)


def test_the_checks_check_env_makes_hold_for_the_vector_env():
    """Gymnasium's `check_env` for a vector env: spaces batched from the single spaces, every
    output inside them with its dtype, reset and step deterministic under a seed and different
    under another, step before reset refused, the info's arrays all of the batch's length, the
    mask what `action_masks()` says, render per env, close."""
    env = gym.make_vec("FinalityRateLimitedProbe-v0", 5, render_mode="ansi")
    single = gym.make("FinalityRateLimitedProbe-v0")
    assert env.single_observation_space == single.observation_space
    assert env.single_action_space == single.action_space
    assert env.observation_space == gym.vector.utils.batch_space(single.observation_space, 5)
    assert env.action_space == gym.spaces.MultiDiscrete([16] * 5)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    with pytest.raises(ValueError, match="before reset"):
        FinalityVectorEnv(2).step(np.zeros(2, dtype=np.int64))

    def run(seed):
        env.action_space.seed(seed)
        out = [env.reset(seed=seed)]
        for _ in range(30):
            out.append(env.step(env.action_space.sample()))
        return out

    first = run(3)
    for obs, *rest in first:
        assert obs in env.observation_space and obs.dtype == np.float32
        info = rest[-1]
        assert {k for k in info if not k.startswith("_")} >= set(INFO_KEYS)
        for key in INFO_KEYS:
            assert len(info[key]) == 5 and info[f"_{key}"].all()
        if len(rest) == 4:
            reward, terminated, truncated = rest[:3]
            assert reward.dtype == np.float64 and terminated.dtype == truncated.dtype == bool
            assert np.array_equal(info["ended"], terminated | truncated)
            assert (reward[~info["ended"]] == 0).all() and (reward[info["ended"]] <= 0).all()
        np.testing.assert_array_equal(info["action_mask"], env.unwrapped.action_masks())
    assert_same(first, run(3))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(first, run(4)))
    frames = env.render()
    assert len(frames) == 5 and all(f.startswith("case: order") for f in frames)
    env.close()


def test_torchrl_wraps_the_vector_env_and_reads_its_infos():
    """TorchRL's `GymWrapper` over the native vector env (its preferred disabled autoreset,
    resetting through `reset_mask`): its spec check holds, and a random rollout ends many
    episodes, each with `ended` and its gap where TorchRL says done."""
    import torch
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    vector = gym.make_vec("FinalityNoProbe-v0", 4, autoreset_mode=AutoresetMode.DISABLED)
    env = GymWrapper(vector).auto_register_info_dict()
    assert env.batch_size == torch.Size([4])
    check_env_specs(env, seed=0)
    env.set_seed(0)
    rollout = env.rollout(60, break_when_any_done=False)
    done = rollout["next", "done"].squeeze(-1)
    assert rollout.shape == (4, 60) and done.sum() > 20
    assert torch.equal(rollout["next", "ended"], done)
    assert (rollout["next", "gap"][~done] == 0).all() and (rollout["next", "gap"][done] > 0).any()
    assert not rollout["action_mask"][..., 4].any()  # the no-probe arm's mask, per env
