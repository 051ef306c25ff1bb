"""PPO on `Finality-v0` (stable-baselines3; sb3-contrib's MaskablePPO with `--masked`).

Read it top to bottom: the configuration (one source of defaults, saved with the run), the
vectorized training envs, the validation callback that grades the policy with the shared grader
on public-split tasks and logs our scalars to TensorBoard next to SB3's, checkpoints, the best
model by validation mean gap, resuming, the learning curve, and at the end the same headline
grading as every scripted policy, on both splits.

A run folder holds: `config.json`, `tb/` (TensorBoard: `tensorboard --logdir runs`),
`checkpoints/` (the last one is the final model), `best_model.zip` (+ `best.json`),
`validation.jsonl`,
`learning_curve.png`, and `eval_public/`, `eval_regenerated/` (headline folders).
A new run needs a new or empty folder; a resumed one continues in the folder it is given,
and regrades from scratch if it trained further.

Choices where the issue is silent: training draws tasks from `public` with fresh fault seeds;
validation uses every `validation_stride`-th independent unit of public under fault seed 100
(the grading seeds are 0..4); `gamma = 1` (the reward is the terminal economic gap, and time
already costs money in the world); the training reward is the gap relative to the order value
(`RelativeGap`); validation and the final grading run the model as it is trained, a stochastic policy (sampled
with a per-episode seed, see `agents/learned.py`); the final grading compares it with the nine
scripted policies in the env's probe arm.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

import finality_gym
from agents.learned import sb3_policy
from eval import headline
from eval.grader import RunConfig, grade_in_process
from eval.headline import HEADLINE
from eval.report import pyplot
from eval.runfolder import prepare, save_atomic, write_atomic

VALIDATION_SEED = 100


@dataclass(frozen=True)
class PPOConfig:
    env: str = "Finality-v0"
    timesteps: int = 1_500_000
    seed: int = 0
    n_envs: int = 8
    masked: bool = False
    out: str = "runs/ppo"
    # PPO
    learning_rate: float = 3e-4
    n_steps: int = 256
    batch_size: int = 512
    n_epochs: int = 10
    gamma: float = 1.0
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    net_arch: tuple[int, ...] = (128, 128)
    # validation, checkpoints, final grading
    eval_every: int = 50_000
    validation_stride: int = 2
    checkpoint_every: int = 100_000
    final_seeds: int = 5
    # One torch thread: as fast as torch's default here (benchmarks/ppo_speed.py), and the run
    # reproduces itself bit for bit (more threads may split float sums differently from run to
    # run); the sweep runs one such process per core.
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.env not in finality_gym.ENV_IDS:
            raise ValueError(f"env: unknown id {self.env!r}; valid: "
                             f"{', '.join(finality_gym.ENV_IDS)}")
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "eval_every",
                     "validation_stride", "checkpoint_every", "final_seeds", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in 0..2**32-1, got {self.seed}")
        # SB3 and torch refuse these only once the run folder is written, some with a traceback
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate}")
        if not 0 <= self.ent_coef < math.inf:
            raise ValueError(f"ent_coef must be a finite number >= 0, got {self.ent_coef}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {self.batch_size}")
        if self.n_steps * self.n_envs < 2:
            raise ValueError(f"n_steps * n_envs must be >= 2, got {self.n_steps} * {self.n_envs}")

    @property
    def probe(self) -> str:
        return finality_gym.ENV_IDS[self.env]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PPOConfig:
        data = json.loads(text)
        data["net_arch"] = tuple(data["net_arch"])
        return cls(**data)


def validation_config(config: PPOConfig) -> RunConfig:
    """Every `validation_stride`-th independent unit of `public` (a twin pair with both its
    halves: striding over tasks would keep only one half of every pair)."""
    units = finality_gym.load_corpus("public").units[::config.validation_stride]
    return RunConfig(("validation",), split="public", seeds=(VALIDATION_SEED,),
                     probe=config.probe, tasks=tuple(t.task_id for u in units for t in u))


def validate(policy, config: PPOConfig) -> dict:
    """Grade a policy on the validation set with the shared grader; money in dollars."""
    rows = grade_in_process(policy, "validation", validation_config(config))
    gaps = np.array([r["gap"] for r in rows]) / 100
    return {"mean_gap": float(gaps.mean()),
            "exact_rate": float(np.mean([r["gap"] == 0 for r in rows])),
            "premature_rate": float(np.mean([r["premature"] for r in rows])),
            "episodes": len(rows)}


def progress_line(metrics: dict) -> str:
    """A validation's progress line (the sweep prefixes it with "seed k: ")."""
    return (f"{metrics['timesteps']:>10,} steps  {metrics['steps_per_second']:6,.0f} steps/s  "
            f"validation gap ${metrics['validation_mean_gap']:.2f}  best "
            f"${metrics['best_mean_gap']:.2f} at {metrics['best_timesteps']:,}")


