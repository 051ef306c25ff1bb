"""`python -m train ppo ...`: train a PPO baseline (or MaskablePPO, RecurrentPPO, A2C or DQN:
`--algo`), then grade it like every scripted policy; `python -m train sweep ...`: train one
recipe from several seeds and grade them together; `python -m train search ...`: train several
algorithms briefly and pick one on validation; `python -m train export ...`: write a saved model
as the ONNX graph `onnx:PATH` grades."""

from __future__ import annotations

import os

# numpy's OpenBLAS starts a thread per core for every matrix product, which the bootstrap's
# small products (replicates x units) only wait on: one thread made the headline's statistics
# 9 times faster on two busy cores, with the same results. Set before numpy is imported, for
# this process and the workers it starts; a value set outside is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses
import signal
import sys
import time
import typing
from pathlib import Path

from .config import HYPERPARAMETERS, OPTIONS, TUNED, TrainConfig
from .offline import OFFLINE_ALGORITHMS, OfflineConfig
from .run import train
from .search import SHARED, TIMESTEPS, parse_algos, search
from .sweep import BACKENDS, parse_seeds, sweep

# The recipe's options, shared by `ppo` and `sweep` (`search` takes those of SHARED): the fields
# of TrainConfig with help (`train/config.py`), each with its type, help and default from its
# field. Every option defaults to None, so that the options given can be told apart from those
# left out (`--resume` takes none but --timesteps, and an algorithm refuses the hyperparameters
# it does not take); --help says the default the configuration takes.
RECIPE = tuple(field.name for field in OPTIONS)
# What to do after a Ctrl-C, by command: a run resumes, a sweep or search resumes when re-run,
# an export or a dataset is written whole at its end (nothing to keep), an offline run is not
# resumable (its folder must go first).
HINTS = {"ppo": "resume with --resume", "sweep": "re-run to resume",
         "search": "re-run to resume", "export": "nothing was written; run it again",
         "dataset": "nothing was written (a dataset is written whole at its end); run it again",
         "offline": "an offline run does not resume: remove {out} and run it again"}
TYPES = typing.get_type_hints(TrainConfig)


def option(field: str) -> str:
    return "--" + field.replace("_", "-")


def recipe_options(parser: argparse.ArgumentParser, timesteps: str,
                   fields: tuple[str, ...] = RECIPE) -> None:
    """The recipe's options (`fields` of them); `timesteps` is what --help says of --timesteps.
    A flag's help and a choice's say their default; the others' get it added."""
    for field in OPTIONS:
        if field.name not in fields:
            continue
        text, kind = field.metadata["help"], _type(field.name)
        if kind is bool:
            parser.add_argument(option(field.name), action="store_true", default=None, help=text)
        elif "choices" in field.metadata:
            parser.add_argument(option(field.name), choices=field.metadata["choices"],
                                default=None, help=text)
        else:
            parser.add_argument(option(field.name), type=kind, default=None,
                                help=timesteps if field.name == "timesteps" else
                                f"{text} ({defaults(field.name)})")


def _type(field: str) -> type:
    """A field's type, without the None of an algorithm's hyperparameter (`float | None`)."""
    kinds = [k for k in typing.get_args(TYPES[field]) if k is not type(None)] or [TYPES[field]]
    return kinds[0]


def defaults(field: str) -> str:
    """What --help says of a field's default: `default 8`; for a hyperparameter, the algorithms
    that take it with their defaults (`default 0.0007 for a2c; 0.0001 for dqn`), or
    `dqn only, default 100000`."""
    if field not in TUNED:
        return f"default {getattr(TrainConfig, field)}"
    takers: dict = {}
    for algo, own in HYPERPARAMETERS.items():
        if field in own:
            takers.setdefault(own[field], []).append(algo)
    if len(takers) == 1:
        (value, algos), = takers.items()
        return f"{', '.join(algos)} only, default {value}"
    return "default " + "; ".join(f"{value} for {', '.join(algos)}"
                                  for value, algos in takers.items())


def given(args: argparse.Namespace) -> dict:
    """The recipe's options given on the command line, as TrainConfig's fields."""
    return {field: getattr(args, field) for field in RECIPE if getattr(args, field) is not None}


