"""Training on `Finality-v0` with stable-baselines3: PPO by default, or any algorithm of `ALGOS`
(`--algo`: sb3-contrib's MaskablePPO, `--masked` for short, and RecurrentPPO; SB3's A2C and DQN).

Read it top to bottom: the configuration (one source of defaults, saved with the run, each
algorithm's hyperparameters in `HYPERPARAMETERS`), the vectorized training envs, the validation
callback that grades the policy with the shared grader on public-split tasks and logs our
scalars to TensorBoard next to SB3's, checkpoints, the best model by validation mean gap,
resuming, the learning curve, and at the end the same headline grading as every scripted policy,
on both splits.

A run folder holds: `config.json`, `tb/` (TensorBoard: `tensorboard --logdir runs`),
`checkpoints/` (`<algo>_<steps>_steps.zip`; the last one is the final model), `best_model.zip`
(+ `best.json`), `validation.jsonl`, `machines.jsonl` (the machine of every process that
trained it), `learning_curve.png`, and `eval_public/`, `eval_regenerated/` (headline folders).
A new run needs a new or empty folder; a resumed one continues in the folder it is given,
and regrades from scratch if it trained further.

Choices where the issue is silent: training draws tasks from `public` with fresh fault seeds;
validation uses every `validation_stride`-th independent unit of public under fault seed 100
(the grading seeds are 0..4); `gamma = 1` (the reward is the terminal economic gap, and time
already costs money in the world); the training reward is the gap relative to the order value
(`RelativeGap`); validation and the final grading run the model as it is trained, a
stochastic policy (sampled with a per-episode seed, see `agents/learned.py`; a DQN model
greedily, the policy a Q-learner learns, and a RecurrentPPO model with its LSTM state carried
through each episode); the final grading compares it with the nine scripted policies in the
env's probe arm.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

import finality_gym
from agents.learned import sb3_policy
from eval import headline
from eval.grader import RunConfig, grade_in_process
from eval.headline import HEADLINE
from eval.provenance import machine
from eval.report import pyplot
from eval.runfolder import prepare, save_atomic, write_atomic

VALIDATION_SEED = 100


@dataclass(frozen=True)
class Algo:
    """An `--algo`: the SB3 class that trains it and the policy it trains."""

    package: str
    name: str
    policy: str = "MlpPolicy"


ALGOS = {
    "ppo": Algo("stable_baselines3", "PPO"),
    "maskable_ppo": Algo("sb3_contrib", "MaskablePPO"),
    "recurrent_ppo": Algo("sb3_contrib", "RecurrentPPO", "MlpLstmPolicy"),
    "a2c": Algo("stable_baselines3", "A2C"),
    "dqn": Algo("stable_baselines3", "DQN"),
}

# Each algorithm's own hyperparameters (SB3's argument names) with their defaults here. A
# hyperparameter an algorithm does not take stays None in its configuration, and setting one is
# an error: it would be silently ignored.
# - The PPO family's are this project's tuned recipe; RecurrentPPO adds a 64-unit LSTM (SB3's
#   256 made it 3 times slower again, for episodes of a few steps whose observation already sums
#   up what was seen).
# - A2C's are SB3's (RMSprop, 5-step rollouts) but the entropy bonus, the PPO recipe's.
# - DQN's are sized for this env, whose episodes are a few steps long with one reward at their
#   end: a 100k-transition buffer (thousands of episodes, not SB3's million), learning from
#   1,000 transitions on, one gradient step of 128 every 4 steps of the `n_envs` envs (SB3's
#   `train_freq`: 32 transitions with 8 envs; a gradient step at every step ran 2.5 times
#   slower), the target network synced every 2,000 transitions, epsilon decayed from 1 to 0.05
#   over the first 10 % of training.
_PPO_FAMILY = {"learning_rate": 3e-4, "n_steps": 256, "batch_size": 512, "n_epochs": 10,
               "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.01}
HYPERPARAMETERS = {
    "ppo": _PPO_FAMILY, "maskable_ppo": _PPO_FAMILY,
    "recurrent_ppo": {**_PPO_FAMILY, "lstm_hidden_size": 64},
    "a2c": {"learning_rate": 7e-4, "n_steps": 5, "gae_lambda": 1.0, "ent_coef": 0.01},
    "dqn": {"learning_rate": 1e-4, "batch_size": 128, "buffer_size": 100_000,
            "learning_starts": 1_000, "train_freq": 4, "target_update_interval": 2_000,
            "exploration_fraction": 0.1, "exploration_final_eps": 0.05},
}
TUNED = tuple(dict.fromkeys(name for own in HYPERPARAMETERS.values() for name in own))
POLICY_HYPERPARAMETERS = ("lstm_hidden_size",)  # SB3 takes these through `policy_kwargs`


@dataclass(frozen=True)
class TrainConfig:
    """A run's whole recipe. `algo` None (a configuration saved before there was `algo`) is the
    algorithm `masked` named then: MaskablePPO if set, PPO otherwise; `masked` is kept as the
    short name of `algo="maskable_ppo"` and always agrees with it once built."""

    env: str = "Finality-v0"
    timesteps: int = 1_500_000
    seed: int = 0
    n_envs: int = 8
    masked: bool = False
    algo: str | None = None
    out: str = "runs/ppo"
    gamma: float = 1.0
    net_arch: tuple[int, ...] = (128, 128)
    # the hyperparameters of HYPERPARAMETERS: None takes the algorithm's default
    learning_rate: float | None = None
    n_steps: int | None = None
    batch_size: int | None = None
    n_epochs: int | None = None
    gae_lambda: float | None = None
    clip_range: float | None = None
    ent_coef: float | None = None
    lstm_hidden_size: int | None = None
    buffer_size: int | None = None
    learning_starts: int | None = None
    train_freq: int | None = None
    target_update_interval: int | None = None
    exploration_fraction: float | None = None
    exploration_final_eps: float | None = None
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
        if self.algo is None:
            object.__setattr__(self, "algo", "maskable_ppo" if self.masked else "ppo")
        if self.algo not in ALGOS:
            raise ValueError(f"algo: unknown algorithm {self.algo!r}; valid: {', '.join(ALGOS)}")
        if self.masked and self.algo != "maskable_ppo":
            raise ValueError(f"masked is algo maskable_ppo; it conflicts with algo {self.algo}")
        object.__setattr__(self, "masked", self.algo == "maskable_ppo")
        own = HYPERPARAMETERS[self.algo]
        for name in TUNED:
            if name in own and getattr(self, name) is None:
                object.__setattr__(self, name, own[name])
            elif name not in own and getattr(self, name) is not None:
                raise ValueError(f"{name}: {self.algo} does not take it (it takes "
                                 f"{', '.join(own)})")
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs",
                     "lstm_hidden_size", "buffer_size", "train_freq", "target_update_interval",
                     "eval_every", "validation_stride", "checkpoint_every", "final_seeds",
                     "torch_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in 0..2**32-1, got {self.seed}")
        # SB3 and torch refuse these only once the run folder is written, some with a traceback
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate}")
        if self.ent_coef is not None and not 0 <= self.ent_coef < math.inf:
            raise ValueError(f"ent_coef must be a finite number >= 0, got {self.ent_coef}")
        if self.batch_size is not None and self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {self.batch_size}")
        if self.n_steps is not None and self.n_steps * self.n_envs < 2:
            raise ValueError(f"n_steps * n_envs must be >= 2, got {self.n_steps} * {self.n_envs}")
        if self.learning_starts is not None and self.learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {self.learning_starts}")
        if self.exploration_fraction is not None and not 0 < self.exploration_fraction <= 1:
            raise ValueError(f"exploration_fraction must lie in (0, 1], got "
                             f"{self.exploration_fraction}")
        if self.exploration_final_eps is not None and not 0 <= self.exploration_final_eps <= 1:
            raise ValueError(f"exploration_final_eps must lie in [0, 1], got "
                             f"{self.exploration_final_eps}")

    @property
    def probe(self) -> str:
        return finality_gym.ENV_IDS[self.env]

    @property
    def hyperparameters(self) -> dict:
        """The algorithm's own hyperparameters, by SB3's names."""
        return {name: getattr(self, name) for name in HYPERPARAMETERS[self.algo]}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """A configuration from its JSON fields; those it lacks (one saved before they existed)
        take their defaults, `algo` the one `masked` named."""
        return cls(**{**data, "net_arch": tuple(data.get("net_arch", cls.net_arch))})

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(json.loads(text))


# The name from before `--algo`: other code imports it.
PPOConfig = TrainConfig


def validation_config(config: TrainConfig) -> RunConfig:
    """Every `validation_stride`-th independent unit of `public` (a twin pair with both its
    halves: striding over tasks would keep only one half of every pair)."""
    units = finality_gym.load_corpus("public").units[::config.validation_stride]
    return RunConfig(("validation",), split="public", seeds=(VALIDATION_SEED,),
                     probe=config.probe, tasks=tuple(t.task_id for u in units for t in u))


def validate(policy, config: TrainConfig) -> dict:
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

    def __init__(self, config: TrainConfig, out: Path, label: str = "", report=None):
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


def make_envs(config: TrainConfig):
    return make_vec_env(lambda: RelativeGap(gym.make(config.env, split="public")),
                        n_envs=config.n_envs, seed=config.seed, vec_env_cls=DummyVecEnv)


def algorithm(config: TrainConfig):
    """The SB3 class of `config.algo` (sb3-contrib's imported only when asked for)."""
    algo = ALGOS[config.algo]
    return getattr(importlib.import_module(algo.package), algo.name)


def new_model(config: TrainConfig, envs, tensorboard_log: str | None = None):
    """A fresh model of `config.algo` given its own hyperparameters and only those: SB3's
    defaults for the rest (DQN's `gradient_steps=1`, A2C's RMSprop, ...)."""
    own = config.hyperparameters
    policy = {name: own.pop(name) for name in POLICY_HYPERPARAMETERS if name in own}
    return algorithm(config)(ALGOS[config.algo].policy, envs, gamma=config.gamma,
                             seed=config.seed, device="cpu",
                             policy_kwargs={"net_arch": list(config.net_arch), **policy},
                             tensorboard_log=tensorboard_log, **own)


def checkpoint_steps(path: Path) -> int | None:
    """The steps in a checkpoint's name, `<algo>_<steps>_steps.zip` (runs from before `--algo`
    wrote `ppo_` whatever the algorithm), or None for another file."""
    match = re.fullmatch(r"\w+?_(\d+)_steps", path.stem)
    return int(match[1]) if match else None


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most steps; one cut short by a killed process (not a whole zip)
    does not count."""
    candidates = [p for p in (out / "checkpoints").glob("*_steps.zip")
                  if checkpoint_steps(p) is not None and zipfile.is_zipfile(p)]
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
        model = algorithm(config).load(checkpoint, env=envs, device="cpu",
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
        CheckpointCallback(max(config.checkpoint_every // config.n_envs, 1),
                           str(out / "checkpoints"), name_prefix=config.algo),
        ValidationCallback(config, out, label, report)])
    remaining = config.timesteps - model.num_timesteps
    learned = remaining > 0 or last_validated(out) != model.num_timesteps
    if learned:
        # with nothing left to train (a run killed after its last checkpoint), a learn of no
        # steps still runs the final validation the killed run may have missed
        model.learn(total_timesteps=max(remaining, 0), callback=callbacks, tb_log_name=name,
                    reset_num_timesteps=checkpoint is None, progress_bar=False)
    save_atomic(out / "checkpoints" / f"{config.algo}_{model.num_timesteps}_steps.zip", model.save)
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
    """Add this process's machine (`eval/provenance.py`) to the run's `machines.jsonl`, with
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
    kind = "ppo" if config.algo in ("ppo", "maskable_ppo") else "sb3"
    return f"{kind}:{Path(config.out) / 'best_model.zip'}"


def learning_curve(out: Path, algorithm_name: str) -> None:
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
    ax.set_title(f"{algorithm_name} learning curve ({out.name})")
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=110)
    plt.close(fig)
