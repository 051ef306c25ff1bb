"""`python -m train sweep`: one PPO recipe trained from several seeds, graded together.

A sweep folder holds `sweep.json` (the recipe and the seeds), one full `train ppo` run per
seed in `seed_<k>/` (config, validation, best model, checkpoints, TensorBoard, the headline
grading of its best model on public and regenerated), and the across-seed aggregate:
`summary.json`, `report.md`, `seeds.png` (see `eval/seeds.py`). The Ray backend adds `tune/`,
Tune's own record of the experiment.

Backends: `local` (the default) trains the seeds in parallel processes, `--workers` at a time;
`ray` runs every seed as a Ray Tune trial (`train/ray_backend.py`, the `ray` extra). Each
process runs torch with `torch_threads` threads (1 by default), so a seed trains to the same
model whichever backend, worker or machine load it lands on.

Re-running a sweep into its folder resumes it: a seed with a `result.json` is done and left
alone, a seed with checkpoints resumes from its last whole one (SB3 checkpoints do not hold the
rollout and generator state, so such a seed is no longer bit-identical to an uninterrupted run;
its `result.json` says where it resumed), a seed folder with no checkpoint starts again. The
recipe must be the one the folder was started with; more seeds may be added. The sweep folder
and every seed folder hold a `.lock` while written: a second sweep on the folder, or a killed
sweep's worker still training a seed, is refused by name instead of trained over.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import shutil
from pathlib import Path

from eval import seeds as aggregate
from eval.grader import writer_lock

from .ppo import PPOConfig, latest_checkpoint, train, write_atomic

BACKENDS = ("local", "ray")
MAX_SEEDS = 100


def parse_seeds(text: str) -> tuple[int, ...]:
    """`0-9`, `0,3,7` or a mix (`0-4,10`): the training seeds, sorted, each once."""
    seeds: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"--seeds: {part.strip()!r} is not a seed or a range like "
                             "0-9") from None
        if first < 0 or last < first or last >= 2**32:
            raise ValueError(f"--seeds: {part.strip()!r} is not a range of seeds in "
                             "0..2**32-1")
        if last - first + 1 > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got {last - first + 1} "
                             f"in {part.strip()!r}")
        seeds.update(range(first, last + 1))
        if len(seeds) > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got more in {text!r}")
    return tuple(sorted(seeds))


def recipe(config: PPOConfig) -> dict:
    """What every seed of a sweep shares: the configuration without its seed and folder."""
    data = dataclasses.asdict(config)
    del data["seed"], data["out"]
    data["net_arch"] = list(data["net_arch"])
    return data


def seed_folder(out: Path, seed: int) -> Path:
    return out / f"seed_{seed}"


def seed_config(base: PPOConfig, out: Path, seed: int) -> PPOConfig:
    return dataclasses.replace(base, seed=seed, out=str(seed_folder(out, seed).resolve()))


def check(base: PPOConfig, seeds: tuple[int, ...], out: Path) -> tuple[int, ...]:
    """Every seed of the sweep in `out` (those there and the new ones), or an error if `out`
    holds something else; writes nothing."""
    path = out / "sweep.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    wanted = recipe(base)
    known: tuple[int, ...] = ()
    if path.exists():
        try:
            found = json.loads(path.read_text())
            known = tuple(found["seeds"])
            saved = found["recipe"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a sweep record ({exc})") from None
        if saved != wanted:
            diff = sorted(k for k in wanted.keys() | saved.keys() if saved.get(k) != wanted.get(k))
            raise ValueError(f"{out} holds a sweep of another recipe (differs in "
                             f"{', '.join(diff)}); use another --out folder")
    elif out.exists() and any(p.name != ".lock" for p in out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no sweep.json; pick an empty folder")
    return tuple(sorted(set(known) | set(seeds)))


def pin(base: PPOConfig, every: tuple[int, ...], out: Path) -> None:
    """Write the recipe and the seeds to `out/sweep.json`."""
    write_atomic(out / "sweep.json",
                 json.dumps({"recipe": recipe(base), "seeds": list(every)}, indent=2) + "\n")


def train_seed(config: PPOConfig, report=None) -> dict:
    """One seed's whole run, resuming whatever an interrupted sweep left of it; its result.
    Runs in a worker process (local) or a Tune trial (ray)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    # A second process on the same seed (a killed sweep's orphaned worker still training, a
    # sweep started twice) is refused rather than trained over.
    with writer_lock(out):
        done = out / "result.json"
        if done.exists():
            return json.loads(done.read_text())
        resume = latest_checkpoint(out) is not None
        if not resume:  # started, but killed before its first checkpoint: start again
            for path in out.iterdir():
                if path.name != ".lock":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        return train(config, resume=resume, grading_workers=1, label=f"seed {config.seed}: ",
                     report=report)


def run_local(configs: list[PPOConfig], workers: int) -> None:
    # Fresh processes: a forked child would inherit this process's torch threads (and locks).
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(train_seed, c): c.seed for c in configs}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            print(f"seed {futures[future]}: done, best validation gap "
                  f"${result['best']['mean_gap']:.2f} at {result['best']['timesteps']:,} steps",
                  flush=True)


def sweep(base: PPOConfig, seeds: tuple[int, ...], out: Path, backend: str = "local",
          workers: int | None = None) -> dict:
    """Train every seed of the sweep in `out` that is not done, then aggregate them all."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend: unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if workers is None:
        workers = max(1, min(len(seeds), (os.cpu_count() or 1) // base.torch_threads))
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if backend == "ray":  # no Ray: an error now, before anything is written
        from . import ray_backend  # noqa: F401
    every = check(base, seeds, out)
    out.mkdir(parents=True, exist_ok=True)
    with writer_lock(out):
        pin(base, every, out)
        return _sweep(base, every, out, backend, workers)


def _sweep(base: PPOConfig, every: tuple[int, ...], out: Path, backend: str,
           workers: int) -> dict:
    configs = [seed_config(base, out, s) for s in every]
    todo = [c for c in configs if not (Path(c.out) / "result.json").exists()]
    print(f"sweep {out}: {len(every)} seeds ({len(every) - len(todo)} done), backend {backend}, "
          f"{workers} at a time", flush=True)
    if todo:
        if backend == "ray":
            from .ray_backend import run_ray
            run_ray(configs, out, workers)  # Tune's experiment is the whole sweep's
        else:
            run_local(todo, workers)
    return aggregate.run(out, {c.seed: Path(c.out) for c in configs}, base.probe)
