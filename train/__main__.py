"""`python -m train ppo ...`: train a PPO baseline, then grade it like every scripted policy."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .ppo import PPOConfig, train


def resumed_config(out: Path, timesteps: int | None) -> PPOConfig:
    """The configuration saved in the run folder `out`, to continue that run in `out` itself:
    the saved `out` is where the run was started, which a moved or copied folder no longer is."""
    saved = out / "config.json"
    if not saved.is_file():
        raise FileNotFoundError(f"--resume: {out} holds no config.json (not a training run folder)")
    try:
        config = PPOConfig.from_json(saved.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--resume: {saved} is not a run configuration ({exc})") from None
    return dataclasses.replace(config, out=str(out),
                               timesteps=config.timesteps if timesteps is None else timesteps)


def main(argv: list[str] | None = None) -> int:
    defaults = PPOConfig()
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ppo", help="train PPO (MaskablePPO with --masked) on a Finality env")
    p.add_argument("--env", default=defaults.env)
    p.add_argument("--timesteps", type=int, default=None,
                   help=f"total training steps (default {defaults.timesteps}; with --resume, "
                        "the saved run's)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--n-envs", type=int, default=defaults.n_envs)
    p.add_argument("--masked", action="store_true", help="MaskablePPO with the env's masks")
    p.add_argument("--out", default=defaults.out, help="run folder")
    p.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    p.add_argument("--n-steps", type=int, default=defaults.n_steps, help="rollout steps per env")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--ent-coef", type=float, default=defaults.ent_coef)
    p.add_argument("--eval-every", type=int, default=defaults.eval_every)
    p.add_argument("--validation-stride", type=int, default=defaults.validation_stride,
                   help="validate on every N-th independent unit of public")
    p.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    p.add_argument("--final-seeds", type=int, default=defaults.final_seeds)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint (without it, "
                        "--out must be empty or new)")
    args = parser.parse_args(argv)
    try:
        if args.resume:
            config = resumed_config(Path(args.out), args.timesteps)
        else:
            timesteps = defaults.timesteps if args.timesteps is None else args.timesteps
            config = PPOConfig(env=args.env, timesteps=timesteps,
                               seed=args.seed, n_envs=args.n_envs, masked=args.masked,
                               out=args.out, learning_rate=args.learning_rate,
                               n_steps=args.n_steps, batch_size=args.batch_size,
                               ent_coef=args.ent_coef, eval_every=args.eval_every,
                               validation_stride=args.validation_stride,
                               checkpoint_every=args.checkpoint_every,
                               final_seeds=args.final_seeds)
        result = train(config, resume=args.resume)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"trained {result['timesteps']} steps in {result['train_seconds']} s; best validation "
          f"mean gap ${result['best']['mean_gap']:.2f} at {result['best']['timesteps']} steps; "
          f"graded in {config.out}/eval_public and {config.out}/eval_regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
