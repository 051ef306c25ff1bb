"""One training run on `Finality-v0` with stable-baselines3 (`python -m train ppo`): PPO by
default, or any algorithm of `ALGOS` (`--algo`: sb3-contrib's MaskablePPO, `--masked` for short,
and RecurrentPPO; SB3's A2C and DQN), its recipe a `TrainConfig` (`train/config.py`).

Read it top to bottom: the validation callback (the package's, `finality_gym.callbacks`, which
grades the policy on public-split tasks as the grader plays them and logs the grade to
TensorBoard next to SB3's; this one also keeps the run's files), the vectorized training
envs, checkpoints, the best model by validation mean gap, resuming, the learning curve, and at
the end the same headline grading as every scripted policy, on both splits.

A run folder holds: `config.json`, `tb/` (TensorBoard: `tensorboard --logdir runs`),
`checkpoints/` (`<algo>_<steps>_steps.zip`; the last one is the final model), `best_model.zip`
(+ `best.json`; every archive saved with a `finality.json` member that says what it was trained
for: `agents/learned/trained_for.py`, `saver`), `validation.jsonl`, `machines.jsonl` (the
machine of every process that trained it), `learning_curve.png`, and `eval_public/`,
`eval_regenerated/` (headline folders).
A new run needs a new or empty folder; a resumed one continues in the folder it is given,
and regrades from scratch if it trained further.

Choices where the issue is silent: training draws tasks from `public` with fresh fault seeds;
validation uses every `validation_stride`-th independent unit of public under fault seed 100
(the grading seeds are 0..4; `finality_gym.validation`); `gamma = 1` (the reward is the terminal
economic gap, and time already costs money in the world); the training reward is the gap
relative to the order value (the env's `reward="relative"`); validation and the final grading run the model as it is trained, a
stochastic policy (sampled with a per-episode seed, see `agents/learned/policy.py`; a DQN model
greedily, the policy a Q-learner learns, and a RecurrentPPO model with its LSTM state carried
through each episode); the final grading compares it with the nine scripted policies in the
env's probe arm.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from pathlib import Path

import gymnasium as gym
import torch
from gymnasium.wrappers import FrameStackObservation
from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

from finality_gym.callbacks import ValidationCallback as Validation
from agents.learned.algorithms import PPO_ALGORITHMS
from agents.learned.policy import sb3_policy
from agents.learned.trained_for import TrainedFor, stamp
import eval.experiments.headline as headline
from eval.experiments.headline import HEADLINE
from eval.sweeps.provenance import machine
from eval.reports.figures import save_figure, subplots
from eval.grading.runfolder import prepare, save_atomic, write_atomic

from .config import ALGOS, POLICY_HYPERPARAMETERS, TrainConfig
from .recurrent import fast_updates

def progress_line(metrics: dict) -> str:
    """A validation's progress line (the sweep prefixes it with "seed k: ")."""
    return (f"{metrics['timesteps']:>10,} steps  {metrics['steps_per_second']:6,.0f} steps/s  "
            f"validation gap ${metrics['validation_mean_gap']:.2f}  best "
            f"${metrics['best_mean_gap']:.2f} at {metrics['best_timesteps']:,}")


