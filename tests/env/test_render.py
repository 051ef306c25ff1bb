"""The `rgb_array` timeline, the vector envs SB3 builds with it, `python -m eval show`, and the
registration's argument checks."""

import itertools
import struct
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import finality_gym
from agents import make_policy, run_episode
from eval.__main__ import main as eval_main
from eval.experiments.show import default_path, show
from finality_gym import Episode, timeline
from finality_gym.env import FinalityEnv

PUBLIC = finality_gym.load_corpus("public")
PAIRS = [u for u in PUBLIC.units if len(u) == 2]
SHAPE = (800, 1280, 3)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _task(archetype):
    return next(t for t in PUBLIC.tasks if t.archetype == archetype)


def _env(task, fault_seed=0, **kwargs):
    env = gym.make("Finality-v0", render_mode="rgb_array", **kwargs)
    env.reset(options={"task_id": task.task_id, "fault_seed": fault_seed})
    return env


def _frames(task, actions, fault_seed=0, render=lambda episode: True):
    """Play `actions` (until the end) on `task`; the frames, at reset and after each action
    where `render(episode)` says so and at the end, each with the episode's time and whether
    it had ended."""
    env = _env(task, fault_seed)
    episode = env.unwrapped.episode
    frames = [(env.render(), episode.now, False)]
    for action in actions:
        *_, terminated, truncated, _ = env.step(action)
        if terminated or truncated or render(episode):
            frames.append((env.render(), episode.now, terminated or truncated))
        if terminated or truncated:
            break
    return frames, episode


def test_frames_have_one_shape_at_reset_mid_episode_and_end_for_different_episodes():
    finals = []
    for archetype, actions in (("pending_fail", [0, 1, 7, 2, 3, 4, 8, 12]),
                               ("late_chargeback", [4, 7, 4, 11]),
                               ("duplicate_settlement", [3, 9, 10, 5, 14])):
        middle = len(actions) // 2
        frames, episode = _frames(_task(archetype), actions,
                                  render=lambda ep: ep.calls_used == middle)
        assert episode.done and len(frames) == 3 and not frames[1][2] and frames[2][2]
        for frame, _, _ in frames:
            assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8
            assert frame.shape == SHAPE and frame.flags.c_contiguous
        finals.append(frames[-1][0])
        assert not np.array_equal(frames[0][0], frames[-1][0])
    assert not np.array_equal(finals[0], finals[1]) and not np.array_equal(finals[1], finals[2])
    check_env(gym.make("Finality-v0", render_mode="rgb_array").unwrapped)
    blank = FinalityEnv(render_mode="rgb_array").render()  # before reset: an empty timeline
    assert blank.shape == SHAPE and blank.dtype == np.uint8
    assert FinalityEnv(render_mode="rgb_array").metadata["render_modes"] == ["ansi", "rgb_array"]


def test_a_lapse_an_escalation_and_a_fresh_retry_render_at_the_same_size():
    env = _env(_task("unresolvable"), 5)
    for _ in range(40):  # the budget runs out: a lapse
        *_, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            break
    assert truncated and env.render().shape == SHAPE
    frames, _ = _frames(_task("hard_decline"), [10, 4, 8, 8, 0, 14], fault_seed=9,
                        render=lambda ep: False)
    assert frames[-1][0].shape == SHAPE


@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[-1]],
                         ids=lambda p: p[0].twin_id)
