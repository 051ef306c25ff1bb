"""The Gymnasium environment: checkers, vector envs, seeding, spaces, twins, arms, errors."""

import pickle
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from tests.env.strategies import TWIN_PAIRS, play

import finality_gym
from finality_gym.env import OBS_FIELDS, FinalityEnv
from finality_gym.tasks import SHIP_BY

ENV_IDS = list(finality_gym.ENV_IDS)
PUBLIC = finality_gym.load_corpus("public")
NUMERIC_INFO = {"action_mask", "t", "calls_used", "order_value", "ended", "gap", "exact"}


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_and_sb3_checkers_pass_with_warnings_as_errors(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make(env_id, render_mode="ansi")
        check_env(env.unwrapped)
        sb3_check_env(FinalityEnv(probe=finality_gym.ENV_IDS[env_id]), warn=True)
        assert env.unwrapped.probe == finality_gym.ENV_IDS[env_id]


def test_make_with_module_prefix_in_a_fresh_subprocess():
    code = ("import gymnasium as gym; env = gym.make('finality_gym:Finality-v0'); "
            "o, _ = env.reset(seed=1); print(o.shape, env.action_space)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(58,) Discrete(16)"


def _rollout(env, seed, steps=300):
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    trace = [obs]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        trace.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            trace.append(info["record"])
            obs, _ = env.reset()
            trace.append(obs)
    return trace


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            assert all(np.array_equal(p, q) for p, q in zip(x, y))
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y)
        else:
            assert x == y


def test_seeded_resets_reproduce_whole_episodes():
    full = {"id": "Finality-v0", "info": "full"}
    _same(_rollout(gym.make(**full), 7), _rollout(gym.make(**full), 7))
    a, b = _rollout(gym.make(**full), 7), _rollout(gym.make(**full), 8)
    assert not all(np.array_equal(x, y) for x, y in zip(a[:1], b[:1])) or a[1:3] != b[1:3]


# The namespaced id registers the ids in AsyncVectorEnv's workers however they start: importing
# TorchRL (tests/env/test_vector.py, test_toolkits.py) makes "spawn" the start method of the
# process, whose workers import nothing of the test's.
ASYNC_SAFE_ID = "finality_gym:Finality-v0"


@pytest.mark.parametrize("vector_cls", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv])
def test_vector_envs_run_four_copies(vector_cls):
    envs = vector_cls([lambda: gym.make(ASYNC_SAFE_ID) for _ in range(4)])
    try:
        obs, _ = envs.reset(seed=11)
        assert obs.shape == (4, 58)
        envs.action_space.seed(11)
        ends = 0
        for _ in range(200):
            obs, rewards, terminated, truncated, infos = envs.step(envs.action_space.sample())
            assert envs.single_observation_space.contains(obs[0])
            # the numeric info stacks into typed arrays, one row per env, never object arrays
            assert infos["action_mask"].shape == (4, 16) and infos["action_mask"].dtype == bool
            assert infos["gap"].dtype == np.int64 and infos["exact"].dtype == bool
            assert np.array_equal(infos["ended"], terminated | truncated)
            ends += int(np.sum(terminated | truncated))
        assert ends > 20
    finally:
        envs.close()
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("Finality-v0") for _ in range(4)])
    other = vector_cls([lambda: gym.make(ASYNC_SAFE_ID) for _ in range(4)])
    try:
        a, _ = sync.reset(seed=3)
        b, _ = other.reset(seed=3)
        assert np.array_equal(a, b)
        for action in ([0, 1, 2, 3], [4, 5, 6, 7], [11, 12, 13, 15]):
            ra = sync.step(np.array(action))
            rb = other.step(np.array(action))
            assert np.array_equal(ra[0], rb[0]) and np.array_equal(ra[1], rb[1])
    finally:
        sync.close()
        other.close()


@settings(max_examples=30)
@given(st.integers(0, 2**31), st.sampled_from(ENV_IDS))
def test_observations_stay_inside_the_space(seed, env_id):
    env = gym.make(env_id).unwrapped
    space = env.observation_space
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    episodes = 0
    while episodes < 100:
        assert space.contains(obs), obs
        obs, reward, terminated, truncated, info = env.step(int(rng.integers(16)))
        assert np.isfinite(reward)
        if terminated or truncated:
            assert space.contains(obs)
            episodes += 1
            obs, _ = env.reset()


