"""PPO training: TensorBoard scalars, a model the grader grades, resume, masked actions."""

import json
import signal
from pathlib import Path

import gymnasium as gym
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import finality_gym
from agents import make_policy, run_episode
from finality_gym.policy import GymPolicy
from train.__main__ import main as train_cli
from train.config import TrainConfig
from train.run import latest_checkpoint, train


PUBLIC = finality_gym.load_corpus("public")


def _config(tmp_path, **changes):
    base = dict(timesteps=2048, n_envs=2, n_steps=256, batch_size=256, n_epochs=2,
                eval_every=1024, validation_stride=32, checkpoint_every=1024, final_seeds=1,
                out=str(tmp_path / "run"))
    return TrainConfig(**{**base, **changes})


def _scalars(run: Path) -> dict[str, list]:
    tags: dict[str, list] = {}
    for events in (run / "tb").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.setdefault(tag, []).extend(e.step for e in acc.Scalars(tag))
    return tags


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    config = _config(tmp_path_factory.mktemp("ppo"))
    # graded in this process (`make test` keeps both cores busy: two spawned graders, each
    # importing torch, only added their start-up); `train ppo`'s own path is the CLI tests'
    result = train(config, grading_workers=1)
    return config, result


def test_training_writes_our_scalars_and_a_model_the_grader_grades(trained):
    config, result = trained
    run = Path(config.out)
    tags = _scalars(run)
    for tag in ("validation/mean_gap", "validation/exact_rate", "validation/premature_rate"):
        assert tag in tags and len(tags[tag]) >= 2, tag
    assert any(t.startswith("train/") for t in tags)  # SB3's own curves
    assert "rollout/ep_rew_mean" in tags
    assert json.loads((run / "config.json").read_text())["timesteps"] == 2048
    assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    policy = make_policy(f"ppo:{run / 'best_model.zip'}")
    record = run_episode(policy, PUBLIC.tasks[3], 0)
    assert record.disposition in ("ship", "refund", "write_off", "escalate", "close")
    for split in ("public", "regenerated"):
        summary = json.loads((run / f"eval_{split}" / "summary.json").read_text())
        name = f"ppo:{run / 'best_model.zip'}"
        assert name in summary["policies"] and "finality_gate" in summary["policies"]
        assert summary["policies"][name]["episodes"] == 321
    assert result["timesteps"] == 2048 == int(latest_checkpoint(run).stem.split("_")[1])