def test_twin_halves_render_byte_identical_frames_before_t_det_and_differ_at_the_end(pair):
    settle, fail = pair
    assert settle.t_det == fail.t_det and settle.order_value == fail.order_value
    # read everything, probe, retry with the original key, wait past t_det, then refund
    actions = [0, 1, 2, 3, 4, 9, 6] + [8] * ((max(settle.t_det, 130) - 120) // 120 + 1) + [12]
    before = lambda episode: episode.now < settle.t_det  # noqa: E731
    a, ep_a = _frames(settle, actions, fault_seed=17, render=before)
    b, ep_b = _frames(fail, actions, fault_seed=17, render=before)
    compared = 0
    for (fa, now_a, done_a), (fb, now_b, done_b) in zip(a, b):
        if done_a or done_b or now_a >= settle.t_det:
            break
        assert now_a == now_b and fa.tobytes() == fb.tobytes()
        compared += 1
    assert compared >= 1 or settle.t_det <= 120
    assert ep_a.done and ep_b.done
    assert not np.array_equal(a[-1][0], b[-1][0])  # the ended frames show the truth


def test_the_picture_names_no_task_and_keeps_the_truth_until_the_end():
    forbidden = ["twin", "fail_soft", "fail_hard", *finality_gym.ARCHETYPES]
    for settle, fail in PAIRS[:3]:
        for task in (settle, fail):
            env = _env(task, 3)
            episode = env.unwrapped.episode
            for action in (0, 4, 8, 1, 8, 8, 8, 8, 15):
                said = " ".join(timeline.texts(episode))
                for word in (task.task_id, settle.task_id, fail.task_id, *forbidden):
                    assert word not in said, word
                if not episode.done:
                    assert "truth: hidden until the case ends" in said
                    assert "t_det=" not in said and "gap $" not in said
                env.step(action)
            said = " ".join(timeline.texts(episode))
            assert episode.done and f"t_det={task.t_det}" in said and "gap $" in said
            assert "hidden until the case ends" not in said
            assert not any(word in said for word in (task.task_id, *forbidden))


def _overlaps(episode):
    """The pairs of texts whose boxes, as Agg draws them, intersect."""
    boxes = timeline.text_boxes(episode)
    return [(a, b) for (a, p), (b, q) in itertools.combinations(boxes, 2)
            if p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]]


def _calls(episode, calls):
    for tool, *arg in calls:
        episode.call(tool, **({"ticks": arg[0]} if tool == "wait" else
                              {"key": arg[0]} if arg else {}))
    return episode


READS = [("read_processor",), ("read_ledger",), ("read_erp",), ("read_bank",)]


def test_no_two_texts_overlap_and_a_run_of_retries_shares_one_label():
    # a probe, six keyed retries in a row, a read, three fresh retries (each one more charge)
    episode = _calls(Episode(_task("pending_fail"), seed=3),
                     READS + [("probe_processor",)] + [("retry_capture", "original")] * 6
                     + [("read_processor",)] + [("retry_capture", "fresh")] * 3)
    assert not _overlaps(episode)
    said = timeline.texts(episode)
    assert "t=129-134 retry cap1 with its original key x6" in said
    assert ("t=136-138 retry with a FRESH key: new captures cap2-cap4 (charges #2-#4) x3"
            in said)
    _calls(episode, [("wait", 200)] + READS + [("refund",)])
    assert episode.done and not _overlaps(episode)
    # the longest header line (probe arm rate_limited) beside the position; a footer of large
    # sums beside the legend; twenty captures in one processor read
    late = _calls(Episode(_task("late_chargeback"), seed=34, probe="rate_limited"),
                  READS + [("probe_processor",), ("wait", 100), ("ship",)])
    task = PUBLIC.task("pub-205-partial_ledger")
    held = _calls(Episode(task, seed=72), [("retry_capture", "fresh")] * 3
                  + [("wait", 200), ("ship",)])
    many = _calls(Episode(task, seed=72),
                  [("retry_capture", "fresh")] * 20 + [("wait", 400)] + READS + [("escalate",)])
    assert held.record().liability == 3 * task.order_value  # sums of five digits
    for ended in (late, held, many):
        assert ended.done and not _overlaps(ended)


