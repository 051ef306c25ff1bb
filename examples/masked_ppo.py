"""Masked PPO on Finality's native vector env, in one file, from the environment to a graded
ONNX policy: what a practitioner with their own trainer writes (CleanRL's `ppo.py`, with the
env's action masks).

    .venv/bin/python examples/masked_ppo.py --out runs/masked_ppo/seed_0 --seed 0

Read it top to bottom:

- the env: `gym.make_vec(env_id, num_envs)`, Finality's native vector env
  (`finality_gym/vector.py`), with the training reward (`reward="relative"`: minus the gap over
  the order value) and Gymnasium's same-step autoreset, so the observation after an episode's
  end is the next episode's first and `info["action_mask"]` is always the mask of the actions
  allowed next; an ended episode's gap is in `info["final_info"]["gap"]`;
- the agent: an actor and a critic, two 128x128 tanh MLPs (SB3's PPO layout), the actor's
  logits of masked actions set to -1e8 as MaskablePPO sets them;
- the loop: rollouts of `num_steps` steps of every env, GAE, clipped PPO updates;
- after the first update, then every `eval_every` steps and at the end, the graded validation
  (`finality_gym.validation.validate`, through `train.offline.validation`: the mean gap on the
  validation set, played as the grader plays every episode) logged to TensorBoard
  (`tensorboard --logdir runs`) as `validation/mean_gap`, and the best actor kept;
- at the end, the best actor exported to ONNX (`train.offline.export`: `obs`, `action_mask` ->
  `logits`, with the metadata `python -m train export` writes: what it was trained for), and
  graded with `onnx:` by the shared grader (`python -m eval headline`) beside the scripted
  policies on both splits (`eval_public/`, `eval_regenerated/`); the table prints each policy's
  mean gap.

The recipe is `python -m train ppo --masked`'s (`train/config.py`): 8 envs x 256 steps,
minibatches of 512, 10 epochs, learning rate 3e-4, gamma 1, GAE lambda 0.95, clip 0.2, entropy
0.01, 1.5M steps (the no-probe arm's shipped MaskablePPO trained 1M: `make example-study` runs
this file with `--env-id FinalityNoProbe-v0 --total-timesteps 1000000` against it). The folder
is a `python -m train` run folder as a sweep's seed is (`result.json`, `validation.jsonl`,
`eval_<split>/`), so `eval.sweeps.aggregate` reads five of them as a sweep (`make
example-study`, docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import nn
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter

import finality_gym
from finality_gym.validation import METRICS

# the repository's `train` (the masked ONNX export and the validation of a network, as the
# offline baselines use them), `agents` and `eval` (the grader): run from a clone, as the
# benchmarks are
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train.offline import export, validation  # noqa: E402

MASKED = -1e8  # a masked action's logit, as MaskablePPO's


@dataclass(frozen=True)
class Args:
    env_id: str = field(default="Finality-v0", metadata={"help": "a Finality env id"})
    seed: int = field(default=0, metadata={"help": "seed of torch, numpy and the envs"})
    total_timesteps: int = field(default=1_500_000, metadata={"help": "training steps"})
    num_envs: int = field(default=8, metadata={"help": "episodes stepped at once"})
    num_steps: int = field(default=256, metadata={"help": "rollout steps of each env"})
    learning_rate: float = field(default=3e-4, metadata={"help": "Adam's step size"})
    gamma: float = field(default=1.0, metadata={"help": "discount (1: the reward is the end's)"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE's lambda"})
    minibatch_size: int = field(default=512, metadata={"help": "steps a gradient step"})
    update_epochs: int = field(default=10, metadata={"help": "passes over each rollout"})
    clip_coef: float = field(default=0.2, metadata={"help": "PPO's clip range"})
    ent_coef: float = field(default=0.01, metadata={"help": "entropy bonus"})
    vf_coef: float = field(default=0.5, metadata={"help": "value loss weight"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "gradient norm clip"})
    eval_every: int = field(default=50_000, metadata={"help": "validate every N steps"})
    grade_seeds: int = field(default=5, metadata={"help": "episode seeds of the final grading"})
    against: str = field(default="finality_gate", metadata={
        "help": "policies graded beside the model, comma-separated (all: the nine)"})
    workers: int = field(default=2, metadata={"help": "worker processes of the final grading"})
    out: str = field(default="runs/masked_ppo", metadata={"help": "run folder (new or empty)"})


def parse_args() -> Args:
    """The arguments, every one checked before anything is written or trained."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                            default=f.default, help=f"{f.metadata['help']} (default {f.default})")
    args = Args(**vars(parser.parse_args()))
    if args.env_id not in finality_gym.ENV_IDS:
        parser.error(f"--env-id: unknown id {args.env_id!r}; valid: "
                     f"{', '.join(finality_gym.ENV_IDS)}")
    for name in ("total_timesteps", "num_envs", "num_steps", "minibatch_size", "update_epochs",
                 "eval_every", "grade_seeds", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.minibatch_size > args.num_envs * args.num_steps:
        parser.error(f"--minibatch-size must be at most a rollout, num_envs x num_steps = "
                     f"{args.num_envs * args.num_steps}")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must lie in [0, 1]")
    for name in ("ent_coef", "vf_coef"):
        if not getattr(args, name) >= 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    try:
        against(args)
    except ValueError as exc:
        parser.error(f"--against: {exc}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        parser.error(f"--out: {out} is not empty; pick a new folder")
    return args


def against(args: Args) -> tuple[str, ...]:
    """The policy specs graded beside the model, each checked (ValueError names a bad one)."""
    from agents import PolicySpec
    from agents.registry import HEADLINE
    specs = HEADLINE if args.against == "all" else tuple(args.against.split(","))
    for spec in specs:
        PolicySpec.parse(spec)
    return specs


def layer(linear: nn.Linear, std: float = np.sqrt(2)) -> nn.Linear:
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer(nn.Linear(n_obs, 128)), nn.Tanh(),
                                    layer(nn.Linear(128, 128)), nn.Tanh(),
                                    layer(nn.Linear(128, 1), std=1.0))
        self.actor = nn.Sequential(layer(nn.Linear(n_obs, 128)), nn.Tanh(),
                                   layer(nn.Linear(128, 128)), nn.Tanh(),
                                   layer(nn.Linear(128, n_actions), std=0.01))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def distribution(self, obs: torch.Tensor, mask: torch.Tensor) -> Categorical:
        return Categorical(logits=torch.where(mask, self.actor(obs), MASKED))


def grade(args: Args, model: Path, probe: str) -> None:
    """The exported file graded by the shared grader beside `args.against`, on both splits."""
    from eval.experiments import headline
    for split in ("public", "regenerated"):
        headline.run(Path(args.out) / f"eval_{split}", workers=args.workers, progress=False,
                     split=split, seeds=args.grade_seeds, probe=probe,
                     policies=against(args) + (f"onnx:{model}",))


@dataclass(frozen=True)
class Rollout:
    """`num_steps` steps of every env: what each step saw (`done`: the step before it ended an
    episode, so this one starts a new one) and did."""

    obs: torch.Tensor
    mask: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    values: torch.Tensor

    @classmethod
    def empty(cls, args: Args, n_obs: int, n_actions: int) -> Rollout:
        shape = (args.num_steps, args.num_envs)
        return cls(torch.zeros(shape + (n_obs,)), torch.zeros(shape + (n_actions,), dtype=bool),
                   torch.zeros(shape, dtype=torch.long),
                   *(torch.zeros(shape) for _ in range(4)))


def advantages(args: Args, rollout: Rollout, next_value: torch.Tensor,
               done: torch.Tensor) -> torch.Tensor:
    """GAE; an ended episode's next value is never its successor's."""
    steps = rollout.rewards.shape[0]
    out = torch.zeros_like(rollout.rewards)
    last, next_done = 0.0, done
    for t in reversed(range(steps)):
        if t < steps - 1:
            next_value, next_done = rollout.values[t + 1], rollout.dones[t + 1]
        delta = rollout.rewards[t] + args.gamma * next_value * (1 - next_done) - rollout.values[t]
        last = delta + args.gamma * args.gae_lambda * (1 - next_done) * last
        out[t] = last
    return out


def update(args: Args, agent: Agent, optimizer: torch.optim.Optimizer, rollout: Rollout,
           advantage: torch.Tensor) -> None:
    """PPO's clipped updates over the rollout, `update_epochs` passes of shuffled minibatches."""
    batch = rollout.rewards.numel()
    obs, mask = rollout.obs.reshape(batch, -1), rollout.mask.reshape(batch, -1)
    actions, logprobs = rollout.actions.reshape(batch), rollout.logprobs.reshape(batch)
    returns = (advantage + rollout.values).reshape(batch)
    advantage = advantage.reshape(batch)
    for _ in range(args.update_epochs):
        for idx in torch.randperm(batch).split(args.minibatch_size):
            dist = agent.distribution(obs[idx], mask[idx])
            ratio = (dist.log_prob(actions[idx]) - logprobs[idx]).exp()
            adv = advantage[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(
                1 - args.clip_coef, 1 + args.clip_coef)).mean()
            value_loss = ((agent.value(obs[idx]) - returns[idx]) ** 2).mean()
            loss = policy_loss - args.ent_coef * dist.entropy().mean() + args.vf_coef * value_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    writer = SummaryWriter(str(out / "tb"))
    probe = finality_gym.ENV_IDS[args.env_id]

    envs = gym.make_vec(args.env_id, args.num_envs, split="public", reward="relative",
                        autoreset_mode=AutoresetMode.SAME_STEP)
    n_obs, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    agent = Agent(n_obs, n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    rollout = Rollout.empty(args, n_obs, n_actions)

    obs, info = envs.reset(seed=args.seed)
    obs, mask = torch.as_tensor(obs), torch.as_tensor(info["action_mask"])
    done = torch.zeros(args.num_envs)
    step, last_validated, best = 0, None, {"mean_gap": float("inf")}
    started = time.perf_counter()
    for _ in range(-(-args.total_timesteps // (args.num_steps * args.num_envs))):
        for t in range(args.num_steps):
            rollout.obs[t], rollout.mask[t], rollout.dones[t] = obs, mask, done
            with torch.no_grad():
                dist = agent.distribution(obs, mask)
                action = dist.sample()
                rollout.logprobs[t], rollout.values[t] = dist.log_prob(action), agent.value(obs)
            rollout.actions[t] = action
            obs, reward, terminated, truncated, info = envs.step(action.numpy())
            rollout.rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            obs, mask = torch.as_tensor(obs), torch.as_tensor(info["action_mask"])
            done = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            step += args.num_envs
            if "final_info" in info:  # the gaps of the episodes that ended, in dollars
                for gap in info["final_info"]["gap"][info["_final_info"]]:
                    writer.add_scalar("train/episode_gap", gap / 100, step)
        with torch.no_grad():
            advantage = advantages(args, rollout, agent.value(obs), done)
        update(args, agent, optimizer, rollout, advantage)
        writer.add_scalar("train/steps_per_second", step / (time.perf_counter() - started), step)

        if last_validated is None or step - last_validated >= args.eval_every \
                or step >= args.total_timesteps:
            last_validated = step
            result = {"timesteps": step, **validation(agent.actor, True, probe)}
            for key in METRICS:
                writer.add_scalar(f"validation/{key}", result[key], step)
            with open(out / "validation.jsonl", "a") as f:
                f.write(json.dumps(result) + "\n")
            if result["mean_gap"] < best["mean_gap"]:
                best = result
                torch.save(agent.state_dict(), out / "best_agent.pt")
            print(f"{step:>10,} steps  {step / (time.perf_counter() - started):6,.0f} steps/s  "
                  f"validation gap ${result['mean_gap']:.2f}  best ${best['mean_gap']:.2f} at "
                  f"{best['timesteps']:,}", flush=True)
    train_seconds = time.perf_counter() - started
    writer.close()
    finish(args, agent, probe, {"timesteps": step, "train_seconds": round(train_seconds, 1),
                                "steps_per_second": round(step / train_seconds, 1), "best": best})


def finish(args: Args, agent: Agent, probe: str, result: dict) -> None:
    """The best actor exported, the run's result written, the export graded."""
    from eval.sweeps.provenance import machine
    out = Path(args.out)
    agent.load_state_dict(torch.load(out / "best_agent.pt"))
    model = out / "model.onnx"
    export(agent.actor, "logits", args.env_id, model, "masked PPO (examples/masked_ppo.py)")
    (out / "result.json").write_text(json.dumps(
        {**result, "resumed_from": None, "machines": [{"from_timesteps": 0, **machine()}]},
        indent=2) + "\n")
    grade(args, model, probe)


if __name__ == "__main__":
    main()