@settings(max_examples=60)
@given(st.sampled_from([p for p in TWIN_PAIRS if p[0].task_id.startswith("pub")]),
       st.integers(0, 2**31),
       st.lists(st.integers(0, 10), max_size=40))
def test_twin_halves_observe_identically_before_t_det(pair, fault_seed, actions):
    """Non-terminal actions only (0..10), so the comparison runs until t_det."""
    settle, fail = pair
    envs = [FinalityEnv(info="full"), FinalityEnv(info="full")]
    obs = [e.reset(seed=0, options={"task_id": t.task_id, "fault_seed": fault_seed})[0]
           for e, t in zip(envs, pair)]
    assert np.array_equal(obs[0], obs[1])
    for action in actions:
        if envs[0].episode.now >= settle.t_det or envs[0].episode.done:
            break
        out = [e.step(action) for e in envs]
        if envs[0].episode.done:
            break
        assert np.array_equal(out[0][0], out[1][0])
        assert out[0][4].keys() == out[1][4].keys()
        assert all(np.array_equal(out[0][4][k], out[1][4][k]) for k in NUMERIC_INFO)
        assert out[0][4]["result"] == out[1][4]["result"]


def test_options_replay_equals_driving_the_engine():
    env = FinalityEnv(info="full")
    task = PUBLIC.tasks[100]
    actions = [0, 4, 7, 1, 9, 8, 3, 11]
    env.reset(seed=5, options={"task_id": task.task_id, "fault_seed": 3})
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    ep = finality_gym.Episode(task, seed=3)
    play(ep, [env._actions[a] for a in actions])
    assert info["record"] == ep.record()
    assert reward == pytest.approx(-ep.record().gap / 100 / 100)
    assert env.episode.history == ep.history


def test_reward_and_end_flags():
    env = FinalityEnv(reward_scale=10, info="full")
    env.reset(seed=0, options={"task_id": PUBLIC.tasks[0].task_id, "fault_seed": 0})
    _, reward, terminated, truncated, info = env.step(15)  # close
    assert terminated and not truncated
    assert reward == pytest.approx(-info["record"].gap / 100 / 10)
    env.reset(seed=0)
    for _ in range(40):
        _, reward, terminated, truncated, info = env.step(0)
    assert truncated and not terminated and info["record"].lapsed
    assert set(info) == NUMERIC_INFO | {"result", "record"}
    assert info["ended"] and info["gap"] == info["record"].gap


INFO_DTYPES = {"action_mask": np.bool_, "t": np.int64, "calls_used": np.int64,
               "order_value": np.int64, "ended": np.bool_, "gap": np.int64, "exact": np.bool_}


def _check_info(info, first, env, ended):
    """One step's numeric info: reset's keys, dtypes and shapes, and the engine's own state."""
    assert info.keys() == first.keys() == NUMERIC_INFO
    for key, value in info.items():
        assert type(value) is type(first[key]) and value.dtype == first[key].dtype, key
        assert np.shape(value) == np.shape(first[key]), key
    episode = env.episode
    assert np.array_equal(info["action_mask"], env.action_masks())
    assert (info["t"], info["calls_used"]) == (episode.now, episode.calls_used)
    assert info["order_value"] == episode.task.order_value and info["ended"] == ended
    gap = episode.record().gap if ended else 0
    assert info["gap"] == gap and info["exact"] == (ended and gap == 0)
    return bool(info["exact"])


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_numeric_info_is_the_same_at_reset_and_every_step(env_id):
    """The default info, and the same numbers under info="full" with `result` and `record`."""
    env, full = gym.make(env_id).unwrapped, gym.make(env_id, info="full").unwrapped
    rng = np.random.default_rng(0)
    exact = 0
    for seed in range(60):
        _, first = env.reset(seed=seed)
        assert full.reset(seed=seed)[1].keys() == NUMERIC_INFO
        assert {k: v.dtype.type for k, v in first.items()} == INFO_DTYPES
        assert first["action_mask"].shape == (16,) and first["ended"].shape == ()
        assert type(first["t"]) is np.int64 and type(first["ended"]) is np.ndarray
        assert (first["t"], first["calls_used"]) == (120, 0)
        _check_info(first, first, env, False)
        ended = False
        while not ended:
            action = int(rng.integers(16))
            *_, terminated, truncated, info = env.step(action)
            *_, info_full = full.step(action)
            ended = terminated or truncated
            exact += _check_info(info, first, env, ended)
            assert all(np.array_equal(info[k], info_full[k]) for k in info)
            assert info_full["result"] == full.episode.history[-1][3]
            assert ("record" in info_full) == ended
        assert info_full["record"] == full.episode.record()
    assert exact > 0  # some random episodes end exact: the flag is not constant


