"""`--algo`: sweeps of DQN and RecurrentPPO end to end, a resumed DQN seed, the options each
algorithm takes or refuses, and runs and sweeps saved before `--algo` (PPO and the masked
shorthand are tested in tests/training/test_train.py and tests/training/test_sweep.py)."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import finality_gym
from agents import make_policy, run_episode
from eval.sweeps.provenance import FIELDS, describe
from train.__main__ import main as train_cli
from train.config import ALGOS, HYPERPARAMETERS, TrainConfig
from train.run import checkpoint_steps, latest_checkpoint, make_envs, new_model
from train.seed import train_seed
from train.sweep import check, recipe


COMMON = ["--timesteps", "2048", "--n-envs", "2", "--eval-every", "1024",
          "--validation-stride", "32", "--checkpoint-every", "1024", "--final-seeds", "1"]
TINY = {
    "dqn": ["--algo", "dqn", "--batch-size", "32", "--learning-starts", "256", *COMMON],
    "recurrent_ppo": ["--algo", "recurrent_ppo", "--n-steps", "256", "--batch-size", "512",
                      "--n-epochs", "1", *COMMON],
}


# One seed each (the aggregate of several is tests/training/test_sweep.py's): what is tested here
# is each algorithm's layout, grading and resume, and the CI's time is short.
SEEDS = {"dqn": [0], "recurrent_ppo": [0]}


def _sweep(tmp_path_factory, algo: str) -> Path:
    out = tmp_path_factory.mktemp(algo) / "sweep"
    seeds = ",".join(map(str, SEEDS[algo]))
    assert train_cli(["sweep", "--seeds", seeds, "--workers", "2", "--out", str(out),
                      *TINY[algo]]) == 0
    return out


@pytest.fixture(scope="module")
def dqn_sweep(tmp_path_factory):
    return _sweep(tmp_path_factory, "dqn")


@pytest.fixture(scope="module")
def recurrent_sweep(tmp_path_factory):
    return _sweep(tmp_path_factory, "recurrent_ppo")


def _validations(run: Path) -> list[int]:
    return [json.loads(line)["timesteps"] for line in
            (run / "validation.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo, fixture", [("dqn", "dqn_sweep"),
                                           ("recurrent_ppo", "recurrent_sweep")])
def test_a_sweep_of_another_algorithm_writes_the_whole_layout_and_the_aggregate(
        algo, fixture, request):
    out = request.getfixturevalue(fixture)
    saved = json.loads((out / "sweep.json").read_text())["recipe"]
    assert saved["algo"] == algo and saved["masked"] is False
    # the recipe holds the algorithm's own hyperparameters, and None for the others'
    own = HYPERPARAMETERS[algo]
    assert all(saved[name] is not None for name in own)
    assert saved["n_epochs" if algo == "dqn" else "buffer_size"] is None
    name = ALGOS[algo].name
    seeds = SEEDS[algo]
    for seed in seeds:
        run = out / f"seed_{seed}"
        assert json.loads((run / "config.json").read_text())["algo"] == algo
        for file in ("best_model.zip", "best.json", "learning_curve.png", "result.json",
                     f"checkpoints/{algo}_1024_steps.zip", f"checkpoints/{algo}_2048_steps.zip"):
            assert (run / file).is_file(), file
        assert latest_checkpoint(run).name == f"{algo}_2048_steps.zip"
        assert _validations(run) == [2, 1026, 2048]
        assert list((run / "tb").glob(f"{name}_*/events.out.tfevents.*"))
        # graded under sb3:PATH (ppo:PATH refuses what is not PPO), as the grader loads it
        spec = f"sb3:{run.resolve() / 'best_model.zip'}"
        for split in ("public", "regenerated"):
            graded = json.loads((run / f"eval_{split}" / "summary.json").read_text())
            assert graded["policies"][spec]["episodes"] == 321
    policy = make_policy(spec)
    record = run_episode(policy, finality_gym.load_corpus("public").tasks[3], 0)
    assert record.disposition in ("ship", "refund", "write_off", "escalate", "close")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == seeds and summary["algorithm"] == name
    # every seed's machine, in the summary and the report's caption
    machine = json.loads((out / "seed_0" / "result.json").read_text())["machines"][0]
    assert summary["training"]["0"]["machines"] == [machine]
    assert summary["machines"] == [describe(machine)]
    assert f"Trained on: {describe(machine)}." in (out / "report.md").read_text()
    for split in summary["splits"].values():
        assert [row["seed"] for row in split["seeds"]] == seeds
        a = split["across_seeds"]
        assert a["mean_gap"] == pytest.approx(
            sum(r["mean_gap"] for r in split["seeds"]) / len(seeds), abs=1e-5)
        assert a["mean_gap_ci"][0] <= a["mean_gap"] <= a["mean_gap_ci"][1]
    assert (out / "report.md").is_file() and (out / "seeds.png").is_file()


def test_a_dqn_seed_killed_after_a_checkpoint_resumes_from_it(dqn_sweep, tmp_path, capsys):
    """Seed 0 killed between its two checkpoints, resumed as a sweep worker resumes it (here,
    in this process: a whole sweep would start a worker and aggregate again)."""
    out = tmp_path / "sweep"
    shutil.copytree(dqn_sweep, out)
    one = out / "seed_0"
    (one / "result.json").unlink()
    (one / "checkpoints" / "dqn_2048_steps.zip").unlink()
    lines = (one / "validation.jsonl").read_text().splitlines()
    (one / "validation.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    # the sweep's recipe is the saved one: an option that would change it is refused
    assert train_cli(["sweep", "--seeds", "0", "--out", str(out), *TINY["dqn"],
                      "--exploration-final-eps", "0.1"]) == 2
    assert "differs in exploration_final_eps" in capsys.readouterr().err
    config = TrainConfig.from_json((one / "config.json").read_text())
    result = train_seed(dataclasses.replace(config, out=str(one)))
    assert f"resuming {one / 'checkpoints' / 'dqn_1024_steps.zip'} at 1024 steps" in \
        capsys.readouterr().out
    assert result["resumed_from"] == 1024 and result["timesteps"] == 2048
    # provenance: the first process's machine is kept, the resuming one's added with its step
    first = json.loads((dqn_sweep / "seed_0" / "result.json").read_text())["machines"]
    assert len(first) == 1 and first[0]["from_timesteps"] == 0
    assert result["machines"][0] == first[0]
    assert [m["from_timesteps"] for m in result["machines"]] == [0, 1024]
    assert all(set(FIELDS) <= set(m) and m["torch"] == torch.__version__ and m["cores"] >= 1
               for m in result["machines"])
    assert _validations(one) == [2, 1026, 2048]
    assert latest_checkpoint(one).name == "dqn_2048_steps.zip"
    graded = json.loads((one / "eval_regenerated" / "summary.json").read_text())
    assert graded["policies"][f"sb3:{one / 'best_model.zip'}"]["episodes"] == 321


@pytest.mark.parametrize("args, message", [
    (["--masked", "--algo", "a2c"], "masked is algo maskable_ppo; it conflicts with algo a2c"),
    (["--masked", "--algo", "ppo"], "masked is algo maskable_ppo; it conflicts with algo ppo"),
    (["--algo", "a2c", "--n-epochs", "3"],
     "n_epochs: a2c does not take it (it takes learning_rate, n_steps, gae_lambda, ent_coef)"),
    (["--algo", "a2c", "--batch-size", "64"], "batch_size: a2c does not take it"),
    (["--algo", "dqn", "--n-steps", "8"], "n_steps: dqn does not take it"),
    (["--buffer-size", "1000"], "buffer_size: ppo does not take it"),
    (["--masked", "--exploration-fraction", "0.2"],
     "exploration_fraction: maskable_ppo does not take it"),
    (["--algo", "dqn", "--exploration-final-eps", "2"], "exploration_final_eps must lie in"),
    (["--algo", "dqn", "--learning-starts", "-1"], "learning_starts must be >= 0"),
])
@pytest.mark.parametrize("command", ["ppo", "sweep"])
def test_options_an_algorithm_does_not_take_are_refused_before_anything_is_written(
        command, args, message, tmp_path, capsys, monkeypatch):
    import train.__main__ as cli

    def no_training(*args, **kwargs):
        raise AssertionError("trained")

    monkeypatch.setattr(cli, "train", no_training)
    monkeypatch.setattr(cli, "sweep", no_training)
    out = tmp_path / "out"
    assert cli.main([command, "--out", str(out), *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and len(error.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("command", ["ppo", "sweep"])
def test_every_option_of_the_recipe_is_on_the_command_line_with_its_help(command, capsys):
    """The options are built from TrainConfig's fields: each field with help is an option whose
    --help says it, with the default the configuration takes (an algorithm's own hyperparameter:
    the algorithms that take it, with theirs)."""
    with pytest.raises(SystemExit):
        train_cli([command, "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    options = [f for f in dataclasses.fields(TrainConfig) if "help" in f.metadata]
    assert len(options) == 23
    for field in options:
        assert "--" + field.name.replace("_", "-") in text, field.name
        if field.name != "timesteps":  # each command says its own
            assert "".join(field.metadata["help"].split()) in text, field.name
    for expected in ("--n-envsN_ENVStrainingenvssteppedtogether(default8)",
                     "replaybuffer,intransitions(dqnonly,default100000)",
                     "(default0.0003forppo,maskable_ppo,recurrent_ppo;0.0007fora2c;0.0001fordqn)",
                     "--algo{ppo,maskable_ppo,recurrent_ppo,a2c,dqn}",
                     "--frame-stackFRAME_STACKthepolicyseesthelastNobservations"):
        assert expected in text
    assert "--gamma" not in text and "--clip-range" not in text


def test_the_masked_shorthand_is_maskable_ppo():
    assert TrainConfig(masked=True).algo == "maskable_ppo"
    assert TrainConfig(masked=True, algo="maskable_ppo") == TrainConfig(algo="maskable_ppo")
    assert TrainConfig(algo="maskable_ppo").masked and not TrainConfig(algo="dqn").masked


@pytest.mark.parametrize("algo", list(ALGOS))
def test_each_algorithm_gets_its_own_hyperparameters(algo):
    """What the configuration says is what SB3 trains with (a value SB3 wraps, a schedule or a
    `TrainFreq`, read back; the LSTM's size from the policy)."""
    config = TrainConfig(algo=algo, n_envs=2)
    model = new_model(config, make_envs(config))
    assert type(model).__name__ == ALGOS[algo].name and model.gamma == 1.0
    assert type(model.policy).__name__ == {
        "maskable_ppo": "MaskableActorCriticPolicy", "dqn": "DQNPolicy",
        "recurrent_ppo": "RecurrentActorCriticPolicy"}.get(algo, "ActorCriticPolicy")
    for name, value in config.hyperparameters.items():
        actual = (model.policy.lstm_output_dim if name == "lstm_hidden_size"
                  else getattr(model, name))
        actual = actual(1.0) if callable(actual) else getattr(actual, "frequency", actual)
        assert actual == value == HYPERPARAMETERS[algo][name], name


def test_a_configuration_saved_before_algo_is_the_algorithm_masked_named():
    old = {"env": "Finality-v0", "timesteps": 2048, "seed": 0, "n_envs": 2, "masked": True,
           "out": "runs/old", "learning_rate": 3e-4, "n_steps": 256, "batch_size": 256,
           "n_epochs": 2, "gamma": 1.0, "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.01,
           "net_arch": [128, 128], "eval_every": 1024, "validation_stride": 32,
           "checkpoint_every": 1024, "final_seeds": 1, "torch_threads": 1}
    assert TrainConfig.from_json(json.dumps(old)).algo == "maskable_ppo"
    assert TrainConfig.from_json(json.dumps({**old, "masked": False})).algo == "ppo"


def test_a_sweep_saved_before_algo_resumes_as_ppo_or_maskable_ppo(tmp_path):
    old = {"env": "Finality-v0", "timesteps": 2048, "n_envs": 2, "masked": False,
           "learning_rate": 3e-4, "n_steps": 256, "batch_size": 256, "n_epochs": 2,
           "gamma": 1.0, "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.01,
           "net_arch": [128, 128], "eval_every": 1024, "validation_stride": 32,
           "checkpoint_every": 1024, "final_seeds": 1, "torch_threads": 1}
    ppo = TrainConfig.from_dict(old)
    for masked, config in ((False, ppo), (True, TrainConfig.from_dict({**old, "masked": True}))):
        out = tmp_path / f"masked_{masked}"
        out.mkdir()
        (out / "sweep.json").write_text(json.dumps({"recipe": {**old, "masked": masked},
                                                    "seeds": [0, 1]}))
        assert config.algo == ("maskable_ppo" if masked else "ppo")
        assert check(config, (2,), out) == (0, 1, 2)
        assert "algo" not in old and recipe(config)["algo"] == config.algo
    with pytest.raises(ValueError, match=r"another recipe \(differs in algo, masked\)"):
        check(ppo, (0,), tmp_path / "masked_True")


def test_the_latest_checkpoint_is_found_whatever_its_algorithm_prefix(tmp_path):
    """A run from before `--algo` wrote `ppo_` for MaskablePPO too; resumed, it writes
    `maskable_ppo_`."""
    import zipfile
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("ppo_1024_steps.zip", "maskable_ppo_2048_steps.zip", "notes_steps.zip"):
        with zipfile.ZipFile(folder / name, "w") as archive:  # SB3's first and last entries
            archive.writestr("data", "{}")
            archive.writestr("_stable_baselines3_version", "2")
    (folder / "maskable_ppo_4096_steps.zip").write_bytes(b"PK\x03\x04 torn")
    assert latest_checkpoint(tmp_path).name == "maskable_ppo_2048_steps.zip"
    assert [checkpoint_steps(Path(n)) for n in (
        "recurrent_ppo_3072_steps.zip", "ppo_1024_steps.zip", "notes_steps.zip",
        "2048_steps.zip")] == [3072, 1024, None, None]