def resumed_config(args: argparse.Namespace) -> TrainConfig:
    """The configuration saved in the run folder `--out`, to continue that run in `--out`
    itself: the saved `out` is where the run was started, which a moved or copied folder no
    longer is. Of the recipe, only --timesteps may change: any other option given would be
    ignored, so it is refused."""
    out = Path(args.out)
    changed = sorted(option(f) for f in given(args) if f != "timesteps")
    changed += ["--seed"] if args.seed is not None else []
    if changed:
        raise ValueError(f"--resume continues the saved run's recipe: {', '.join(changed)} "
                         "cannot change it (only --timesteps can); train a new run into "
                         "another --out folder instead")
    saved = out / "config.json"
    if not saved.is_file():
        raise FileNotFoundError(f"--resume: {out} holds no config.json (not a training run folder)")
    try:
        config = TrainConfig.from_json(saved.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--resume: {saved} is not a run configuration ({exc})") from None
    return dataclasses.replace(config, out=str(out),
                               timesteps=config.timesteps if args.timesteps is None
                               else args.timesteps)


def config_from(args: argparse.Namespace, seed: int, out: str) -> TrainConfig:
    return TrainConfig(**given(args), seed=seed, out=out)


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m train", description=__doc__)
    sub = main.add_subparsers(dest="command", required=True)
    what = ("train PPO (or another algorithm: --algo) on a Finality env, then grade it; an "
            "algorithm refuses the hyperparameters it does not take")
    p = sub.add_parser("ppo", help=what, description=what)
    recipe_options(p, f"total training steps (default {TrainConfig.timesteps}; with --resume, "
                      "the saved run's)")
    p.add_argument("--seed", type=int, default=None, help=f"training seed (default "
                                                         f"{TrainConfig.seed})")
    p.add_argument("--out", default=TrainConfig.out, help=f"run folder (default {TrainConfig.out})")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint, with its saved "
                        "recipe (without it, --out must be empty or new)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes of the final grading (default: one per core)")
    what = ("train the same recipe from several seeds, each a whole `ppo` run, and grade them "
            "together (re-running into --out resumes)")
    s = sub.add_parser("sweep", help=what, description=what)
    recipe_options(s, f"training steps of each seed (default {TrainConfig.timesteps})")
    s.add_argument("--seeds", default="0-4",
                   help="training seeds: 0-9, 0,3,7 or 0-4,10 (default 0-4)")
    s.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: worker processes; ray: Ray Tune trials (default local)")
    s.add_argument("--workers", type=int, default=None,
                   help="seeds trained at once (default: one per core, at most the seeds)")
    s.add_argument("--out", required=True, help="sweep folder, e.g. runs/sweep_full")
    what = ("train each algorithm briefly with its own hyperparameters and pick the one with the "
            "lowest validation gap (public only); re-running into --out resumes")
    q = sub.add_parser("search", help=what, description=what)
    q.add_argument("--env", default=TrainConfig.env, help=f"env id (default {TrainConfig.env})")
    q.add_argument("--algos", default="ppo,maskable_ppo,recurrent_ppo",
                   help="the algorithms compared (default ppo,maskable_ppo,recurrent_ppo)")
    recipe_options(q, f"training steps of each run (default {TIMESTEPS})", SHARED)
    q.add_argument("--seeds", default="0", help="training seeds of each algorithm (default 0)")
    q.add_argument("--workers", type=int, default=None,
                   help="runs trained at once (default: one per core, at most the runs)")
    q.add_argument("--out", required=True, help="search folder, e.g. runs/search_delayed")
    what = ("write a saved model (any algorithm sb3: grades) as an ONNX graph for onnx:PATH, "
            "checked against torch on observations of real episodes before it is written")
    e = sub.add_parser("export", help=what, description=what)
    e.add_argument("model", help="a model archive (MODEL.zip) or a training run folder (RUN: its "
                                 "best_model.zip)")
    e.add_argument("--onnx", required=True, help="the ONNX file to write, e.g. model.onnx")
    what = ("a Minari dataset of scripted policies' decisions on one probe arm (public split), "
            "with D4RL's reference scores, for offline RL")
    d = sub.add_parser("dataset", help=what, description=what)
    d.add_argument("--family", required=True, choices=("expert", "medium", "mixed", "random"),
                   help="expert: the gate; medium: react and reflection; mixed: the eight "
                        "unprivileged headline policies; random: the random policy")
    d.add_argument("--arm", default="full", help="the probe arm (default full)")
    d.add_argument("--seeds", default="0-4",
                   help="the fault seeds themselves, a list or range like 0-4 or 0,3 (not a "
                        "count; default 0-4), each under every public task")
    d.add_argument("--out", required=True,
                   help="Minari's datasets folder to write into (MINARI_DATASETS_PATH to load)")
    what = ("an offline baseline (bc: behaviour cloning, masked; cql: Tianshou's discrete CQL) "
            "trained on a dataset of `train dataset`, exported to ONNX and graded")
    o = sub.add_parser("offline", help=what, description=what)
    o.add_argument("--algo", choices=OFFLINE_ALGORITHMS, default="bc", help="default bc")
    o.add_argument("--dataset", required=True, help="the dataset id, e.g. finality-full/expert-v0")
    o.add_argument("--datasets", required=True, help="the folder `train dataset --out` wrote")
    o.add_argument("--out", required=True, help="run folder (new or empty)")
    for name, kind in (("seed", int), ("epochs", int), ("batch_size", int),
                       ("learning_rate", float), ("grade_seeds", int), ("workers", int)):
        default = OfflineConfig.__dataclass_fields__[name].default
        o.add_argument(option(name), type=kind, default=default, help=f"default {default}")
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "sweep":
            return run_sweep(args)
        if args.command == "search":
            return run_search(args)
        if args.command == "export":
            return run_export(args)
        if args.command == "dataset":
            return run_dataset(args)
        if args.command == "offline":
            return run_offline(args)
        if args.resume:
            config = resumed_config(args)
        else:
            config = config_from(args, TrainConfig.seed if args.seed is None else args.seed,
                                 args.out)
        workers = (os.cpu_count() or 1) if args.workers is None else args.workers
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        result = train(config, resume=args.resume, grading_workers=workers)
    except KeyboardInterrupt:  # checkpoints and the sweep's finished seeds are kept
        # a further Ctrl-C must not break the clean-up that runs at exit (Ray's shutdown)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"interrupted; {HINTS[args.command].format(out=args.__dict__.get('out'))}",
              file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"trained {result['timesteps']} steps in {result['train_seconds']} s; best validation "
          f"mean gap ${result['best']['mean_gap']:.2f} at {result['best']['timesteps']} steps; "
          f"graded in {config.out}/eval_public and {config.out}/eval_regenerated")
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    base = config_from(args, 0, args.out)
    started = time.perf_counter()
    summary = sweep(base, seeds, Path(args.out), backend=args.backend, workers=args.workers)
    a = summary["splits"]["regenerated"]["across_seeds"]
    print(f"sweep of {len(summary['seeds'])} seeds in {time.perf_counter() - started:.0f} s: "
          f"regenerated mean gap ${a['mean_gap']:.2f} [{a['mean_gap_ci'][0]:.2f}, "
          f"{a['mean_gap_ci'][1]:.2f}] across seeds, "
          f"{a['seeds_at_or_below_best_scripted']} of {len(summary['seeds'])} seeds at or below "
          f"{summary['splits']['regenerated']['best_scripted']}; {args.out}/report.md")
    return 0


