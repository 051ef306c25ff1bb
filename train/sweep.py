"""`python -m train sweep`: one recipe (any `--algo`) trained from several seeds, graded together.

A sweep folder holds `sweep.json` (the recipe and the seeds), one full `train ppo` run per
seed in `seed_<k>/` (config, validation, best model, checkpoints, TensorBoard, the headline
grading of its best model on public and regenerated), and the across-seed aggregate:
`summary.json`, `report.md`, `seeds.png` (see `eval/sweeps/aggregate.py`). The Ray backend adds `tune/`,
Tune's own record of the experiment, and `ray.log`, Ray's output.

Backends: `local` (the default) trains the seeds in parallel processes, `--workers` at a time;
`ray` runs every seed as a Ray Tune trial (`train/ray_backend.py`, the `ray` extra). Each
process runs torch with `torch_threads` threads (1 by default), so a seed trains to the same
model whichever backend, worker or machine load it lands on.

Re-running a sweep into its folder resumes it: a seed with a `result.json` is done and left
alone, a seed with checkpoints resumes from its last whole one (SB3 checkpoints do not hold the
rollout and generator state, so such a seed is no longer bit-identical to an uninterrupted run;
its `result.json` says where it resumed), a seed folder with no checkpoint starts again. The
recipe must be the one the folder was started with (a `sweep.json` from before `--algo` holds a
recipe without `algo`: it is read as the algorithm `masked` named, PPO or MaskablePPO, as its
runs' `config.json` are); more seeds may be added. The sweep folder
and every seed folder hold a `.lock` while written: a second sweep on the folder, or a killed
sweep's worker still training a seed, is refused by name instead of trained over.

Nothing is written before every check has passed, Ray's included: a sweep that cannot run
leaves no folder that would refuse the next recipe. A Ctrl-C stops the sweep in either backend
(exit 130; re-running resumes), and a killed sweep's local workers exit with it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import eval.sweeps.aggregate as aggregate
from eval.grading.distributed import require_ray
from eval.grading.runfolder import lock, prepare, write_atomic

from .config import ALGOS, TrainConfig
from .seed import done_line, train_seed

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
        if first < 0 or last >= 2**32:
            raise ValueError(f"--seeds: {part.strip()!r} is not a range of seeds in "
                             "0..2**32-1")
        if last < first:
            raise ValueError(f"--seeds: {part.strip()} runs backwards; write {last}-{first}")
        if last - first + 1 > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got {last - first + 1} "
                             f"in {part.strip()!r}")
        seeds.update(range(first, last + 1))
        if len(seeds) > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got more in {text!r}")
    return tuple(sorted(seeds))


def recipe(config: TrainConfig) -> dict:
    """What every seed of a sweep shares: the configuration without its seed and folder."""
    data = dataclasses.asdict(config)
    del data["seed"], data["out"]
    data["net_arch"] = list(data["net_arch"])
    return data


def seed_folder(out: Path, seed: int) -> Path:
    return out / f"seed_{seed}"


def seed_config(base: TrainConfig, out: Path, seed: int) -> TrainConfig:
    return dataclasses.replace(base, seed=seed, out=str(seed_folder(out, seed).resolve()))


def check(base: TrainConfig, seeds: tuple[int, ...], out: Path) -> tuple[int, ...]:
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
            saved = recipe(TrainConfig.from_dict(found["recipe"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a sweep record ({exc})") from None
        if saved != wanted:
            diff = sorted(k for k in wanted.keys() | saved.keys() if saved.get(k) != wanted.get(k))
            raise ValueError(f"{out} holds a sweep of another recipe (differs in "
                             f"{', '.join(diff)}); use another --out folder")
    elif out.exists() and any(p.name != ".lock" for p in out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no sweep.json; pick an empty folder")
    return tuple(sorted(set(known) | set(seeds)))


def pin(base: TrainConfig, every: tuple[int, ...], out: Path) -> None:
    """Write the recipe and the seeds to `out/sweep.json`."""
    write_atomic(out / "sweep.json",
                 json.dumps({"recipe": recipe(base), "seeds": list(every)}, indent=2) + "\n")


def worker_start(sweep: int) -> None:
    """A local worker's first step. The worker leaves Ctrl-C to the sweep (a terminal sends it
    to every process of the group: each worker would print a traceback), and it exits when the
    sweep process `sweep` is gone: a killed sweep's workers would otherwise train on, holding
    their seeds' locks, then wait for their next seed on a pipe no one writes to, forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_without, args=(sweep,), daemon=True).start()


def _exit_without(sweep: int) -> None:
    while os.getppid() == sweep:
        time.sleep(0.5)
    os._exit(1)


def run_local(configs: list[TrainConfig], workers: int, grade: bool = True,
              name=lambda c: f"seed {c.seed}") -> None:
    """Train `configs` in `workers` processes (`train_seed`, `grade` its); `name(config)` is
    what its progress lines and the line printed when it is done call it."""
    # Fresh processes: a forked child would inherit this process's torch threads (and locks).
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                                initializer=worker_start,
                                                initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(train_seed, c, None, grade, name(c)): c for c in configs}
        try:
            for future in concurrent.futures.as_completed(futures):
                best = future.result()["best"]
                print(done_line(name(futures[future]), best["mean_gap"], best["timesteps"]),
                      flush=True)
        except KeyboardInterrupt:
            # the pool would wait for every seed in training to train to its end
            for worker in multiprocessing.active_children():
                worker.kill()
            raise


def sweep(base: TrainConfig, seeds: tuple[int, ...], out: Path, backend: str = "local",
          workers: int | None = None) -> dict:
    """Train every seed of the sweep in `out` that is not done, then aggregate them all."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend: unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if workers is None:
        workers = max(1, min(len(seeds), (os.cpu_count() or 1) // base.torch_threads))
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    every = check(base, seeds, out)
    run_ray = ray_started(base.torch_threads) if backend == "ray" else None
    prepare(out)
    with lock(out):
        pin(base, every, out)
        configs = [seed_config(base, out, s) for s in every]
        todo = [c for c in configs if not (Path(c.out) / "result.json").exists()]
        print(f"sweep {out}: {len(every)} seeds ({len(every) - len(todo)} done), backend "
              f"{backend}, {workers} at a time", flush=True)
        if todo and run_ray is not None:
            run_ray(train_seed, configs, out, workers)  # Tune's experiment is the whole sweep's
        elif todo:
            run_local(todo, workers)
        return aggregate.run(out, {c.seed: seed_run(Path(c.out)) for c in configs}, base.probe,
                             ALGOS[base.algo].name)


def ray_started(torch_threads: int):
    """Ray up, with room for a trial of `torch_threads` CPUs; the function that trains the
    seeds on it (`train/ray_backend.py`)."""
    require_ray()  # no Ray: the error now
    from .ray_backend import started
    return started(torch_threads)


def seed_run(folder: Path) -> aggregate.SeedRun:
    """A seed's training folder as the aggregate reads it."""
    result = json.loads((folder / "result.json").read_text())
    return aggregate.SeedRun(
        graded={split: folder / f"eval_{split}" for split in aggregate.SPLITS},
        training={"best_timesteps": result["best"]["timesteps"],
                  "validation_mean_gap": result["best"]["mean_gap"],
                  "timesteps": result["timesteps"], "train_seconds": result["train_seconds"],
                  "resumed_from": result.get("resumed_from"),
                  "machines": result.get("machines", [])})