def test_docstring_documents_every_info_key():
    section = FinalityEnv.__doc__.split("## Info")[1].split("\n    ## ")[0]
    keys = re.findall(r"^\s*\| `(\w+)` \|", section, re.M)
    assert sorted(keys) == sorted(NUMERIC_INFO) == sorted(FinalityEnv().reset(seed=0)[1])

def test_ship_is_masked_after_the_deadline_and_refused_if_taken():
    env = FinalityEnv(info="full")
    _, info = env.reset(seed=0)
    assert env.action_masks()[11] and info["action_mask"][11]
    while env.episode.now <= SHIP_BY:
        info = env.step(8)[4]
    assert not env.action_masks()[11] and not info["action_mask"][11]
    obs, reward, terminated, truncated, info = env.step(11)
    assert "error" in info["result"] and not terminated and obs[57] == 1.0


@pytest.mark.parametrize("arm", ["none", "delayed", "rate_limited", "identity", "full"])
def test_probe_arms(arm):
    task = next(t for t in PUBLIC.tasks if t.archetype == "pending_fail" and t.twin_id is None)
    env = FinalityEnv(probe=arm, info="full")
    env.reset(seed=0, options={"task_id": task.task_id, "fault_seed": 0})
    masks = env.action_masks()
    assert masks[4] == (arm != "none")
    answers = [env.step(4)[4]["result"]]
    env.step(5 + 3)  # wait 120 ...
    while env.episode.now < task.t_det + 10:
        env.step(5)
    for _ in range(3):
        answers.append(env.step(4)[4]["result"])
    delayed_answer_time = env.episode.now - 5 - 120
    captures = [a.get("captures") for a in answers]
    if arm == "none":
        assert all("error" in a for a in answers)
    elif arm == "rate_limited":
        assert [("error" in a) for a in answers] == [False, False, True, True]
        assert not env.action_masks()[4]
        assert captures[1] == {"cap1": "failed_soft"}
    elif arm == "identity":
        assert all(c == {"cap1": "submitted"} for c in captures)
    elif arm == "delayed":
        expected = "failed_soft" if delayed_answer_time >= task.t_det else "unknown"
        assert captures[0] == {}  # as of t=0 no capture had been submitted
        assert captures[-1] == {"cap1": expected}
        assert captures[1] == {"cap1": "unknown"}  # t_det + 10 - 120 < t_det
    else:
        assert captures[0] == {"cap1": "unknown"} and captures[1] == {"cap1": "failed_soft"}


@pytest.mark.parametrize("kwargs,message", [
    ({"split": "holdout"}, "split: unknown split 'holdout'; valid: public, regenerated"),
    ({"archetypes": ["pending_settle", "mystery"]}, "archetypes: must be a non-empty subset"),
    ({"archetypes": []}, "archetypes: must be a non-empty subset"),
    ({"probe": "oracle"}, "probe: unknown arm 'oracle'; valid: full, none, delayed"),
    ({"wait_ticks": (10, 0)}, "wait_ticks: must be a non-empty sequence of ints >= 1"),
    ({"reward_scale": 0}, "reward_scale: must be a finite number > 0"),
    ({"faults": 1.5}, "faults: must be a FaultProfile"),
    ({"faults": {"intensity": 0.3, "families": ["gremlins"]}}, "unknown fault families"),
    ({"dispute_fee": -3}, "cost constants: dispute_fee"),
    ({"render_mode": "human"}, "render_mode: must be None or 'ansi'"),
    ({"info": "verbose"}, "info: must be 'numeric' or 'full'; got 'verbose'"),
])
def test_invalid_kwargs_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        FinalityEnv(**kwargs)