def run_search(args: argparse.Namespace) -> int:
    shared = {f: getattr(args, f) for f in SHARED if getattr(args, f) is not None}
    summary = search(args.env, parse_algos(args.algos), parse_seeds(args.seeds), Path(args.out),
                     shared, workers=args.workers)
    gaps = ", ".join(f"{a} ${e['mean_best_gap']:.2f}" for a, e in summary["algorithms"].items())
    print(f"search on {args.env}: best validation gap {gaps}; chosen {summary['chosen']}; "
          f"{args.out}/report.md")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from .export import TOLERANCE, export
    done = export(Path(args.model), Path(args.onnx))
    trained = done.trained_for
    said = (f"trained on {trained.env_id} (probe arm {trained.probe}), which its metadata says"
            if trained is not None else "no training metadata in the model: its metadata says "
            "nothing of the arm it was trained on")
    print(f"exported {done.algorithm} {done.model} to {done.out}: onnxruntime agrees with torch "
          f"within {done.difference:.1e} on {done.observations} observations of {done.episodes} "
          f"episodes (tolerance {TOLERANCE * done.scale:.1e}); {said}; grade it with "
          f"onnx:{done.out}" + (f" --probe {trained.probe}" if trained is not None else ""))
    return 0


def run_offline(args: argparse.Namespace) -> int:
    from .offline import offline
    config = OfflineConfig(**{f: getattr(args, f) for f in OfflineConfig.__dataclass_fields__})
    result = offline(config)
    print(f"{config.algo} on {result['transitions']:,} transitions of {result['episodes']} "
          f"episodes in {result['train_seconds']} s, validation gap "
          f"${result['best']['mean_gap']:.2f}; graded in {config.out}/eval_public and "
          f"{config.out}/eval_regenerated")
    return 0


def run_dataset(args: argparse.Namespace) -> int:
    from .dataset import DatasetConfig, build
    config = DatasetConfig(args.family, arm=args.arm, seeds=parse_seeds(args.seeds))
    started = time.perf_counter()
    dataset = build(config, Path(args.out))
    meta = dataset.storage.metadata
    print(f"{config.dataset_id}: {dataset.total_episodes} episodes, {dataset.total_steps} steps "
          f"in {time.perf_counter() - started:.0f} s, in {args.out} (MINARI_DATASETS_PATH="
          f"{args.out}); reference returns {meta['ref_min_score']:.4f} (random) to "
          f"{meta['ref_max_score']:.4f} (the oracle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
