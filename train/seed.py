"""One seed of a sweep: its whole `train ppo` run in its own folder, whichever backend runs it
(a local worker process or a Ray Tune trial: `train/sweep.py` passes `train_seed` to both)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eval.grading.runfolder import lock, prepare

from .config import TrainConfig
from .run import latest_checkpoint, train


def train_seed(config: TrainConfig, report=None, grade: bool = True, name: str = "") -> dict:
    """One seed's whole run, resuming whatever an interrupted sweep left of it; its result.
    `report` and `grade` are `train`'s (the Ray backend reports to Tune through `report`; the
    algorithm search's runs are not graded); `name` starts its progress lines (default
    "seed 3")."""
    out = Path(config.out)
    prepare(out)
    # A second process on the same seed (a killed sweep's orphaned worker still training, a
    # sweep started twice) is refused rather than trained over.
    with lock(out):
        done = out / "result.json"
        if done.exists():
            return json.loads(done.read_text())
        resume = latest_checkpoint(out) is not None
        if not resume:  # started, but killed before its first checkpoint: start again
            for path in out.iterdir():
                if path.name != ".lock":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        return train(config, resume=resume, grading_workers=1,
                     label=f"{name or f'seed {config.seed}'}: ", report=report, grade=grade)


def done_line(name: str, best_mean_gap: float, best_timesteps: int) -> str:
    """What the sweep prints when a seed (`name`: "seed 3") is done, whichever backend trained
    it."""
    return (f"{name}: done, best validation gap ${best_mean_gap:.2f} at "
            f"{best_timesteps:,} steps")