class ValidationCallback(Validation):
    """The package's validation (`finality_gym.callbacks`), and for a run folder: the history
    in `validation.jsonl`, the best model kept, a progress line, `report` called.

    A resumed run counts from the last validation recorded in `out`, not from its checkpoint:
    counting from scratch, it would validate again at its first step."""

    def __init__(self, config: TrainConfig, out: Path, label: str = "", report=None):
        super().__init__(config.eval_every, config.probe, config.validation_stride,
                         policy=lambda model: sb3_policy(model, "validation"))
        self.config = config
        self.out = out
        self.label = label
        self.report = report
        best = out / "best.json"
        if best.exists():
            self.best = json.loads(best.read_text())
        last = last_validated(out)
        if last is not None:
            self.last = last
        self.clock = (0, time.perf_counter())

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self.clock = (self.num_timesteps, time.perf_counter())

    def evaluate(self) -> dict:
        result = super().evaluate()
        with open(self.out / "validation.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        if self.best is result:
            save_atomic(self.out / "best_model.zip", saver(self.model, self.config))
            write_atomic(self.out / "best.json", json.dumps(self.best, indent=2) + "\n")
        steps, started = self.clock
        now = time.perf_counter()
        rate = (self.num_timesteps - steps) / max(now - started, 1e-9)
        self.clock = (self.num_timesteps, now)
        metrics = {"timesteps": self.num_timesteps, "steps_per_second": round(rate, 1),
                   **{f"validation_{k}": v for k, v in result.items() if k != "timesteps"},
                   "best_mean_gap": self.best["mean_gap"],
                   "best_timesteps": self.best["timesteps"]}
        print(self.label + progress_line(metrics), flush=True)
        if self.report is not None:
            self.report(metrics, self.model)
        return result


def saver(model, config: TrainConfig):
    """`save(path)` for `save_atomic`: the model as SB3 saves it, then stamped with what it was
    trained for (the run's env: its id, probe arm, observation layout and action table), so
    that a model graded or exported later on another arm is refused, not misgraded."""
    trained = TrainedFor.of_env(config.env)

    def save(path: Path) -> None:
        model.save(path)
        stamp(Path(path), trained)
    return save


class Checkpoints(CheckpointCallback):
    """SB3's checkpoints (`<algo>_<steps>_steps.zip` every `save_freq` calls), each written
    whole or not at all and stamped as `saver` stamps (SB3's own writes the bare archive)."""

    def __init__(self, save_freq: int, folder: Path, config: TrainConfig):
        super().__init__(save_freq, str(folder), name_prefix=config.algo)
        self.config = config

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            path = Path(self._checkpoint_path(extension="zip"))
            path.parent.mkdir(parents=True, exist_ok=True)
            save_atomic(path, saver(self.model, self.config))
        return True


def make_envs(config: TrainConfig):
    def one() -> gym.Env:
        env = gym.make(config.env, split="public", reward="relative")
        if config.frame_stack > 1:
            env = FrameStackObservation(env, config.frame_stack)
        return env
    return make_vec_env(one, n_envs=config.n_envs, seed=config.seed, vec_env_cls=DummyVecEnv)


def new_model(config: TrainConfig, envs, tensorboard_log: str | None = None):
    """A fresh model of `config.algo` given its own hyperparameters and only those: SB3's
    defaults for the rest (DQN's `gradient_steps=1`, A2C's RMSprop, ...)."""
    own = config.hyperparameters
    policy = {name: own.pop(name) for name in POLICY_HYPERPARAMETERS if name in own}
    algorithm = ALGOS[config.algo]
    if algorithm.recurrent:
        fast_updates()  # the LSTM over each sequence at once: train/recurrent.py
    return algorithm.cls()(algorithm.policy, envs, gamma=config.gamma, seed=config.seed,
                           device="cpu", tensorboard_log=tensorboard_log,
                           policy_kwargs={"net_arch": list(config.net_arch), **policy}, **own)


def checkpoint_steps(path: Path) -> int | None:
    """The steps in a checkpoint's name, `<algo>_<steps>_steps.zip` (runs from before `--algo`
    wrote `ppo_` whatever the algorithm), or None for another file."""
    match = re.fullmatch(r"\w+?_(\d+)_steps", path.stem)
    return int(match[1]) if match else None


def _whole(path: Path) -> bool:
    """Whether a saved model is whole: a zip whose directory names the first entry SB3 writes
    (`data`) and the last (`_stable_baselines3_version`). `zipfile.is_zipfile` alone is fooled
    by a file cut short inside a `.pth` entry, itself a zip whose directory it then finds."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return {"data", "_stable_baselines3_version"} <= names


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most steps; one cut short by a killed process does not count."""
    candidates = [p for p in (out / "checkpoints").glob("*_steps.zip")
                  if checkpoint_steps(p) is not None and _whole(p)]
    return max(candidates, key=checkpoint_steps) if candidates else None


def starting_checkpoint(out: Path, resume: bool) -> Path | None:
    """The checkpoint a resumed run continues from; None for a new run, which needs a folder of
    its own: in one holding another run, that run's best model would be graded as this one's,
    its validation history appended to and its checkpoints resumed from."""
    if resume:
        checkpoint = latest_checkpoint(out)
        if checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {out / 'checkpoints'}")
        return checkpoint
    if out.exists() and (not out.is_dir() or any(p.name != ".lock" for p in out.iterdir())):
        raise ValueError(f"{out} is not an empty folder: pass --resume to continue the run in "
                         "it, or pick an empty folder")
    return None


def last_validated(out: Path) -> int | None:
    """The step of the last validation recorded in `out`."""
    path = out / "validation.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["timesteps"] if lines else None


def seed_everything(config: TrainConfig) -> None:
    """What makes a run reproduce itself: a fixed number of torch threads and torch's
    deterministic kernels (SB3 seeds the generators from `config.seed`)."""
    torch.set_num_threads(config.torch_threads)
    torch.use_deterministic_algorithms(True)


def train(config: TrainConfig, resume: bool = False, grading_workers: int = 2, label: str = "",
          report=None, grade: bool = True) -> dict:
    """Train, validate, keep the best model, grade it (not with `grade` False: the algorithm
    search's runs are judged on validation alone). `label` prefixes the progress lines (the
    sweep's "seed 3: ", whose runs print no headline tables); `report(metrics, model)`, if
    given, is called after every validation (the Ray backend reports to Tune through it)."""
    out = Path(config.out)
    checkpoint = starting_checkpoint(out, resume)
    prepare(out)
    seed_everything(config)
    started = time.perf_counter()
    envs = make_envs(config)
    name = ALGOS[config.algo].name
    resumed_from = None
    if checkpoint is not None:
        # Unpickles: trusted, a checkpoint this run's own training wrote into its folder (a
        # resume), never a file a submitter hands the grader.
        model = ALGOS[config.algo].cls().load(checkpoint, env=envs, device="cpu",
                                       tensorboard_log=str(out / "tb"))
        resumed_from = model.num_timesteps
        # `load` reseeds everything from `config.seed`: a resumed run would replay the task
        # stream of its first steps
        model.set_random_seed(config.seed + model.num_timesteps)
        print(f"{label}resuming {checkpoint} at {model.num_timesteps} steps", flush=True)
    else:
        model = new_model(config, envs, tensorboard_log=str(out / "tb"))
    (out / "config.json").write_text(config.to_json())
    machines = record_machine(out, model.num_timesteps)
    callbacks = CallbackList([
        Checkpoints(max(config.checkpoint_every // config.n_envs, 1), out / "checkpoints",
                    config),
        ValidationCallback(config, out, label, report)])
    remaining = config.timesteps - model.num_timesteps
    learned = remaining > 0 or last_validated(out) != model.num_timesteps
    if learned:
        # with nothing left to train (a run killed after its last checkpoint), a learn of no
        # steps still runs the final validation the killed run may have missed
        model.learn(total_timesteps=max(remaining, 0), callback=callbacks, tb_log_name=name,
                    reset_num_timesteps=checkpoint is None, progress_bar=False)
    save_atomic(out / "checkpoints" / f"{config.algo}_{model.num_timesteps}_steps.zip",
                saver(model, config))
    train_seconds = time.perf_counter() - started
    learning_curve(out, name)
    if grade:
        final_grading(config, fresh=learned, workers=grading_workers, echo=not label)
    result = {"timesteps": model.num_timesteps, "train_seconds": round(train_seconds, 1),
              "total_seconds": round(time.perf_counter() - started, 1),
              "resumed_from": resumed_from,
              "best": json.loads((out / "best.json").read_text()),
              "machines": machines}
    write_atomic(out / "result.json", json.dumps(result, indent=2) + "\n")
    return result


def record_machine(out: Path, timesteps: int) -> list[dict]:
    """Add this process's machine (`eval/sweeps/provenance.py`) to the run's `machines.jsonl`, with
    the step it started training from; every record so far. A resumed run keeps the records of
    the processes before it: a run trained on two machines says so, and from which step."""
    path = out / "machines.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    records.append({"from_timesteps": timesteps, **machine()})
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return records


def final_grading(config: TrainConfig, fresh: bool, workers: int = 2,
                  echo: bool = True) -> None:
    """The headline grading of the best model next to the scripted policies, on both splits.

    The grader resumes a folder by policy spec, and `model_spec` names the model's file, not
    its content: after a resume that trained further (`fresh`), the rows of the previous best
    model would be kept as the new one's, so the grading starts over. Otherwise it resumes (a
    run killed while grading)."""
    out = Path(config.out)
    for split in ("public", "regenerated"):
        folder = out / f"eval_{split}"
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        headline.run(folder, workers=workers, progress=False, echo=echo, split=split,
                     seeds=config.final_seeds,
                     probe=config.probe, policies=HEADLINE + (model_spec(config),))


def model_spec(config: TrainConfig) -> str:
    """The spec the best model is graded under: `ppo:PATH` for PPO and MaskablePPO, as it always
    was (a run from before `--algo` resumes its grading under it), `sb3:PATH` for the others,
    which `ppo:` refuses."""
    kind = "ppo" if ALGOS[config.algo].name in PPO_ALGORITHMS else "sb3"
    return f"{kind}:{Path(config.out) / 'best_model.zip'}"


def learning_curve(out: Path, algorithm_name: str) -> None:
    """Validation mean gap and exact rate against training steps."""
    history = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    steps = [h["timesteps"] for h in history]
    fig, ax = subplots(figsize=(7, 4.2))
    ax.plot(steps, [h["mean_gap"] for h in history], marker="o", color="C0")
    ax.set_xlabel("training steps")
    ax.set_ylabel("validation mean gap ($)", color="C0")
    twin = ax.twinx()
    twin.plot(steps, [h["exact_rate"] for h in history], marker=".", color="C1")
    twin.set_ylabel("validation exact rate", color="C1")
    twin.set_ylim(0, 1)
    ax.set_title(f"{algorithm_name} learning curve ({out.name})")
    save_figure(fig, out / "learning_curve.png")