def test_invalid_actions_and_options_raise_and_change_nothing():
    env = FinalityEnv()
    with pytest.raises(finality_gym.InvalidCall, match="reset"):
        env.step(0)
    env.reset(seed=0)
    before = (env.episode.now, env.episode.calls_used, env._encoder.obs.copy())
    for action in (-1, 16, 2.0, "ship", True, np.array([1, 2])):
        with pytest.raises(ValueError, match="invalid action"):
            env.step(action)
    assert (env.episode.now, env.episode.calls_used) == before[:2]
    assert np.array_equal(env._encoder.obs, before[2])
    env.step(np.int64(15))
    with pytest.raises(finality_gym.InvalidCall, match="episode has ended"):
        env.step(0)
    with pytest.raises(ValueError, match="options: unknown keys"):
        env.reset(options={"task": "x"})
    with pytest.raises(ValueError, match="no task 'nope'"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(ValueError, match="fault_seed must be a non-negative int"):
        env.reset(options={"fault_seed": -2})
    # a refused reset draws nothing: the next episodes are those of a generator left alone
    def next_cases() -> list:
        return [(env.reset()[1]["order_value"], env.episode.task.task_id, env.episode.seed)
                for _ in range(5)]
    after_refusals = next_cases()
    env.reset(seed=0)
    env.step(np.int64(15))
    assert after_refusals == next_cases()


def test_archetype_subset_and_custom_waits():
    env = FinalityEnv(archetypes=["hard_decline"], wait_ticks=(5, 500))
    assert env.action_space.n == 14
    for seed in range(20):
        env.reset(seed=seed)
        assert env.episode.task.archetype == "hard_decline"
    env.step(6)
    assert env.episode.now == 620


def test_pickle_round_trip_of_a_fresh_env():
    env = FinalityEnv(probe="delayed", faults=0.5, info="full")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.probe == "delayed" and clone.faults == env.faults
    a, _ = env.reset(seed=4)
    b, _ = clone.reset(seed=4)
    assert np.array_equal(a, b)
    assert env.step(0)[4]["result"] == clone.step(0)[4]["result"]


def test_render_ansi_shows_the_timeline():
    env = FinalityEnv(render_mode="ansi")
    env.reset(seed=0, options={"task_id": PUBLIC.tasks[0].task_id, "fault_seed": 0})
    env.step(4)
    env.step(15)
    text = env.render()
    assert "t= 120  probe_processor()" in text and "close()" in text and "gap" in text


def test_docstring_table_documents_every_index():
    doc = FinalityEnv.__doc__
    rows = re.findall(r"^\s*\| (\d+)(?:\.\.(\d+))? \| (\w+?)(?:_\*)? \|", doc, re.M)
    covered = {}
    for lo, hi, name in rows:
        for i in range(int(lo), int(hi or lo) + 1):
            covered[i] = name
    assert sorted(covered) == list(range(len(OBS_FIELDS)))
    for i, (field, _, _) in enumerate(OBS_FIELDS):
        assert field.startswith(covered[i]), (i, field, covered[i])
    assert f"({len(OBS_FIELDS)},)" in doc


def test_observation_decodes_what_the_tools_said():
    task = next(t for t in PUBLIC.tasks if t.archetype == "duplicate_settlement")
    env = FinalityEnv(faults=finality_gym.FaultProfile.none())
    env.reset(seed=0, options={"task_id": task.task_id, "fault_seed": 0})
    env.step(8)
    env.step(8)
    env.step(8)  # t = 480 > t_det + latencies + batch
    obs = env.step(1)[0]  # ledger: the settlement double-posted
    assert obs[19] == 1 and obs[21] == pytest.approx(2.0) and obs[24] == pytest.approx(0.5)
    obs = env.step(3)[0]  # bank: two credit lines
    assert obs[39] == pytest.approx(2.0) and obs[41] == pytest.approx(0.5)
    obs = env.step(0)[0]
    assert obs[6 + 2] == 1 and obs[12 + 2] == 1 and obs[18] == pytest.approx(0.25)
    obs = env.step(2)[0]
    assert obs[28 + 4] == 1  # paid
    obs = env.step(4)[0]
    assert obs[42 + 2] == 1 and obs[54] == pytest.approx(5 / 1800)  # answered 5 ticks ago
