"""`python -m train ppo ...`: train a PPO baseline, then grade it like every scripted policy."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .ppo import PPOConfig, train


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
                   help="continue the run in --out from its latest checkpoint")
    args = parser.parse_args(argv)
    try:
        if args.resume:
            saved = Path(args.out) / "config.json"
            if not saved.exists():
                raise FileNotFoundError(f"--resume: no {saved}")
            config = PPOConfig.from_json(saved.read_text())
            if args.timesteps is not None:
                config = dataclasses.replace(config, timesteps=args.timesteps)
        else:
            config = PPOConfig(env=args.env, timesteps=args.timesteps or defaults.timesteps,
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
