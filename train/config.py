"""A training run's whole recipe, `TrainConfig`, saved with the run as `config.json`.

It is the one source of the recipe: each field's default, and for an option of `python -m
train` its help beside it (`train/__main__.py` builds the options from the fields), and for an
algorithm's own hyperparameter each algorithm's default (`HYPERPARAMETERS` is read from them).
The algorithms trained are those `agents/learned/algorithms.py` marks `trained`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import finality_gym
from agents.learned.algorithms import ALGORITHMS
from agents.learned.sb3_archive import MAX_STACK

_TRAINED = [algorithm for algorithm in ALGORITHMS.values() if algorithm.trained]
# PPO, the default, and the two that share its recipe.
PPO_FAMILY = tuple(algorithm.algo for algorithm in _TRAINED if algorithm.name.endswith("PPO"))
# The algorithms `python -m train` trains, by their `--algo` name, in the order `--algo` lists
# them: the PPO family first.
ALGOS = {algorithm.algo: algorithm
         for algorithm in sorted(_TRAINED, key=lambda a: a.algo not in PPO_FAMILY)}


def option_field(default, help: str, **more) -> dataclasses.Field:
    """A field that is an option of the command line, `--<name>`, and what --help says of it
    (with its default, unless a flag or a choice, whose help says it); `choices` in `more`."""
    return field(default=default, metadata={"help": help, **more})


def hyperparameter(help: str | None, **defaults) -> dataclasses.Field:
    """One of the algorithms' own hyperparameters, by SB3's name: None until the configuration
    fills in its algorithm's default (`defaults`, by `--algo` name); an algorithm with no default
    refuses it (it would be silently ignored). With `help`, an option of the command line."""
    return field(default=None, metadata={"defaults": defaults, **({"help": help} if help else {})})


def ppo_family(value) -> dict:
    """The same default for each algorithm of the PPO family."""
    return dict.fromkeys(PPO_FAMILY, value)


@dataclass(frozen=True)
class TrainConfig:
    """A run's whole recipe. `algo` None (a configuration saved before there was `algo`) is the
    algorithm `masked` named then: MaskablePPO if set, PPO otherwise; `masked` is kept as the
    short name of `algo="maskable_ppo"` and always agrees with it once built. The fields without
    help (`seed` and `out`, which each command takes its own way, and `gamma`, `net_arch`,
    `gae_lambda` and `clip_range`) are not options of the command line."""

    env: str = option_field("Finality-v0", "env id")
    timesteps: int = option_field(1_500_000, "training steps")  # each command says its own
    seed: int = 0
    n_envs: int = option_field(8, "training envs stepped together")
    frame_stack: int = option_field(1, "the policy sees the last N observations, stacked by "
                                       "Gymnasium's FrameStackObservation (1: the newest alone)")
    masked: bool = option_field(False, "MaskablePPO with the env's masks: --algo maskable_ppo "
                                       "for short")
    algo: str | None = option_field(None, "the algorithm (default ppo; maskable_ppo with "
                                          "--masked)", choices=tuple(ALGOS))
    out: str = "runs/ppo"
    gamma: float = 1.0
    net_arch: tuple[int, ...] = (128, 128)
    # Each algorithm's own hyperparameters, with their defaults here:
    # - The PPO family's are this project's tuned recipe; RecurrentPPO adds a 64-unit LSTM (SB3's
    #   256 made it 3 times slower again, for episodes of a few steps whose observation already
    #   sums up what was seen).
    # - A2C's are SB3's (RMSprop, 5-step rollouts) but the entropy bonus, the PPO recipe's.
    # - DQN's are sized for this env, whose episodes are a few steps long with one reward at
    #   their end: a 100k-transition buffer (thousands of episodes, not SB3's million), learning
    #   from 1,000 transitions on, one gradient step of 128 every 4 steps of the `n_envs` envs
    #   (SB3's `train_freq`: 32 transitions with 8 envs; a gradient step at every step ran 2.5
    #   times slower), the target network synced every 2,000 transitions, epsilon decayed from 1
    #   to 0.05 over the first 10 % of training.
    learning_rate: float | None = hyperparameter("the optimizer's step size",
                                                 **ppo_family(3e-4), a2c=7e-4, dqn=1e-4)
    n_steps: int | None = hyperparameter("rollout steps per env", **ppo_family(256), a2c=5)
    batch_size: int | None = hyperparameter("minibatch size", **ppo_family(512), dqn=128)
    n_epochs: int | None = hyperparameter("passes over each rollout", **ppo_family(10))
    gae_lambda: float | None = hyperparameter(None, **ppo_family(0.95), a2c=1.0)
    clip_range: float | None = hyperparameter(None, **ppo_family(0.2))
    ent_coef: float | None = hyperparameter("entropy bonus", **ppo_family(0.01), a2c=0.01)
    lstm_hidden_size: int | None = hyperparameter("units of the LSTM", recurrent_ppo=64)
    buffer_size: int | None = hyperparameter("replay buffer, in transitions", dqn=100_000)
    learning_starts: int | None = hyperparameter(
        "transitions collected before the first update", dqn=1_000)
    train_freq: int | None = hyperparameter("steps of the envs from one update to the next",
                                            dqn=4)
    target_update_interval: int | None = hyperparameter(
        "transitions from one target network sync to the next", dqn=2_000)
    exploration_fraction: float | None = hyperparameter(
        "share of the training steps over which epsilon decays", dqn=0.1)
    exploration_final_eps: float | None = hyperparameter("epsilon once decayed", dqn=0.05)
    # validation, checkpoints, final grading
    eval_every: int = option_field(50_000, "validate every N training steps")
    validation_stride: int = option_field(2, "validate on every N-th independent unit of public")
    checkpoint_every: int = option_field(100_000, "checkpoint every N training steps")
    final_seeds: int = option_field(5, "grading seeds of the final headline grading")
    # One torch thread: as fast as torch's default here (benchmarks/ppo_speed.py), and the run
    # reproduces itself bit for bit (more threads may split float sums differently from run to
    # run); the sweep runs one such process per core.
    torch_threads: int = option_field(1, "torch threads per training process; 1 reproduces a "
                                         "run bit for bit, and is as fast here")

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
                     "torch_threads", "frame_stack"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.frame_stack > MAX_STACK:
            raise ValueError(f"frame_stack must be <= {MAX_STACK}, got {self.frame_stack}")
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


# Each algorithm's own hyperparameters with their defaults, as TrainConfig's fields give them, in
# the fields' order; TUNED names them all.
HYPERPARAMETERS = {algo: {f.name: f.metadata["defaults"][algo]
                          for f in dataclasses.fields(TrainConfig)
                          if algo in f.metadata.get("defaults", {})}
                   for algo in ALGOS}
TUNED = tuple(f.name for f in dataclasses.fields(TrainConfig) if "defaults" in f.metadata)
POLICY_HYPERPARAMETERS = ("lstm_hidden_size",)  # SB3 takes these through `policy_kwargs`
# The options of the command line: the fields with help.
OPTIONS = tuple(f for f in dataclasses.fields(TrainConfig) if "help" in f.metadata)
