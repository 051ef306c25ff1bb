"""The sweep's Ray backend: every seed a Ray Tune trial (the `ray` extra: `ray[tune]`).

`ray.init()` joins the cluster named by `RAY_ADDRESS` when it is set and starts an embedded one
otherwise; the sweep starts Ray, and checks that the cluster has the CPUs of one trial, before
it writes anything. A trial is the sweep's `train_seed` (the function the local backend runs)
with `torch_threads` CPUs; it reports every validation's metrics to Tune with the model of that
step as the trial's checkpoint (Tune keeps the last one under `tune/`). The seed's own folder
stays the record, so both backends write the same layout; on a multi-machine cluster the sweep
folder must be on storage every node sees.

The terminal shows the sweep's own lines, as the local backend prints them: each seed's
progress line per validation (printed here, from the metrics its trial reports) and its "done"
line. Ray's own output goes to `ray.log` in the sweep folder: Ray's and Tune's notes and
warnings on this side, everything the trials print on theirs (Tune's "Checkpoint successfully
created" at every validation, tracebacks).

An interrupted sweep resumes with Tune's restore: finished trials are not run again, unfinished
and errored ones are resumed, and each resumes from its seed folder's last checkpoint. The
experiment is named for its seeds (`tune/seeds_0-4`), so a sweep that adds seeds runs a new
experiment, in which the seeds already done return their saved result at once. A Ctrl-C stops
the sweep (Tune catches the first one to end its trials and save its state; a second skips
that) like the local backend's.

Only `python -m train sweep --backend ray` imports this module, once `require_ray()` has
found Ray.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import signal
import sys
import tempfile
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import ray
from ray import tune

from eval.grading.distributed import connect

from .config import TrainConfig
from .run import progress_line
from .seed import done_line

RAY_LOG = "ray.log"


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


@contextmanager
def logged_to(path: Path, early: str):
    """Ray's lines on this side appended to `path`, after `early` (what Ray printed while it
    started, before the sweep folder could be written). They go through the `ray` logger, which
    `ray.init(configure_logging=False)` leaves without a handler: its warnings would reach the
    terminal through Python's last-resort handler."""
    with open(path, "a") as log:
        log.write(early)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ray")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


@contextmanager
def output_to(path: Path):
    """This process's stdout and stderr appended to `path`, at the file descriptors: so that
    all a trial's process writes lands there, Ray's logging in the worker and C libraries'
    warnings as well as Python's prints."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def report_to_tune(metrics: dict, model) -> None:
    """The validation's metrics, with this step's model as the trial's checkpoint."""
    with tempfile.TemporaryDirectory() as folder:
        model.save(Path(folder) / "model.zip")
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def trial(params: dict, train_seed, configs: dict) -> dict:
    config = TrainConfig.from_json(configs[params["seed"]])
    with output_to(Path(config.out).parent / RAY_LOG):
        result = train_seed(config, report=report_to_tune)
    best = result["best"]
    # the final report: Tune's record of the trial ends with the selected model's numbers
    return {"timesteps": result["timesteps"], "best_mean_gap": best["mean_gap"],
            "best_timesteps": best["timesteps"], "done": True}


class Progress(tune.Callback):
    """The sweep's own lines, printed as the trials report: a seed's progress line at each
    validation, and its "done" line (a trial's last report, its return value, says done)."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "validation_mean_gap" in result:
            print(f"seed {trial.config['seed']}: {progress_line(result)}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result
        if result.get("done"):
            print(done_line(f"seed {trial.config['seed']}", result["best_mean_gap"],
                            result["best_timesteps"]), flush=True)


def trial_folder(trial) -> str:
    return f"seed_{trial.config['seed']}"


def experiment_name(configs: list[TrainConfig]) -> str:
    label = seeds_label(sorted(c.seed for c in configs))
    if len(label) > 80:  # a folder name has at most 255 bytes
        label = hashlib.sha256(label.encode()).hexdigest()[:16]
    return f"seeds_{label}"


def new_tuner(trainable, configs: list[TrainConfig], storage: str, name: str, workers: int):
    return tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([c.seed for c in configs])},
        tune_config=tune.TuneConfig(max_concurrent_trials=workers,
                                    trial_dirname_creator=trial_folder),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                  callbacks=[Progress()],
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))


def fit(tuner) -> None:
    """Run the experiment to its end, or raise KeyboardInterrupt if a Ctrl-C ended it.

    Tune's fit catches the first Ctrl-C itself: it ends the trials, saves its state and returns
    as though the experiment were done, its own handler left in place. So a trial that neither
    finished nor failed means a Ctrl-C, and the handler of before is put back."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        results = tuner.fit()
    finally:
        signal.signal(signal.SIGINT, handler)
    if any(r.error is None and not (r.metrics or {}).get("done") for r in results):
        raise KeyboardInterrupt
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} Tune trial(s) failed (see {RAY_LOG}); the first: "
                           f"{failed[0].error}")


def started(torch_threads: int):
    """Ray up, with the CPUs of one trial, before the sweep writes anything; returns `run`.
    What Ray prints while it starts is kept for the sweep's ray.log, or shown if it fails."""
    early = io.StringIO()
    try:
        with redirect_stdout(early), redirect_stderr(early):
            connect()
    except BaseException:
        sys.stderr.write(early.getvalue())
        raise
    cpus = ray.cluster_resources().get("CPU", 0)
    if torch_threads > cpus:  # a trial would wait for its CPUs forever
        raise ValueError(f"--torch-threads {torch_threads}: a trial needs that many CPUs and "
                         f"the Ray cluster has {cpus:g}")
    return functools.partial(run, early.getvalue())


def run(early: str, train_seed, configs: list[TrainConfig], out: Path, workers: int) -> None:
    """Every seed of `configs` a trial of the sweep's Tune experiment; `train_seed` trains one.
    Ray's output goes to the sweep's ray.log (what it printed while it started, `early`, first)."""
    print(f"Ray's own output: {out / RAY_LOG}", flush=True)
    # Tune's newer console output prints its own lines (a configuration table, where to find
    # the results, a TensorBoard hint) whatever the verbosity
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    with logged_to(out / RAY_LOG, early):
        storage = str((out / "tune").resolve())
        name = experiment_name(configs)
        trainable = tune.with_resources(
            tune.with_parameters(trial, train_seed=train_seed,
                                 configs={c.seed: c.to_json() for c in configs}),
            {"cpu": configs[0].torch_threads})
        path = os.path.join(storage, name)
        if tune.Tuner.can_restore(path):
            print(f"resuming the Tune experiment {path} (its --workers as first given)",
                  flush=True)
            fit(tune.Tuner.restore(path, trainable, resume_unfinished=True,
                                   resume_errored=True))
        else:
            fit(new_tuner(trainable, configs, storage, name, workers))
        # Tune does not run a finished trial again: a seed whose folder was deleted since gets
        # an experiment of its own
        missing = [c for c in configs if not (Path(c.out) / "result.json").exists()]
        if missing:
            again = next(f"{name}_again{k}" for k in range(1, 10**6)
                         if not os.path.exists(os.path.join(storage, f"{name}_again{k}")))
            print(f"seeds {seeds_label([c.seed for c in missing])} have no result: training "
                  f"them in the Tune experiment {again}", flush=True)
            fit(new_tuner(trainable, missing, storage, again, workers))
