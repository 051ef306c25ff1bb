"""The sweep's Ray backend: every seed a Ray Tune trial (the `ray` extra: `ray[tune]`).

`ray.init()` joins the cluster named by `RAY_ADDRESS` when it is set and starts an embedded one
otherwise. A trial is `train_seed` (the same function the local backend runs) with
`torch_threads` CPUs; it reports every validation's metrics to Tune with the model of that step
as the trial's checkpoint (Tune keeps the last one under `tune/`). The seed's own folder stays
the record, so both backends write the same layout; on a multi-machine cluster the sweep folder
must be on storage every node sees.

An interrupted sweep resumes with Tune's restore: finished trials are not run again, unfinished
and errored ones are resumed, and each resumes from its seed folder's last checkpoint. The
experiment is named for its seeds (`tune/seeds_0-4`), so a sweep that adds seeds runs a new
experiment, in which the seeds already done return their saved result at once.

Only `python -m train sweep --backend ray` imports this module (and Ray).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

# Progress lines of different seeds differ only in their numbers: Ray would fold them into one
# ("repeated 5x across cluster"). Ray reads this when it is imported.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

try:
    import ray
    from ray import tune
except ImportError:
    raise ImportError("--backend ray needs Ray Tune: pip install -c constraints.txt -e '.[ray]' "
                      "(make installs it)") from None

from eval.distributed import connect

from .ppo import PPOConfig
from .sweep import train_seed


def seeds_label(seeds: list[int]) -> str:
    """`0-4,7`: consecutive seeds as ranges."""
    parts, start = [], None
    for i, seed in enumerate(seeds):
        if start is None:
            start = seed
        if i + 1 == len(seeds) or seeds[i + 1] != seed + 1:
            parts.append(str(seed) if seed == start else f"{start}-{seed}")
            start = None
    return ",".join(parts)


def report_to_tune(metrics: dict, model) -> None:
    """The validation's metrics, with this step's model as the trial's checkpoint."""
    with tempfile.TemporaryDirectory() as folder:
        model.save(Path(folder) / "model.zip")
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def trial(params: dict, configs: dict) -> dict:
    config = PPOConfig.from_json(configs[params["seed"]])
    result = train_seed(config, report=report_to_tune)
    best = result["best"]
    # the final report: Tune's record of the trial ends with the selected model's numbers
    return {"timesteps": result["timesteps"], "best_mean_gap": best["mean_gap"],
            "best_timesteps": best["timesteps"], "done": True}


def trial_folder(trial) -> str:
    return f"seed_{trial.config['seed']}"


def experiment_name(configs: list[PPOConfig]) -> str:
    label = seeds_label(sorted(c.seed for c in configs))
    if len(label) > 80:  # a folder name has at most 255 bytes
        label = hashlib.sha256(label.encode()).hexdigest()[:16]
    return f"seeds_{label}"


def new_tuner(trainable, configs: list[PPOConfig], storage: str, name: str, workers: int):
    return tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([c.seed for c in configs])},
        tune_config=tune.TuneConfig(max_concurrent_trials=workers,
                                    trial_dirname_creator=trial_folder),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))


def fit(tuner) -> None:
    failed = [r for r in tuner.fit() if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} Tune trial(s) failed; the first: {failed[0].error}")


def run_ray(configs: list[PPOConfig], out: Path, workers: int) -> None:
    connect(log_to_driver=True)  # the trials' progress lines, prefixed by Ray
    threads = configs[0].torch_threads
    cpus = ray.cluster_resources().get("CPU", 0)
    if threads > cpus:  # a trial would wait for its CPUs forever
        raise ValueError(f"--torch-threads {threads}: a trial needs that many CPUs and the Ray "
                         f"cluster has {cpus:g}")
    storage = str((out / "tune").resolve())
    name = experiment_name(configs)
    trainable = tune.with_resources(
        tune.with_parameters(trial, configs={c.seed: c.to_json() for c in configs}),
        {"cpu": threads})
    path = os.path.join(storage, name)
    if tune.Tuner.can_restore(path):
        print(f"resuming the Tune experiment {path} (its --workers as first given)", flush=True)
        fit(tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True))
    else:
        fit(new_tuner(trainable, configs, storage, name, workers))
    # Tune does not run a finished trial again: a seed whose folder was deleted since gets an
    # experiment of its own
    missing = [c for c in configs if not (Path(c.out) / "result.json").exists()]
    if missing:
        again = next(f"{name}_again{k}" for k in range(1, 10**6)
                     if not os.path.exists(os.path.join(storage, f"{name}_again{k}")))
        print(f"seeds {seeds_label([c.seed for c in missing])} have no result: training them "
              f"in the Tune experiment {again}", flush=True)
        fit(new_tuner(trainable, missing, storage, again, workers))