class ValidationCallback(BaseCallback):
    """Every `eval_every` steps: grade, log our scalars, keep the best model, note the history.

    A resumed run counts from the last validation recorded in `out`, not from its checkpoint:
    counting from scratch, it would validate again at its first step."""

    def __init__(self, config: PPOConfig, out: Path, label: str = "", report=None):
        super().__init__()
        self.config = config
        self.out = out
        self.label = label
        self.report = report
        best = out / "best.json"
        self.best = json.loads(best.read_text()) if best.exists() else {"mean_gap": float("inf")}
        last = last_validated(out)
        self.last = -config.eval_every if last is None else last
        self.clock = (0, time.perf_counter())

    def _on_training_start(self) -> None:
        self.clock = (self.num_timesteps, time.perf_counter())

    def _on_step(self) -> bool:
        if self.num_timesteps - self.last >= self.config.eval_every:
            self.evaluate()
        return True

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.last:
            self.evaluate()

    def evaluate(self) -> None:
        self.last = self.num_timesteps
        result = validate(sb3_policy(self.model, "validation"), self.config)
        for key in ("mean_gap", "exact_rate", "premature_rate"):
            self.logger.record(f"validation/{key}", result[key])
        self.logger.dump(self.num_timesteps)
        with open(self.out / "validation.jsonl", "a") as f:
            f.write(json.dumps({"timesteps": self.num_timesteps, **result}) + "\n")
        if result["mean_gap"] < self.best["mean_gap"]:
            self.best = {"timesteps": self.num_timesteps, **result}
            save_atomic(self.out / "best_model.zip", self.model.save)
            write_atomic(self.out / "best.json", json.dumps(self.best, indent=2) + "\n")
        steps, started = self.clock
        now = time.perf_counter()
        rate = (self.num_timesteps - steps) / max(now - started, 1e-9)
        self.clock = (self.num_timesteps, now)
        metrics = {"timesteps": self.num_timesteps, "steps_per_second": round(rate, 1),
                   **{f"validation_{k}": v for k, v in result.items()},
                   "best_mean_gap": self.best["mean_gap"],
                   "best_timesteps": self.best["timesteps"]}
        print(self.label + progress_line(metrics), flush=True)
        if self.report is not None:
            self.report(metrics, self.model)


class RelativeGap(gym.Wrapper):
    """Training reward: minus the gap as a fraction of the order value.

    The order value is observed and fixed within an episode, so dividing by it leaves the optimal
    policy unchanged (for every order value the best action is the same), but it keeps the rare
    $3,499 orders from drowning the value function in variance: with the env's dollar reward the
    value function explained almost none of the return. Grading still uses the dollar gap.
    """

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if "record" in info:
            reward = -info["record"].gap / info["record"].order_value
        return obs, reward, terminated, truncated, info


def make_envs(config: PPOConfig):
    return make_vec_env(lambda: RelativeGap(gym.make(config.env, split="public")),
                        n_envs=config.n_envs, seed=config.seed, vec_env_cls=DummyVecEnv)


