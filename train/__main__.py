"""`python -m train ppo ...`: train a PPO baseline, then grade it like every scripted policy."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
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


def ppo_options(parser: argparse.ArgumentParser, defaults: PPOConfig) -> None:
    """The PPO recipe's options, shared by `ppo` and `sweep`."""
    parser.add_argument("--env", default=defaults.env)
    parser.add_argument("--timesteps", type=int, default=None,
                        help=f"total training steps (default {defaults.timesteps}; with "
                             "--resume, the saved run's)")
    parser.add_argument("--n-envs", type=int, default=defaults.n_envs)
    parser.add_argument("--masked", action="store_true",
                        help="MaskablePPO with the env's masks")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--n-steps", type=int, default=defaults.n_steps,
                        help="rollout steps per env")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--n-epochs", type=int, default=defaults.n_epochs)
    parser.add_argument("--ent-coef", type=float, default=defaults.ent_coef)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--validation-stride", type=int, default=defaults.validation_stride,
                        help="validate on every N-th independent unit of public")
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    parser.add_argument("--final-seeds", type=int, default=defaults.final_seeds)
    parser.add_argument("--torch-threads", type=int, default=defaults.torch_threads,
                        help="torch threads per training process (default 1: reproducible, "
                             "and as fast here)")


def config_from(args: argparse.Namespace, defaults: PPOConfig, seed: int, out: str) -> PPOConfig:
    return PPOConfig(env=args.env,
                     timesteps=defaults.timesteps if args.timesteps is None else args.timesteps,
                     seed=seed, n_envs=args.n_envs, masked=args.masked, out=out,
                     learning_rate=args.learning_rate, n_steps=args.n_steps,
                     batch_size=args.batch_size, n_epochs=args.n_epochs, ent_coef=args.ent_coef,
                     eval_every=args.eval_every, validation_stride=args.validation_stride,
                     checkpoint_every=args.checkpoint_every, final_seeds=args.final_seeds,
                     torch_threads=args.torch_threads)


def main(argv: list[str] | None = None) -> int:
    defaults = PPOConfig()
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ppo", help="train PPO (MaskablePPO with --masked) on a Finality env")
    ppo_options(p, defaults)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--out", default=defaults.out, help="run folder")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint (without it, "
                        "--out must be empty or new)")
    s = sub.add_parser("sweep", help="train the same recipe from several seeds and grade them "
                                     "together (re-running into --out resumes)")
    ppo_options(s, defaults)
    s.add_argument("--seeds", default="0-4", help="training seeds: 0-9, 0,3,7 or 0-4,10")
    s.add_argument("--backend", default="local", help="local (processes) or ray (Ray Tune)")
    s.add_argument("--workers", type=int, default=None,
                   help="seeds trained at once (default: one per core, at most the seeds)")
    s.add_argument("--out", required=True, help="sweep folder, e.g. runs/sweep_full")
    args = parser.parse_args(argv)
    try:
        if args.command == "sweep":
            return run_sweep(args, defaults)
        if args.resume:
            config = resumed_config(Path(args.out), args.timesteps)
        else:
            config = config_from(args, defaults, args.seed, args.out)
        result = train(config, resume=args.resume)
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"trained {result['timesteps']} steps in {result['train_seconds']} s; best validation "
          f"mean gap ${result['best']['mean_gap']:.2f} at {result['best']['timesteps']} steps; "
          f"graded in {config.out}/eval_public and {config.out}/eval_regenerated")
    return 0


def run_sweep(args: argparse.Namespace, defaults: PPOConfig) -> int:
    from .sweep import parse_seeds, sweep

    seeds = parse_seeds(args.seeds)
    base = config_from(args, defaults, 0, args.out)
    started = time.perf_counter()
    summary = sweep(base, seeds, Path(args.out), backend=args.backend, workers=args.workers)
    a = summary["splits"]["regenerated"]["across_seeds"]
    print(f"sweep of {len(summary['seeds'])} seeds in {time.perf_counter() - started:.0f} s: "
          f"regenerated mean gap ${a['mean_gap']:.2f} [{a['mean_gap_ci'][0]:.2f}, "
          f"{a['mean_gap_ci'][1]:.2f}] across seeds, "
          f"{a['seeds_at_or_below_best_scripted']} of {len(summary['seeds'])} seeds at or below "
          f"{summary['splits']['regenerated']['best_scripted']}; {args.out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
