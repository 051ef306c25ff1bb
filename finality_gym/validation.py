"""The graded validation of a policy in training: its mean gap on the validation set, played
through the runner the grader plays every episode through (`finality_gym.policy.play`), so the
number is the grade, not the training return.

The validation set is every `stride`-th independent unit of the `public` split (a twin pair with
both its halves: striding over tasks would keep one half of every pair) under fault seed
`VALIDATION_SEED` (100; the grading seeds are 0..4), in the probe arm the policy trains in. With
the default stride 2: 161 episodes. `python -m train` validates with it, and so do
`finality_gym.callbacks.ValidationCallback` (stable-baselines3) and `examples/masked_ppo.py`;
`eval`'s grader gives the same gaps for the same cases (`tests/training/test_validation.py`).
"""

from __future__ import annotations

import numpy as np

from .corpus import load_corpus
from .episode import PROBE_ARMS
from .policy import Policy, play
from .tasks import Task

VALIDATION_SEED = 100
METRICS = ("mean_gap", "exact_rate", "premature_rate")  # what `validate` reports, as logged


def validation_tasks(stride: int = 2) -> tuple[Task, ...]:
    """Every `stride`-th independent unit of `public`, both halves of a pair together."""
    if type(stride) is not int or stride < 1:
        raise ValueError(f"stride: must be an int >= 1; got {stride!r}")
    units = load_corpus("public").units[::stride]
    return tuple(task for unit in units for task in unit)


def validate(policy: Policy, probe: str = "full", stride: int = 2) -> dict:
    """Play `policy` on the validation set in arm `probe`: `mean_gap` in dollars, `exact_rate`
    (gap 0), `premature_rate` (an irreversible act before the outcome was known, docs/world.md
    section 8) and `episodes`."""
    if probe not in PROBE_ARMS:
        raise ValueError(f"probe: unknown arm {probe!r}; valid: {', '.join(PROBE_ARMS)}")
    records = [play(policy, task, VALIDATION_SEED, probe=probe).record()
               for task in validation_tasks(stride)]
    gaps = np.array([r.gap for r in records]) / 100
    return {"mean_gap": float(gaps.mean()),
            "exact_rate": float(np.mean([r.gap == 0 for r in records])),
            "premature_rate": float(np.mean([r.premature for r in records])),
            "episodes": len(records)}