def test_the_outcome_says_whether_the_goods_shipped_and_the_now_line_is_named_while_running():
    shipped = _calls(Episode(_task("pending_settle"), seed=1), READS)
    said = timeline.texts(shipped)
    assert "now (while running)" in said and "agent's end" not in said
    _calls(shipped, [("ship",)])
    kept = _calls(Episode(_task("pending_fail"), seed=1), READS + [("refund",)])
    for episode, answer in ((shipped, "yes"), (kept, "no")):
        assert episode.record().goods_left is (answer == "yes")  # a shipped event, by anyone
        said = " ".join(timeline.texts(episode))
        assert f"goods shipped: {answer}" in said and "goods left" not in said
        assert "now (while running)" not in said and "agent's end" in timeline.texts(episode)


def test_the_default_png_name_drops_the_spec_files_suffixes_and_is_filesystem_safe():
    task = "pub-000b-pending_fail"
    for spec, name in (("ppo:models/ppo_full.zip", "ppo_models_ppo_full"),
                       ("ppo-greedy:" + ".." + "/runs/ppo_full.ZIP", "ppo-greedy_runs_ppo_full"),
                       ("agents/mine.py:Mine", "agents_mine_Mine"),
                       ("sop:poll_interval=60,max_polls=4", "sop_poll_interval_60_max_polls_4"),
                       ("react", "react"), ("/.py:_", "x")):
        path = default_path(spec, task, 3)
        assert path == Path("results", "show", f"{name}_{task}_s3.png"), spec
    with pytest.raises(ValueError, match="unknown policy '..'"):  # the spec's own parser reads it
        default_path("..", task, 3)
    long = default_path("ppo:/" + "deep/" * 40 + "ppo_noprobe.zip", task, 0)
    stem = long.name.removesuffix(f"_{task}_s0.png")
    assert len(stem) <= 80 and stem.startswith("ppo_deep") and stem.endswith("ppo_noprobe")