def algorithm(config: PPOConfig):
    if config.masked:
        from sb3_contrib import MaskablePPO
        return MaskablePPO
    return PPO


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most steps (`checkpoints/ppo_<steps>_steps.zip`); one cut short
    by a killed process (not a whole zip) does not count."""
    candidates = [p for p in (out / "checkpoints").glob("ppo_*_steps.zip")
                  if zipfile.is_zipfile(p)]
    return max(candidates, key=lambda p: int(p.stem.split("_")[1])) if candidates else None


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


def seed_everything(config: PPOConfig) -> None:
    """What makes a run reproduce itself: a fixed number of torch threads and torch's
    deterministic kernels (SB3 seeds the generators from `config.seed`)."""
    torch.set_num_threads(config.torch_threads)
    torch.use_deterministic_algorithms(True)


def train(config: PPOConfig, resume: bool = False, grading_workers: int = 2, label: str = "",
          report=None) -> dict:
    """Train, validate, keep the best model, grade it. `label` prefixes the progress lines (the
    sweep's "seed 3: ", whose runs print no headline tables); `report(metrics, model)`, if
    given, is called after every validation (the Ray backend reports to Tune through it)."""
    out = Path(config.out)
    checkpoint = starting_checkpoint(out, resume)
    prepare(out)
    seed_everything(config)
    started = time.perf_counter()
    envs = make_envs(config)
    cls = algorithm(config)
    resumed_from = None
    if checkpoint is not None:
        model = cls.load(checkpoint, env=envs, device="cpu", tensorboard_log=str(out / "tb"))
        resumed_from = model.num_timesteps
        # `load` reseeds everything from `config.seed`: a resumed run would replay the task
        # stream of its first steps
        model.set_random_seed(config.seed + model.num_timesteps)
        print(f"{label}resuming {checkpoint} at {model.num_timesteps} steps", flush=True)
    else:
        model = cls("MlpPolicy", envs, learning_rate=config.learning_rate, n_steps=config.n_steps,
                    batch_size=config.batch_size, n_epochs=config.n_epochs, gamma=config.gamma,
                    gae_lambda=config.gae_lambda, clip_range=config.clip_range,
                    ent_coef=config.ent_coef, seed=config.seed, device="cpu",
                    policy_kwargs={"net_arch": list(config.net_arch)},
                    tensorboard_log=str(out / "tb"))
    (out / "config.json").write_text(config.to_json())
    callbacks = CallbackList([
        CheckpointCallback(max(config.checkpoint_every // config.n_envs, 1),
                           str(out / "checkpoints"), name_prefix="ppo"),
        ValidationCallback(config, out, label, report)])
    remaining = config.timesteps - model.num_timesteps
    learned = remaining > 0 or last_validated(out) != model.num_timesteps
    if learned:
        # with nothing left to train (a run killed after its last checkpoint), a learn of no
        # steps still runs the final validation the killed run may have missed
        model.learn(total_timesteps=max(remaining, 0), callback=callbacks, tb_log_name="PPO",
                    reset_num_timesteps=checkpoint is None, progress_bar=False)
    save_atomic(out / "checkpoints" / f"ppo_{model.num_timesteps}_steps.zip", model.save)
    train_seconds = time.perf_counter() - started
    learning_curve(out)
    final_grading(config, fresh=learned, workers=grading_workers, echo=not label)
    result = {"timesteps": model.num_timesteps, "train_seconds": round(train_seconds, 1),
              "total_seconds": round(time.perf_counter() - started, 1),
              "resumed_from": resumed_from,
              "best": json.loads((out / "best.json").read_text())}
    write_atomic(out / "result.json", json.dumps(result, indent=2) + "\n")
    return result


def final_grading(config: PPOConfig, fresh: bool, workers: int = 2,
                  echo: bool = True) -> None:
    """The headline grading of the best model next to the scripted policies, on both splits.

    The grader resumes a folder by policy spec, and `ppo:PATH` names the model's file, not its
    content: after a resume that trained further (`fresh`), the rows of the previous best model
    would be kept as the new one's, so the grading starts over. Otherwise it resumes (a run
    killed while grading)."""
    out = Path(config.out)
    for split in ("public", "regenerated"):
        folder = out / f"eval_{split}"
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        headline.run(folder, workers=workers, progress=False, echo=echo, split=split,
                     seeds=config.final_seeds,
                     probe=config.probe, policies=HEADLINE + (f"ppo:{out / 'best_model.zip'}",))


def learning_curve(out: Path) -> None:
    """Validation mean gap and exact rate against training steps."""
    history = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    steps = [h["timesteps"] for h in history]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(steps, [h["mean_gap"] for h in history], marker="o", color="C0")
    ax.set_xlabel("training steps")
    ax.set_ylabel("validation mean gap ($)", color="C0")
    twin = ax.twinx()
    twin.plot(steps, [h["exact_rate"] for h in history], marker=".", color="C1")
    twin.set_ylabel("validation exact rate", color="C1")
    twin.set_ylim(0, 1)
    ax.set_title(f"PPO learning curve ({out.name})")
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=110)
    plt.close(fig)