def _snapshot(folder: Path) -> dict:
    """Every file under a folder with its size and modification time: what "nothing written"
    compares."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _rows(rows: list[dict], spec: str) -> list[dict]:
    """The rows of one policy in a fixed order."""
    return sorted((row for row in rows if row["policy"] == spec),
                  key=lambda row: (row["task_id"], row["seed"]))


def test_resume_continues_a_moved_run_in_place_and_regrades_its_new_best_model(
        trained, tmp_path):
    """`--resume` continues the folder it is given, not the one its config.json was saved in;
    when it trains further, the final grading is of the new best model, not the old rows."""
    import shutil

    from eval.grading.grader import RunConfig, grade
    from eval.grading.runfolder import read_rows
    config, _ = trained
    original = Path(config.out)
    run = tmp_path / "moved"
    shutil.copytree(original, run)
    before = _snapshot(original)
    spec = f"ppo:{run / 'best_model.zip'}"
    # Nothing left to train: the run is graded in place, under its new path.
    assert train_cli(["ppo", "--resume", "--out", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["out"] == str(run)
    old_rows = _rows(read_rows(run / "eval_public" / "episodes.jsonl"), spec)
    assert len(old_rows) == 321
    # Train further. The saved best is made the worst possible, so that the resumed run's first
    # validation writes a new best model whatever the tiny run learned.
    best = json.loads((run / "best.json").read_text())
    (run / "best.json").write_text(json.dumps({**best, "mean_gap": 1e9}))
    old_model = (run / "best_model.zip").read_bytes()
    assert train_cli(["ppo", "--resume", "--out", str(run), "--timesteps", "4096"]) == 0
    assert _snapshot(original) == before
    result = json.loads((run / "result.json").read_text())
    assert result["timesteps"] >= 4096
    assert int(latest_checkpoint(run).stem.split("_")[1]) == result["timesteps"]
    steps = [json.loads(line)["timesteps"] for line in
             (run / "validation.jsonl").read_text().splitlines()]
    # every eval_every (1024) steps from the last validation, 2048, not from the resumed step:
    # none again at its first step (2050)
    assert steps == [2, 1026, 2048, 3072, 4096]
    assert max(max(v) for v in _scalars(run).values()) >= 4096
    # The graded rows are those of the new best model, as a fresh grading of it gives them.
    assert (run / "best_model.zip").read_bytes() != old_model
    grade(RunConfig((spec,), split="public", seeds=(0,)), tmp_path / "fresh", workers=1,
          progress=False)
    fresh = read_rows(tmp_path / "fresh" / "episodes.jsonl")  # whole, with their calls
    rows = _rows(read_rows(run / "eval_public" / "episodes.jsonl"), spec)
    assert rows == _rows(fresh, spec)
    assert rows != old_rows


def test_a_new_run_refuses_a_folder_holding_another_run(trained, tmp_path, capsys):
    import shutil
    config, _ = trained
    run = tmp_path / "run"
    shutil.copytree(config.out, run)
    before = _snapshot(run)
    assert train_cli(["ppo", "--out", str(run), "--timesteps", "512", "--n-envs", "2",
                      "--n-steps", "128", "--batch-size", "128", "--final-seeds", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {run} is not an empty folder") and "--resume" in error
    assert "empty folder" in error and len(error.splitlines()) == 1
    assert _snapshot(run) == before


def test_resume_refuses_options_that_would_change_the_recipe(trained, tmp_path, capsys):
    """--resume continues the saved recipe; an option it would silently ignore is refused."""
    import shutil
    config, _ = trained
    run = tmp_path / "run"
    shutil.copytree(config.out, run)
    before = _snapshot(run)
    assert train_cli(["ppo", "--resume", "--out", str(run), "--timesteps", "4096",
                      "--ent-coef", "0.02", "--seed", "3", "--masked"]) == 2
    error = capsys.readouterr().err
    assert error == ("error: --resume continues the saved run's recipe: --ent-coef, --masked, "
                     "--seed cannot change it (only --timesteps can); train a new run into "
                     "another --out folder instead\n")
    assert _snapshot(run) == before


def test_an_out_folder_under_a_file_is_a_one_line_error(tmp_path, capsys):
    file = tmp_path / "somefile"
    file.write_text("mine")
    assert train_cli(["ppo", "--out", str(file / "x"), "--timesteps", "512"]) == 2
    assert capsys.readouterr().err == f"error: --out {file / 'x'}: {file} is a file, not a folder\n"
    assert file.read_text() == "mine"


def test_ctrl_c_is_a_hint_not_a_traceback(tmp_path, capsys, monkeypatch):
    import train.__main__ as cli

    def interrupted(config, resume=False, grading_workers=2):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "train", interrupted)
    # main ignores a further Ctrl-C from then on; in this process that would outlive the test,
    # and every subprocess a later test starts would inherit it (a sweep deaf to Ctrl-C)
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["ppo", "--out", str(tmp_path / "run")]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, handler)
    assert capsys.readouterr().err == "interrupted; resume with --resume\n"


def test_resume_needs_a_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert train_cli(["ppo", "--resume", "--out", str(run)]) == 2
    assert f"{run} holds no config.json" in capsys.readouterr().err
    (run / "config.json").write_text(TrainConfig(out="elsewhere").to_json())
    before = _snapshot(run)
    assert train_cli(["ppo", "--resume", "--out", str(run)]) == 2
    assert f"no checkpoint in {run / 'checkpoints'}" in capsys.readouterr().err
    assert _snapshot(run) == before and not Path("elsewhere").exists()


@pytest.mark.parametrize("args, message", [
    (["--timesteps", "0"], "timesteps must be >= 1, got 0"),
    (["--seed", "-1"], "seed must lie in 0..2**32-1"),
    (["--seed", str(2**32)], "seed must lie in 0..2**32-1"),
    (["--n-envs", "0"], "n_envs must be >= 1"),
    (["--n-steps", "1", "--n-envs", "1"], "n_steps * n_envs must be >= 2"),
    (["--batch-size", "1"], "batch_size must be >= 2"),
    (["--learning-rate", "0"], "learning_rate must be a finite number > 0"),
    (["--learning-rate", "nan"], "learning_rate must be a finite number > 0"),
    (["--ent-coef", "-0.1"], "ent_coef must be a finite number >= 0"),
    (["--final-seeds", "0"], "final_seeds must be >= 1"),
    (["--resume", "--timesteps", "0"], "timesteps must be >= 1, got 0"),
])
def test_bad_numbers_are_refused_before_training(args, message, tmp_path, capsys, monkeypatch):
    import train.__main__ as cli

    def no_training(config, resume=False):
        raise AssertionError(f"trained with {config}")

    monkeypatch.setattr(cli, "train", no_training)
    run = tmp_path / "run"
    if "--resume" in args:
        run.mkdir()
        (run / "config.json").write_text(TrainConfig(out=str(run)).to_json())
    assert cli.main(["ppo", "--out", str(run), *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and len(error.splitlines()) == 1
    assert not run.exists() or [p.name for p in run.iterdir()] == ["config.json"]


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(_config(tmp_path), resume=True)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="env: unknown id"):
        TrainConfig(env="CartPole-v1")
    with pytest.raises(ValueError, match="n_envs must be >= 1"):
        TrainConfig(n_envs=0)


def test_the_masked_variant_never_takes_a_masked_action(tmp_path):
    from sb3_contrib import MaskablePPO
    config = _config(tmp_path, env="FinalityNoProbe-v0", masked=True, timesteps=1024,
                     eval_every=512)
    train(config, grade=False)  # the masks are what is tested, not the final grade
    model = MaskablePPO.load(Path(config.out) / "best_model.zip", device="cpu")
    env = gym.make("FinalityNoProbe-v0", wait_ticks=(10, 30, 60, 120)).unwrapped
    late_states = 0
    for episode in range(60):
        obs, _ = env.reset(seed=episode)
        done = False
        steps = 0
        while not done:
            mask = env.action_masks()
            late_states += not mask[11]
            action, _ = model.predict(obs, deterministic=episode % 2 == 0, action_masks=mask)
            assert mask[int(action)], (int(action), mask)
            # keep some episodes open past the deadline, where ship is masked
            if steps < 12 and episode % 3 == 0 and int(action) >= 11:
                action = 8
            obs, _, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
            steps += 1
    assert late_states > 0
    seen = []

    def predict(obs, mask):
        action, _ = model.predict(obs, deterministic=True, action_masks=mask)
        seen.append(bool(mask[int(action)]))
        assert not mask[4]  # the probe is masked in this arm
        return int(action)

    for task in PUBLIC.tasks[:40]:
        run_episode(GymPolicy("masked", predict), task, 0, probe="none")
    assert seen and all(seen)


def test_a_damaged_model_is_a_clear_error(trained, tmp_path):
    import zipfile

    from agents.learned.policy import load_sb3
    config, _ = trained
    damaged = tmp_path / "damaged.zip"
    with zipfile.ZipFile(Path(config.out) / "best_model.zip") as src, \
            zipfile.ZipFile(damaged, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, b"garbage" if item.filename == "policy.pth" else data)
    with pytest.raises(ValueError, match="could not be loaded as PPO"):
        load_sb3(damaged)


def test_a_sampled_policy_depends_only_on_task_and_seed(trained):
    """Sampling is seeded per episode: the same (task, seed) gives the same episode whatever
    ran before, and both halves of a twin pair act alike before t_det."""
    from agents import brief_for
    config, _ = trained
    spec = f"ppo:{Path(config.out) / 'best_model.zip'}"
    policy = make_policy(spec)
    tasks = PUBLIC.tasks[:30]
    forward = [run_episode(policy, t, s) for t in tasks for s in (0, 1)]
    backward = [run_episode(policy, t, s) for t in reversed(tasks) for s in (1, 0)]
    assert {(r.task_id, r.seed): r for r in forward} == {(r.task_id, r.seed): r for r in backward}
    greedy = make_policy(f"ppo-greedy:{Path(config.out) / 'best_model.zip'}")
    assert greedy.name.startswith("ppo-greedy:")
    for settle, fail in [u for u in PUBLIC.units if len(u) == 2][:15]:
        calls = []
        for task in (settle, fail):
            episode = finality_gym.Episode(task, seed=1)
            policy.reset(brief_for(task, 1, "full"))
            seen, result = [], None
            while not episode.done and episode.now < task.t_det:
                tool, args = policy.act(result)
                seen.append((episode.now, tool, args))
                result = episode.call(tool, **args)
            calls.append(seen)
        assert calls[0] == calls[1]


def test_a_checkpoint_cut_short_is_never_resumed_from(tmp_path):
    """A process killed while SB3 writes a checkpoint leaves a file cut short. Cut inside its
    `policy.pth` entry (itself a zip), `zipfile.is_zipfile` finds that entry's directory and
    says yes: resuming from it failed with "No data found in the saved file" (a CI run)."""
    import zipfile

    from stable_baselines3 import PPO
    model = PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=8, batch_size=8,
                policy_kwargs={"net_arch": [8]}, seed=0, device="cpu")
    (tmp_path / "checkpoints").mkdir()
    model.save(tmp_path / "checkpoints" / "ppo_100_steps.zip")
    model.save(tmp_path / "whole.zip")
    data = (tmp_path / "whole.zip").read_bytes()
    torn = tmp_path / "checkpoints" / "ppo_200_steps.zip"
    fooled = 0
    for cut in range(100, len(data) - 1, 97):
        torn.write_bytes(data[:cut])
        fooled += zipfile.is_zipfile(torn)
        assert latest_checkpoint(tmp_path).name == "ppo_100_steps.zip", cut
    assert fooled  # the cuts that fooled the old check were among them
    torn.write_bytes(data)
    assert latest_checkpoint(tmp_path).name == "ppo_200_steps.zip"