def test_finality_gym_imports_without_matplotlib():
    """(The speed of a frame is measured in benchmarks/env.py, never asserted here.)"""
    code = ("import sys, gymnasium as gym, finality_gym; env = gym.make('Finality-v0'); "
            "env.reset(seed=0); env.step(0); print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


VEC_ENV_CHECK = """
import sys

import numpy as np
import torch
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common import vec_env
from stable_baselines3.common.env_util import make_vec_env

import finality_gym  # registers the ids: in the parent, and in every worker SB3 starts


def main(cls):
    torch.set_num_threads(1)  # a 64-wide MLP: threads only contend
    envs = make_vec_env("Finality-v0", n_envs=4, seed=3, vec_env_cls=getattr(vec_env, cls))
    try:
        assert envs.get_attr("render_mode") == ["rgb_array"] * 4  # what make_vec_env passes
        assert envs.reset().shape == (4, 58)
        masks = get_action_masks(envs)  # env_method("action_masks") through the wrappers
        assert masks.shape == (4, 16) and masks.dtype == bool and masks[:, 11].all()
        obs, rewards, dones, infos = envs.step(np.array([0, 4, 8, 15]))
        assert obs.shape == (4, 58) and list(dones) == [False, False, False, True]
        assert infos[3]["ended"] and "terminal_observation" in infos[3]
        assert [f.shape for f in envs.get_images()] == [(800, 1280, 3)] * 4
        model = MaskablePPO("MlpPolicy", envs, n_steps=64, batch_size=64, n_epochs=2, seed=0,
                            device="cpu")
        model.learn(256)
        assert model.num_timesteps >= 256
    finally:
        envs.close()
    print("ok", cls)


if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.parametrize("vec_env_cls", ["DummyVecEnv", "SubprocVecEnv"])
def test_make_vec_env_and_maskable_ppo(vec_env_cls, tmp_path):
    """SB3's make_vec_env passes render_mode="rgb_array". Run as a user's script, whose import
    of finality_gym is what registers the ids in the workers SubprocVecEnv starts (forkserver:
    they import the main module; under pytest they would not)."""
    script = tmp_path / "train_check.py"
    script.write_text(VEC_ENV_CHECK)
    run = subprocess.run([sys.executable, str(script), vec_env_cls], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith(f"ok {vec_env_cls}")


def _usd(cents):
    return f"{'-' if cents < 0 else ''}${abs(cents) / 100:,.2f}"


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    assert len(data) > 20_000  # a drawn timeline, not an empty image
    return struct.unpack(">II", data[16:24])


def test_eval_show_writes_the_png_of_a_scripted_episode_graded_like_the_grader(tmp_path):
    task = _task("pending_fail")
    out = tmp_path / "react.png"
    run = subprocess.run([sys.executable, "-m", "eval", "show", "--policy", "react", "--task",
                          task.task_id, "--seed", "1", "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert _png_size(out) == (1280, 800)
    record = run_episode(make_policy("react"), task, 1)
    assert (f"{record.disposition} at t={record.end_t}; position {_usd(record.position)}, "
            f"reference {_usd(record.reference)}, gap {_usd(record.gap)}") in run.stdout
    path, shown = show("react", task.task_id, 1, out=tmp_path / "again.png")
    assert shown == record
    assert shown.gap == record.gap and shown.fault_firings == record.fault_firings
    oracle = show("finality_oracle", task.task_id, 1, out=tmp_path / "oracle.png")[1]
    assert oracle == run_episode(make_policy("finality_oracle"), task, 1) and oracle.gap == 0


def test_eval_show_plays_a_saved_model_through_ppo_path(tmp_path, monkeypatch, capsys):
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    model_path = tmp_path / "models" / "untrained.zip"
    model_path.parent.mkdir()
    PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=64, device="cpu", seed=0).save(model_path)
    spec = f"ppo:{model_path}"
    task = _task("late_chargeback")
    monkeypatch.chdir(tmp_path)
    assert eval_main(["show", "--policy", spec, "--task", task.task_id, "--seed", "2"]) == 0
    path = default_path(spec, task.task_id, 2)
    assert path.parent == Path("results", "show")
    assert ":" not in path.name and "/" not in path.name and path.name.endswith("_s2.png")
    assert path.name.endswith(f"_untrained_{task.task_id}_s2.png")  # no ".zip" in the name
    assert _png_size(tmp_path / path) == (1280, 800)
    record = run_episode(make_policy(spec), task, 2)
    assert f"gap {_usd(record.gap)}" in capsys.readouterr().out
    assert show(spec, task.task_id, 2, out=tmp_path / "b.png")[1] == record
    assert eval_main(["show", "--policy", "react", "--task", "no-such-task"]) == 2
    assert eval_main(["show", "--policy", "react", "--task", task.task_id, "--out",
                      str(tmp_path / "x.txt")]) == 2


def test_wait_ticks_that_is_not_a_sequence_is_a_value_error():
    with pytest.raises(ValueError, match="wait_ticks: must be a non-empty sequence"):
        gym.make("Finality-v0", wait_ticks=5)
    with pytest.raises(ValueError, match="wait_ticks"):
        FinalityEnv(wait_ticks=None)
    assert gym.make("Finality-v0", wait_ticks=[15, 45]).action_space.n == 14


def test_an_ids_probe_arm_cannot_be_overridden():
    with pytest.raises(ValueError, match=r"probe: FinalityNoProbe-v0 is the 'none' probe arm.*"
                                         r"probe='full'"):
        gym.make("FinalityNoProbe-v0", probe="full")
    with pytest.raises(ValueError, match="Finality-v0 is the 'full' probe arm"):
        gym.make("Finality-v0", probe="delayed")
    for env_id, arm in finality_gym.ENV_IDS.items():
        assert gym.make(env_id).unwrapped.probe == arm
        assert gym.make(env_id, probe=arm).unwrapped.probe == arm  # naming its own arm is fine
        assert gym.spec(env_id).kwargs["registered_probe"] == arm
    with pytest.raises(ValueError, match="render_mode: must be None or 'ansi' or 'rgb_array'"), \
            pytest.warns(UserWarning, match="not in the possible render_modes"):
        gym.make("FinalityNoProbe-v0", render_mode="rgb")
